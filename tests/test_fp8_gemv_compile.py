"""CPU checks of the fp8_gemv kernel: it compiles for sm_90a without a GPU, and its SASS has
the shape kernel.py's docstring promises (no spills, FP8 mma, 16-byte weight loads issued
before griddepcontrol.wait, pointer parameters matching the launcher's list).

Every kernel of GLM-5 at TP 1/2/4/8 x tokens 1..8 (gate_up and down, 64 kernels, about
0.5 s each here) is compiled in the default run, and every other preset's dense and
shared-expert shard (DeepSeek-V3, GLM-4.5, Qwen3; TP 1/2/4/8) at tokens 1, 4 and 8.
MLPJIT_TEST_FAST=1 keeps a representative subset (TP 8 and TP 1, tokens 1 and 8);
MLPJIT_TEST_FULL=1 checks the other presets' shards at every token count 1..8 too (about
400 kernels, several minutes here).
"""

from __future__ import annotations

import functools
import math
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("cutlass")

from mlpjit import layer_plan, models  # noqa: E402
from mlpjit.kernels import hopper  # noqa: E402
from mlpjit.kernels.fp8_gemv import SPEC, tuning  # noqa: E402
from mlpjit.kernels.fp8_gemv import params as gemv_params  # noqa: E402
from mlpjit.kernels.fp8_gemv import plan as fp8_plan  # noqa: E402
from mlpjit.testing.cubin_info import param_mismatches, sass_facts  # noqa: E402

ARCH = "sm_90a"
MAX_REGS = 255
_DEPBAR = re.compile(r"DEPBAR\.LE SB0, 0x([0-9a-f]+)")


def _glm5_requests() -> list:
    hidden, inter = models.MODELS["glm5"]
    fast = os.environ.get("MLPJIT_TEST_FAST") == "1"
    tps = (8, 1) if fast else (1, 2, 4, 8)
    tokens = (1, 8) if fast else range(1, 9)
    requests = []
    for tp in tps:
        requests += layer_plan.dense_mlp_requests(hidden, inter, tp, list(tokens), ARCH, ue8m0=True)
    return requests


def _preset_requests() -> list:
    """The dense and shared-expert shards of every preset but GLM-5, TP 1/2/4/8."""
    fast = os.environ.get("MLPJIT_TEST_FAST") == "1"
    full = os.environ.get("MLPJIT_TEST_FULL") == "1"
    tokens = list(range(1, 9)) if full else [1, 8] if fast else [1, 4, 8]
    seen, requests = set(), []
    for name, preset in models.PRESETS.items():
        if name == "glm5":
            continue
        for inter in preset.layers().values():
            for tp in (1, 8) if fast else (1, 2, 4, 8):
                if inter % (128 * tp):
                    continue
                for r in layer_plan.dense_mlp_requests(preset.hidden, inter, tp, tokens, ARCH):
                    if r.kernel == SPEC.name and _freeze(r.params) not in seen:
                        seen.add(_freeze(r.params))
                        requests.append(r)
    return requests


def _case_id(request) -> str:
    p = request.params
    kind = "gate_up" if p["swiglu"] else "down"
    return f"{kind}-{p['rows']}x{p['k']}-t{p['tokens']}"


def _freeze(params) -> tuple:
    return tuple(sorted(params.items()))


@functools.cache
def _compiled(frozen: tuple):
    from mlpjit.kernels.fp8_gemv.kernel import compile_cubin

    return compile_cubin(SPEC.make_params(dict(frozen)), ARCH)


@functools.cache
def _facts(frozen: tuple) -> dict:
    """Resource usage and SASS opcode sequence of one compiled kernel (cuobjdump)."""
    f = sass_facts(_compiled(frozen).cubin)
    return {
        "regs": f.regs,
        "stack": f.stack,
        "static_smem": f.static_smem,
        "local": f.local,
        "ops": list(f.ops),
        "sass": f.sass,
        "count": Counter(f.ops),
    }


REQUESTS = _glm5_requests()
PRESET_REQUESTS = _preset_requests()


@pytest.mark.parametrize("request_", REQUESTS, ids=[_case_id(r) for r in REQUESTS])
def test_glm5_kernel_sass(request_) -> None:
    check_kernel_sass(request_.params)


@pytest.mark.parametrize("request_", PRESET_REQUESTS, ids=[_case_id(r) for r in PRESET_REQUESTS])
def test_preset_kernel_sass(request_) -> None:
    check_kernel_sass(request_.params)


def check_kernel_sass(p: dict) -> None:
    """The promises of kernel.py's docstring, in one compiled kernel's SASS and launch."""
    params = SPEC.make_params(p)
    frozen = _freeze(p)
    binary = _compiled(frozen)
    facts = _facts(frozen)
    count = facts["count"]
    spw = p.get("slices_per_warp", 1)  # 512-K slices per warp

    # Resources: no spills, no local memory, within sm_90 limits.
    assert facts["stack"] == 0 and facts["local"] == 0, facts
    assert not any(op.startswith(("LDL", "STL")) for op in facts["ops"])
    assert facts["regs"] <= MAX_REGS
    threads = binary.block[0]
    assert facts["regs"] * threads * p["ctas_per_sm"] <= hopper.REGS_PER_SM
    slice_k, splits = params.slice_k, params.splits
    assert binary.smem_bytes == gemv_params.smem_bytes(
        p["k"], p["tokens"], p["tiles"], p["in_regs"], spw, slice_k=slice_k, splits=splits,
        send_x=p.get("send_x", False), paced=bool(p.get("paced", 0)),
    )  # fmt: skip
    assert binary.smem_bytes + facts["static_smem"] <= hopper.SMEM_PER_CTA_MAX
    assert binary.smem_bytes <= hopper.smem_budget(p["ctas_per_sm"])

    # Launch geometry: one CTA per (16*tiles rows, K split), or a persistent grid of one
    # resident wave (gemv_params.grid_ctas); 32 threads per (tile, spw slices).
    units = p["rows"] // (16 * p["tiles"]) * splits
    grid = gemv_params.grid_ctas(
        p["rows"], p["k"], p["tiles"], p["in_regs"], p["ctas_per_sm"], spw,
        slice_k=slice_k, splits=splits,
    )  # fmt: skip
    assert binary.grid == (grid, 1, 1)
    slots = hopper.resident_ctas(hopper.SMS * p["ctas_per_sm"], max(splits, p.get("cluster", 1)))
    assert grid == units or slots - splits < grid <= slots < units
    persistent = grid < units
    assert binary.block == (32 * p["tiles"] * p["k"] // splits // slice_k // spw, 1, 1)
    assert binary.pdl is True

    # FP8 mma: slice_k/32 m16n8k32 e4m3 mmas per slice, each 2 HMMA.16816.F32 + FP8->FP16
    # unpacks.
    mmas = slice_k // 16 * spw
    assert count["HMMA.16816.F32"] == mmas
    assert count["F2FP.F16.E4M3.UNPACK_B"] >= mmas
    # Activation quantization packs with the satfinite e4m3 convert.
    assert any(op.startswith("F2FP.SATFINITE.E4M3") for op in count)

    # Weights: 16-byte evict-first loads into registers, 16-byte cp.async for the rest; a
    # persistent kernel has a second copy of both in its tile loop (the next tile's refill).
    # ptxas adds an L2 128-byte prefetch hint (LTC128B) to the cp.async in the loop form.
    in_regs = p["in_regs"]
    copies = 2 if persistent else 1
    ops = facts["ops"]
    cp_async = [i for i, op in enumerate(ops) if op.startswith("LDGSTS.E.BYPASS.")]
    assert all(ops[i] in ("LDGSTS.E.BYPASS.128", "LDGSTS.E.BYPASS.LTC128B.128") for i in cp_async)
    staged = params.steps - in_regs
    assert count["LDG.E.NA.128.CONSTANT"] == 2 * in_regs * copies * spw
    # A paced kernel's steps past its first `paced` have three copies: the first warp's, the
    # pacing loop's (both before the wait) and the predicated one after x's loads.
    paced = p.get("paced", 0)
    rest = staged * spw - paced
    # A persistent kernel's tile loop refills every staged step for the next tile.
    first_tile = 2 * paced + 6 * rest if paced else 2 * staged * spw
    assert len(cp_async) == first_tile + 2 * staged * spw * (copies - 1)
    # PDL: the first tile's cp.async share is issued before the dependency wait (ACQBULK),
    # but for its late steps (after x's loads).
    assert ops.count("ACQBULK") == 1
    wait = ops.index("ACQBULK")
    late = p.get("late_steps", 0)
    before = 2 * paced + 4 * rest if paced else 2 * (staged - late) * spw
    assert sum(i < wait for i in cp_async) == before
    # The PDL trigger (PREEXIT): after the wait, or with early_launch before any weight load.
    assert ops.count("PREEXIT") == 1
    trigger = ops.index("PREEXIT")
    if p.get("early_launch"):
        first_load = min(i for i, op in enumerate(ops) if op.startswith(("LDGSTS", "LDG.E.NA")))
        assert trigger < first_load
    else:
        assert trigger > wait
    # x is read (16-byte loads) only after the wait.
    assert all(i > wait for i, op in enumerate(ops) if op == "LDG.E.128")
    assert count["LDG.E.128"] >= 2

    # Clusters: the launch carries the shape; the CTAs meet at entry and after x's shared
    # quantization (cluster barrier arrive/wait pairs), and write it with DSMEM stores.
    # K splits: they meet at entry; a persistent kernel's splits meet again where the
    # partials meet and after each tile's sum (its slots are free again); otherwise the
    # partials go to the first CTA with st.async (STAS), counted on its mbarrier, without
    # a cluster barrier's release fence (MEMBAR.ALL.GPU).
    # send_x: they meet at entry only; x goes out by st.async, counted on mbarriers.
    cluster = p.get("cluster", 1)
    assert binary.cluster == (max(cluster, splits), 1, 1) and grid % max(cluster, splits) == 0
    if cluster > 1 and p.get("send_x"):
        assert not persistent or cluster <= tuning.MAX_PERSISTENT_CLUSTER
        assert count["UCGABAR_ARV"] == 1 and count["UCGABAR_WAIT"] == 1
        assert ops.index("UCGABAR_ARV") < wait < ops.index("UCGABAR_WAIT")
        assert count["STAS.128"] > 0 and "ST.E.128" not in count
        assert "MEMBAR.ALL.GPU" not in count
    elif cluster > 1:
        assert not persistent or cluster <= tuning.MAX_PERSISTENT_CLUSTER
        assert count["UCGABAR_ARV"] == 2 and count["UCGABAR_WAIT"] == 2
        assert ops.index("UCGABAR_ARV") < wait
        assert count["ST.E.128"] > 0
    elif splits > 1:
        assert ops.index("UCGABAR_ARV") < wait < ops.index("UCGABAR_WAIT")
        assert count["BPT.TRAP"] == 1  # launched without the cluster shape: trap
        if persistent:
            assert count["UCGABAR_ARV"] == 3 and count["UCGABAR_WAIT"] == 2
            assert count["ST.E.128"] == 1  # the tile sum into the first CTA's slot
        else:
            assert count["UCGABAR_ARV"] == 1 and count["UCGABAR_WAIT"] == 1
            assert count["STAS.128"] == 1 and "ST.E.128" not in count
            assert count["SYNCS.PHASECHK.TRANS64.TRYWAIT"] >= 1
            assert "MEMBAR.ALL.GPU" not in count
    else:
        assert "UCGABAR_ARV" not in count and "ST.E.128" not in count


@pytest.mark.parametrize("request_", REQUESTS[-2:], ids=lambda r: _case_id(r))
def test_register_weight_loads_before_wait(request_) -> None:
    ops = _facts(_freeze(request_.params))["ops"]
    wait = ops.index("ACQBULK")
    loads = [i for i, op in enumerate(ops) if op == "LDG.E.NA.128.CONSTANT"]
    # The first tile's (a persistent kernel's tile loop has a second set, after the wait).
    first = 2 * request_.params["in_regs"]
    assert first > 0 and len(loads) >= first
    assert all(i < wait for i in loads[:first])


@pytest.mark.parametrize("request_", REQUESTS[:2] + REQUESTS[-2:], ids=lambda r: _case_id(r))
def test_params_match_cubin(request_) -> None:
    binary = _compiled(_freeze(request_.params))
    assert [q.name for q in binary.params] == ["out", "x", "w", "w_scale"]
    assert all(q.kind == "ptr" for q in binary.params)
    assert param_mismatches(binary) == []


def _variant(**changes) -> dict:
    base = dict(
        rows=3072, k=6144, tokens=4, tiles=1, in_regs=3, ctas_per_sm=2, swiglu=True, limit=None
    )
    base["ue8m0"] = True
    base.update(changes)
    return base


@pytest.mark.parametrize(
    "changes",
    [
        {"ue8m0": False},
        {"limit": 7.0},
        {"swiglu": False, "ue8m0": False},
        {"rows": 6144, "k": 1536, "tiles": 2, "in_regs": 7, "swiglu": False, "tokens": 3},
        {"tiles": 2, "in_regs": 0, "ctas_per_sm": 1, "tokens": 1},
    ],
    ids=["ue8m0-off", "limit", "plain", "plain-all-regs", "all-staged"],
)
def test_variants_compile_clean(changes) -> None:
    frozen = _freeze(_variant(**changes))
    facts = _facts(frozen)
    assert facts["stack"] == 0 and facts["local"] == 0
    assert facts["count"]["HMMA.16816.F32"] == 32


@pytest.mark.parametrize(
    ("changes", "persistent"),
    [
        ({"rows": 6144, "k": 12288, "tokens": 1, "in_regs": 1, "ctas_per_sm": 1, "swiglu": False,
          "slices_per_warp": 3}, True),
        ({"rows": 24576, "tokens": 2, "in_regs": 2, "ctas_per_sm": 1, "slices_per_warp": 2}, True),
        ({"rows": 24576, "tokens": 2, "tiles": 2, "in_regs": 0, "ctas_per_sm": 1,
          "slices_per_warp": 3}, True),
        ({"tokens": 1, "slices_per_warp": 2}, False),
        ({"tokens": 3, "slices_per_warp": 3, "early_launch": True}, False),
        ({"rows": 6144, "k": 1536, "tiles": 2, "in_regs": 8, "swiglu": False, "tokens": 2,
          "slices_per_warp": 3}, False),
    ],
    ids=["tp1-down-s3-persistent", "tp1-gate_up-s2-persistent", "tp1-gate_up-t2-s3-persistent",
         "tp8-gate_up-s2", "tp8-gate_up-s3-early", "all-regs-s3"],
)  # fmt: skip
def test_wide_warps_compile_clean(changes, persistent) -> None:
    """slices_per_warp > 1: a warp runs the mma work of several 512-K slices, so there are
    fewer threads per tile; geometry and shared memory follow plan's formulas."""
    p = _variant(**changes)
    frozen = _freeze(p)
    binary = _compiled(frozen)
    facts = _facts(frozen)
    spw = p["slices_per_warp"]
    assert facts["stack"] == 0 and facts["local"] == 0, facts
    assert facts["count"]["HMMA.16816.F32"] == 32 * spw
    assert (binary.grid[0] < p["rows"] // (16 * p["tiles"])) == persistent
    # cp.async waits: groups commit in (slice, step) order, one per staged step. Without a
    # row-tile loop the waits count down from N-1 to 0 (N = spw * staged); the persistent
    # loop keeps N groups in flight (a refill per consumed slot), so every wait is N-1.
    n = spw * (gemv_params.STEPS - p["in_regs"])
    waits = [int(m, 16) for m in _DEPBAR.findall(facts["sass"])]
    assert waits == ([n - 1] * n if persistent else list(range(n - 1, -1, -1))), waits
    if p.get("early_launch"):  # the PDL trigger before any weight load
        ops = facts["ops"]
        first_load = min(i for i, op in enumerate(ops) if op.startswith(("LDGSTS", "LDG.E.NA")))
        assert ops.index("PREEXIT") < first_load
    assert binary.block == (32 * p["tiles"] * p["k"] // 512 // spw, 1, 1)
    assert binary.smem_bytes == gemv_params.smem_bytes(
        p["k"], p["tokens"], p["tiles"], p["in_regs"], spw
    )
    grid = gemv_params.grid_ctas(p["rows"], p["k"], p["tiles"], p["in_regs"], p["ctas_per_sm"], spw)
    assert binary.grid == (grid, 1, 1)
    assert facts["regs"] * binary.block[0] * p["ctas_per_sm"] <= hopper.REGS_PER_SM


TRACE_VARIANTS = {
    "one-tile": {},
    "persistent-s2": {"rows": 24576, "tokens": 2, "in_regs": 2, "ctas_per_sm": 1,
                      "slices_per_warp": 2},
    "splits-7": {"rows": 1024, "k": 7168, "tokens": 1, "tiles": 2, "slice_k": 256, "splits": 7},
    "persistent-n2": {"tokens": 8, "ctas_per_sm": 1, "cluster": 2},
}  # fmt: skip


@pytest.mark.parametrize("changes", TRACE_VARIANTS.values(), ids=TRACE_VARIANTS)
def test_trace_builds_stamp_every_point_without_spills(changes) -> None:
    """A trace build reads %globaltimer at each of TRACE_NAMES' points and stores those
    stamps and the SM id (one 64-bit store each); the build without it has neither, and the
    stamps cost no spill."""
    plain = _freeze(_variant(**changes))
    traced = _freeze(_variant(**changes, trace=True))
    counts = [_facts(f)["count"] for f in (plain, traced)]
    assert counts[0]["CS2R"] == 0 and counts[0]["STG.E.64"] == 0
    assert counts[1]["CS2R"] == len(gemv_params.TRACE_NAMES)
    assert counts[1]["STG.E.64"] == gemv_params.TRACE_POINTS
    facts = _facts(traced)
    assert facts["stack"] == 0 and facts["local"] == 0
    assert facts["regs"] <= _facts(plain)["regs"] + 8


LATE_VARIANTS = {
    "one-tile-l2": {"tokens": 1, "late_steps": 2},
    "all-staged-late": {"tokens": 3, "late_steps": 5},
    "down-slice128-l1": {"rows": 6144, "k": 1536, "in_regs": 1, "swiglu": False, "tokens": 1,
                         "slice_k": 128},
    "persistent-cluster-l2": {"tokens": 8, "ctas_per_sm": 1, "cluster": 2, "send_x": True,
                              "late_steps": 2},
}  # fmt: skip


@pytest.mark.parametrize("changes", LATE_VARIANTS.values(), ids=LATE_VARIANTS)
def test_late_steps_follow_the_x_loads(changes) -> None:
    """late_steps moves that many staged steps' cp.async (two LDGSTS each) from before the
    PDL wait to after x's loads, without spills; the rest stays before the wait."""
    changes = {"late_steps": 1, **changes}
    late = changes["late_steps"]
    staged = gemv_params.GemvParams(**_variant(**changes)).staged
    facts = _facts(_freeze(_variant(**changes)))
    assert facts["stack"] == 0 and facts["local"] == 0
    ops = facts["ops"]
    wait = ops.index("ACQBULK")
    copies = [i for i, op in enumerate(ops) if op.startswith("LDGSTS")]
    assert len([i for i in copies if i < wait]) == 2 * (staged - late)
    x_loads = [i for i, op in enumerate(ops) if i > wait and op == "LDG.E.128"]
    assert x_loads and x_loads[0] < min(i for i in copies if i > wait)


PACED_VARIANTS = {
    "t1-p1": {"tokens": 1, "paced": 1},
    "all-staged-p2": {"tokens": 2, "in_regs": 0, "paced": 2},
    "cluster-send-p1": {"tokens": 8, "cluster": 2, "send_x": True, "paced": 1},
    "down-slice128-p1": {"rows": 6144, "k": 1536, "in_regs": 0, "swiglu": False, "tokens": 1,
                         "slice_k": 128, "paced": 1},
    "persistent-p1": {"tokens": 2, "ctas_per_sm": 1, "paced": 1},
    "persistent-cluster-send-p1": {"tokens": 6, "ctas_per_sm": 1, "cluster": 2, "send_x": True,
                                   "paced": 1},
    "down-3-slices-p1": {"rows": 6144, "k": 1536, "tiles": 4, "in_regs": 1, "swiglu": False,
                         "tokens": 2, "slices_per_warp": 3, "paced": 1},
    "persistent-3-slices-p2": {"rows": 24576, "tokens": 2, "in_regs": 0, "slices_per_warp": 3,
                               "paced": 2},
}  # fmt: skip


@pytest.mark.parametrize("changes", PACED_VARIANTS.values(), ids=PACED_VARIANTS)
def test_paced_steps_before_the_wait_and_the_rest_after_x(changes) -> None:
    """Before the PDL wait: every warp's first ``paced`` steps, warp 0's others and the
    pacing loop's copies (two LDGSTS each); after it, x's loads, then the rest, predicated
    (one group per step), and in a persistent grid the next tiles' refills; no spills."""
    p = gemv_params.GemvParams(**_variant(**changes))
    rest = p.spw * p.staged - p.paced
    facts = _facts(_freeze(_variant(**changes)))
    assert facts["stack"] == 0 and facts["local"] == 0
    ops = facts["ops"]
    wait = ops.index("ACQBULK")
    copies = [i for i, op in enumerate(ops) if op.startswith("LDGSTS")]
    assert len([i for i in copies if i < wait]) == 2 * p.paced + 4 * rest
    after = [i for i in copies if i > wait]
    assert len(after) == 2 * rest + (2 * p.spw * p.staged if p.persistent else 0)
    late = after[: 2 * rest]
    x_loads = [i for i, op in enumerate(ops) if i > wait and op == "LDG.E.128"]
    assert x_loads and x_loads[0] < late[0]
    # The late copies are not behind a branch (which ptxas puts after x's data).
    assert "BRA" not in ops[x_loads[0] : late[-1]]


# Clustered variants of _variant: persistent and not, chunk counts the cluster does not divide.
CLUSTER_VARIANTS = {
    "persistent-n2": {"tokens": 8, "ctas_per_sm": 1, "cluster": 2},
    "persistent-n4": {"tokens": 8, "ctas_per_sm": 1, "cluster": 4},
    "t1-n8": {"tokens": 1, "cluster": 8},
    "down-3-chunks-per-2": {"rows": 6144, "k": 1536, "tiles": 4, "in_regs": 1, "swiglu": False,
                            "tokens": 3, "slices_per_warp": 3, "cluster": 2},
    "tp1-down-n2": {"rows": 6144, "k": 12288, "tokens": 7, "in_regs": 3, "ctas_per_sm": 1,
                    "swiglu": False, "slices_per_warp": 3, "cluster": 2},
}  # fmt: skip


@pytest.mark.parametrize("changes", CLUSTER_VARIANTS.values(), ids=CLUSTER_VARIANTS)
def test_clusters_compile_clean(changes) -> None:
    """Each CTA quantizes every cluster-th (token, 512-K) chunk of x and stores it into all
    of the cluster's CTAs: cluster DSMEM stores (ST.E.128, which the plain kernel has none
    of), no spills; grid and shared memory as without the cluster."""
    p = _variant(**changes)
    binary = _compiled(_freeze(p))
    facts = _facts(_freeze(p))
    plain = _compiled(_freeze({**p, "cluster": 1}))
    n = p["cluster"]
    assert facts["stack"] == 0 and facts["local"] == 0, facts
    assert binary.cluster == (n, 1, 1)
    assert (binary.grid, binary.block, binary.smem_bytes) == (
        plain.grid,
        plain.block,
        plain.smem_bytes,
    )
    # Per warp: ceil(chunks / cluster / warps) chunks, each stored to every CTA of the cluster.
    warps = binary.block[0] // 32
    chunks = p["tokens"] * p["k"] // 512
    per_warp = math.ceil(math.ceil(chunks / n) / warps)
    assert facts["count"]["ST.E.128"] == n * per_warp
    assert "ST.E.128" not in _facts(_freeze({**p, "cluster": 1}))["count"]
    # a launch without the cluster attribute traps instead of running every CTA as rank 0
    assert facts["count"]["BPT.TRAP"] == 1
    assert "BPT.TRAP" not in _facts(_freeze({**p, "cluster": 1}))["count"]
    ops = facts["ops"]
    assert ops.index("UCGABAR_ARV") < ops.index("ACQBULK") < ops.index("UCGABAR_WAIT")


SEND_X_VARIANTS = ("persistent-n2", "t1-n8", "down-3-chunks-per-2", "tp1-down-n2")


@pytest.mark.parametrize(
    "changes", [CLUSTER_VARIANTS[n] for n in SEND_X_VARIANTS], ids=SEND_X_VARIANTS
)
def test_send_x_compiles_clean(changes) -> None:
    """send_x: each CTA stores its own chunks of x and sends them to the cluster's other
    CTAs with st.async (STAS.128, counted on their mbarriers), so the only cluster barrier
    is the entry one and no release fence (MEMBAR.ALL.GPU) is left; no spills; no weight
    load later than without it; grid as without it, shared memory plus the mbarrier."""
    p = {**_variant(**changes), "send_x": True}
    barrier = {**p, "send_x": False}
    binary, facts = _compiled(_freeze(p)), _facts(_freeze(p))
    before = _compiled(_freeze(barrier))
    assert facts["stack"] == 0 and facts["local"] == 0, facts
    assert (binary.cluster, binary.grid, binary.block) == (
        before.cluster, before.grid, before.block
    )  # fmt: skip
    assert binary.smem_bytes == -(-before.smem_bytes // 16) * 16 + gemv_params.MBARRIER_BYTES
    n = p["cluster"]
    warps = binary.block[0] // 32
    chunks = p["tokens"] * p["k"] // 512
    per_warp = math.ceil(math.ceil(chunks / n) / warps)
    count, ops = facts["count"], facts["ops"]
    assert count["STAS.128"] == (n - 1) * per_warp and "ST.E.128" not in count
    assert "MEMBAR.ALL.GPU" not in count and "MEMBAR.ALL.GPU" in _facts(_freeze(barrier))["count"]
    assert count["UCGABAR_ARV"] == 1 and count["UCGABAR_WAIT"] == 1
    assert ops.index("UCGABAR_ARV") < ops.index("ACQBULK") < ops.index("UCGABAR_WAIT")
    assert count["SYNCS.PHASECHK.TRANS64.TRYWAIT"] >= 1

    def loads_before_wait(ops: list) -> int:
        wait = ops.index("ACQBULK")
        return sum(op.startswith(("LDG.E.NA", "LDGSTS")) for op in ops[:wait])

    assert loads_before_wait(ops) >= loads_before_wait(_facts(_freeze(barrier))["ops"])


@pytest.mark.parametrize(
    ("rows", "k", "tokens", "swiglu"),
    [(7168, 9216, 8, False), (9216, 7168, 6, True), (4096, 7168, 8, False)],
    ids=["dsv3-tp2-down-t8", "dsv3-tp4-gate_up-t6", "k7168-down-t8"],
)
def test_untuned_cluster_defaults_compile_clean(rows, k, tokens, swiglu) -> None:
    """From 5 tokens on, plan's heuristic picks run in clusters of 2; they must not spill,
    including a 14-warp CTA whose launch bound leaves 128 registers (hopper.reg_budget)."""
    assert (rows, k, swiglu) not in tuning.TUNED_H200
    request = fp8_plan.gemv_request(
        rows, k, tokens, swiglu=swiglu, limit=None, ue8m0=True, arch=ARCH
    )
    assert request.params["cluster"] == 2
    binary = _compiled(_freeze(request.params))
    facts = _facts(_freeze(request.params))
    assert facts["stack"] == 0 and facts["local"] == 0, facts
    threads, cps = binary.block[0], request.params["ctas_per_sm"]
    assert facts["regs"] <= hopper.reg_budget(threads, cps)


@pytest.mark.parametrize(
    ("rows", "k", "tokens", "swiglu"),
    [(24576, 5120, 1, True), (5120, 12288, 4, False), (5120, 6144, 8, False)],
    ids=["glm4.5-tp1-gate_up-t1", "glm4.5-tp1-down-t4", "glm4.5-tp2-down-t8"],
)
def test_untuned_wide_defaults_compile_clean(rows, k, tokens, swiglu) -> None:
    """plan's wide persistent heuristic (GLM-4.5 at TP1/TP2 has no measured entry at these
    token counts) must not spill: its register estimate is what keeps it from doing so."""
    assert tuning.tuned(rows, k, tokens, swiglu, hopper.SMS) is None
    request = fp8_plan.gemv_request(
        rows, k, tokens, swiglu=swiglu, limit=None, ue8m0=True, arch=ARCH
    )
    assert request.params["slices_per_warp"] > 1
    facts = _facts(_freeze(request.params))
    assert facts["stack"] == 0 and facts["local"] == 0, facts


def test_sms_sizes_the_persistent_grid() -> None:
    """A kernel planned for 78 SMs (H20) launches 78 * ctas_per_sm CTAs over the same row
    tiles; 132 (the default) is the H200's grid."""
    p = _variant(rows=24576, tokens=2, in_regs=0, ctas_per_sm=1, slices_per_warp=3)
    h200 = _compiled(_freeze(p))
    h20 = _compiled(_freeze({**p, "sms": 78}))
    assert h200.grid == (hopper.SMS, 1, 1) and h20.grid == (78, 1, 1)
    assert (h20.block, h20.smem_bytes) == (h200.block, h200.smem_bytes)
    assert _facts(_freeze({**p, "sms": 78}))["stack"] == 0
    assert _compiled(_freeze({**p, "sms": 132})).cubin == h200.cubin


def test_variants_change_code() -> None:
    """ue8m0 and limit are in the key because they change the code."""
    base = _compiled(_freeze(_variant())).cubin
    assert _compiled(_freeze(_variant(ue8m0=False))).cubin != base
    assert _compiled(_freeze(_variant(limit=7.0))).cubin != base
    # Without ue8m0 x is divided by the scale (a reciprocal per group); with it, multiplied.
    assert (
        _facts(_freeze(_variant(ue8m0=False)))["count"]["MUFU.RCP"]
        > (_facts(_freeze(_variant()))["count"]["MUFU.RCP"])
    )


def test_deterministic_across_processes() -> None:
    params = _variant(tokens=2)
    here = _compiled(_freeze(params)).cubin
    code = (
        "import sys, hashlib\n"
        "from mlpjit.kernels.fp8_gemv import SPEC\n"
        "from mlpjit.kernels.fp8_gemv.kernel import compile_cubin\n"
        f"b = compile_cubin(SPEC.make_params({params!r}), {ARCH!r})\n"
        "sys.stdout.write(hashlib.sha256(b.cubin).hexdigest() + ' ' + b.symbol)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import hashlib

    digest, symbol = run.stdout.split()
    assert digest == hashlib.sha256(here).hexdigest()
    assert symbol == _compiled(_freeze(params)).symbol


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"k": 1000}, "k must be"),
        ({"tokens": 9}, "tokens must be"),
        ({"rows": 3080}, "rows must be"),
        ({"in_regs": 9}, "in_regs must be"),
        ({"tiles": 3}, "warps exceeds"),
        ({"in_regs": 0}, "shared memory"),
        ({"limit": -1.0}, "limit must be"),
        ({"swiglu": 1}, "swiglu must be"),
        ({"slices_per_warp": 5}, "slices_per_warp must divide"),
        ({"slices_per_warp": 0}, "slices_per_warp must be"),
        ({"cluster": 3}, "cluster must be one of"),
        ({"cluster": True}, "cluster must be one of"),
        ({"rows": 144, "cluster": 2}, "cluster must divide the grid of 9 CTAs"),
        ({"sms": 0}, "sms must be an int"),
        ({"cluster": 2.0}, "cluster must be one of"),
        ({"slice_k": 384}, "slice_k must be one of"),
        ({"slice_k": 256, "in_regs": 5}, "in_regs must be"),  # 4 steps per 256-K slice
        ({"slice_k": 256, "cluster": 2}, "cluster must be 1 with slice_k=256"),
        ({"splits": 9}, "splits must be"),
        ({"splits": 5}, r"k must be a multiple of splits \* slice_k = 2560"),
        ({"splits": 2, "cluster": 2}, "cluster must be 1 with splits > 1"),
        ({"send_x": True}, "send_x needs cluster > 1"),
        ({"send_x": 1, "cluster": 2}, "send_x must be a bool"),
        ({"late_steps": 6}, r"late_steps must be in \[0, 5\]"),  # in_regs 3: 5 staged
        ({"late_steps": 2, "slices_per_warp": 2}, "late_steps needs slices_per_warp=1"),
        ({"paced": 5}, r"paced must be in \[0, 4\]"),  # in_regs 3: 5 staged, one left late
        ({"paced": True}, "paced must be an int"),
        ({"paced": 1, "late_steps": 1}, "paced needs"),
        ({"paced": 10, "slices_per_warp": 2}, r"paced must be in \[0, 9\]"),  # 2 x 5 staged
    ],
)
def test_bad_params(changes, match) -> None:
    with pytest.raises(ValueError, match=match):
        SPEC.make_params(_variant(**changes))


def test_bad_param_names_and_arch() -> None:
    from mlpjit.jit.manager import check_compile_arch

    with pytest.raises(ValueError, match="'bogus' is not a parameter of kernel 'fp8_gemv'"):
        SPEC.make_params({**_variant(), "bogus": 1})
    with pytest.raises(ValueError, match="early_launch must be a bool"):
        SPEC.make_params({**_variant(), "early_launch": 1})
    assert SPEC.make_params({**_variant(), "early_launch": True}).early_launch
    assert not SPEC.make_params(_variant()).early_launch
    with pytest.raises(ValueError, match="missing"):
        SPEC.make_params({k: v for k, v in _variant().items() if k != "ue8m0"})
    with pytest.raises(ValueError, match="compiles for sm_90a, not 'hopper'"):
        check_compile_arch(SPEC, "hopper")


def test_dense_mlp_fills_the_kernel_parameters_in_order() -> None:
    """DenseMlp launches with raw pointers in this order, without per-call checks."""
    from mlpjit import dense_mlp

    assert [(name, "ptr") for name in gemv_params.KERNEL_ARGS] == dense_mlp._KERNEL_PARAMS
