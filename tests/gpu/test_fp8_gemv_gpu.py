"""One fp8_gemv launch on the GPU against mlpjit.reference.gemv_reference.

Run on the H200 with a cache compiled on a CPU machine (README: running the GPU tests and
benchmarks on an H200; scripts/gpu_requests.py lists this file's kernel_requests()):
    MLPJIT_CACHE_DIR=.gpu-cache python3 -m pytest -q -s tests/gpu/test_fp8_gemv_gpu.py
``-s`` prints one line per case with the relative L2 error. Outputs are poisoned with NaN
before each launch, so "no NaN" also means every element was written.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mlpjit import layer_plan
from mlpjit import reference as ref
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv import params as gemv_params
from mlpjit.kernels.fp8_gemv import plan as fp8_plan
from mlpjit.kernels.fp8_gemv import tuning
from mlpjit.testing.layers import GEMV_SHAPES, block_scale, random_fp8_weight, rel_l2

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("exact_fp32_matmul"),
]

ARCH = "sm_90a"
TOL = 5e-3
LIMIT = 3.0  # clips: gate/up have a standard deviation near 2 with these inputs

# name -> (rows, k, swiglu): GLM-5 TP8 first, then wider and deeper shapes.
SHAPES = {
    name: GEMV_SHAPES[name]
    for name in (
        "glm5-tp8-gate_up",
        "glm5-tp8-down",
        "glm5-tp4-gate_up",
        "glm5-tp1-gate_up",
        "glm5-tp1-down",
        "glm4.5-tp8-gate_up",
        "glm4.5-tp1-gate_up",
        "glm4.5-tp2-down",
    )
}

CASES = (
    [(s, m, u, None) for s in ("glm5-tp8-gate_up", "glm5-tp8-down")
     for m in (1, 8, 3) for u in (True, False)]
    + [("glm5-tp8-gate_up", m, u, LIMIT) for m in (1, 8) for u in (True, False)]
    + [(s, m, True, None) for s in ("glm5-tp1-gate_up", "glm5-tp1-down", "glm4.5-tp8-gate_up")
       for m in (1, 8)]
)  # fmt: skip


# Several 512-K slices per warp (gemv_params.GemvConfig.slices_per_warp), persistent and not, with
# and without SwiGLU, token counts that leave tiles without a token, nothing staged.
WIDE_CASES = (
    ("glm5-tp1-down", 1, gemv_params.GemvConfig(1, 1, 1, slices_per_warp=3)),
    ("glm5-tp1-down", 8, gemv_params.GemvConfig(1, 3, 1, slices_per_warp=3)),
    ("glm5-tp1-down", 3, gemv_params.GemvConfig(1, 2, 1, slices_per_warp=4)),
    ("glm5-tp1-gate_up", 2, gemv_params.GemvConfig(1, 2, 1, slices_per_warp=2)),
    ("glm5-tp8-gate_up", 1, gemv_params.GemvConfig(1, 3, 2, slices_per_warp=2)),
    ("glm5-tp8-down", 5, gemv_params.GemvConfig(2, 2, 2, slices_per_warp=3)),
    ("glm5-tp8-down", 2, gemv_params.GemvConfig(2, 8, 2, slices_per_warp=3)),
    # persistent with two tiles per CTA
    ("glm5-tp1-gate_up", 2, gemv_params.GemvConfig(2, 0, 1, slices_per_warp=3)),
    # plan's heuristic picks for untuned shapes (k 5120: 10 slices, 5 warps per tile)
    ("glm4.5-tp1-gate_up", 3, None),
    ("glm4.5-tp2-down", 1, None),
    ("glm4.5-tp2-down", 8, None),  # from 5 tokens on in clusters of 2
)


# Thread block clusters sharing one quantization of x (gemv_params.GemvConfig.cluster): persistent
# and not, chunk counts the cluster does not divide (9 chunks over 2 CTAs, 3 over 4, 12 over
# 8), both scale rules, x written through DSMEM or sent by st.async (send_x). Each must equal
# the same config without a cluster bit for bit.
C = gemv_params.GemvConfig
CLUSTER_CASES = (
    ("glm5-tp1-down", 8, C(1, 3, 1, slices_per_warp=2, cluster=2), True),
    ("glm5-tp1-down", 8, C(1, 3, 1, slices_per_warp=2, cluster=4), True),
    ("glm5-tp8-gate_up", 8, C(1, 3, 1, cluster=4), True),
    ("glm5-tp8-gate_up", 4, C(1, 3, 1, cluster=2), False),
    ("glm5-tp8-gate_up", 1, C(1, 3, 2, cluster=8), True),
    ("glm5-tp8-down", 3, C(4, 1, 2, slices_per_warp=3, cluster=2), True),
    ("glm5-tp8-down", 1, C(4, 3, 2, cluster=4), True),
    ("glm5-tp1-down", 8, C(1, 3, 1, slices_per_warp=3, cluster=2, send_x=True), True),
    ("glm5-tp8-gate_up", 8, C(1, 3, 1, cluster=2, send_x=True), False),
    ("glm5-tp8-gate_up", 1, C(1, 3, 2, cluster=8, send_x=True), True),
    ("glm5-tp8-down", 3, C(4, 1, 2, slices_per_warp=3, cluster=2, send_x=True), True),
)


def _request(
    shape: str,
    m: int,
    ue8m0: bool,
    limit: float | None,
    arch: str = ARCH,
    config: gemv_params.GemvConfig | None = None,
    trace: bool = False,
):
    rows, k, swiglu = SHAPES[shape]
    return fp8_plan.gemv_request(
        rows,
        k,
        m,
        swiglu=swiglu,
        limit=limit,
        ue8m0=ue8m0,
        arch=arch,
        config=config,
        trace=trace,
    )


def kernel_requests(arch: str = ARCH) -> list:
    """Every compile request of these tests (for warming a cache on a machine without GPU)."""
    wide = [_request(s, m, True, None, arch, config) for s, m, config in WIDE_CASES]
    clustered = [
        _request(s, m, u, None, arch, c)
        for s, m, config, u in CLUSTER_CASES
        for c in (config, dataclasses.replace(config, cluster=1, send_x=False))
    ]
    fewer_sms = [
        fp8_plan.gemv_request(*SHAPES[s][:2], m, swiglu=SHAPES[s][2], limit=None, ue8m0=True,
                          arch=arch, config=c, sms=sms)
        for s, m, c in SMS_CASES
        for sms in (66, hopper.SMS)
    ]  # fmt: skip
    # (config None: plan's choice, which _request also makes)
    return (
        [_request(*case, arch=arch) for case in CASES]
        + wide
        + clustered
        + fewer_sms
        + chain_requests(arch)
        + cluster_chain_requests(arch)
        + [_request(s, m, True, None, arch, c, trace=t) for s, m, c in TRACE_CASES
           for t in (False, True)]
        + [_request(s, m, True, None, arch, c) for s, m, case in LATE_CASES
           for c in (case, dataclasses.replace(case, late_steps=0))]
        + [_request(s, m, True, None, arch, c) for s, m, case in PACED_CASES
           for c in (case, dataclasses.replace(case, paced=0))]
    )  # fmt: skip


def chain_requests(arch: str = ARCH) -> list:
    """The PDL chain test: GLM-5 TP8 gate_up then down, 4 tokens."""
    return layer_plan.dense_mlp_requests(6144, 12288, 8, [4], arch, ue8m0=True)


CHAIN_CLUSTERS = (C(1, 3, 1, cluster=4), C(4, 1, 2, slices_per_warp=3, cluster=2))


def cluster_chain_requests(arch: str = ARCH) -> list:
    """The PDL chain test with clusters: GLM-5 TP8, 8 tokens, gate_up in clusters of 4, down
    in clusters of 2."""
    gate_up, down = CHAIN_CLUSTERS
    return [
        fp8_plan.gemv_request(3072, 6144, 8, swiglu=True, limit=None, ue8m0=True, arch=arch,
                          config=gate_up),
        fp8_plan.gemv_request(6144, 1536, 8, swiglu=False, limit=None, ue8m0=True, arch=arch,
                          config=down),
    ]  # fmt: skip


def _weights(rows: int, k: int, seed: int, out_std: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Random FP8 weights whose GEMV output has a standard deviation near out_std."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return random_fp8_weight(rows, k, gen, scale=block_scale(k, out_std))


def _x(m: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device="cuda")
    x[:, 5::301] *= 16  # outlier channels: groups with very different scales
    x = torch.where(x == 0, torch.full_like(x, 0.25), x)
    return x.to(torch.bfloat16)


def _inputs(shape: str, m: int) -> tuple[bool, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(swiglu, w, w_scale, x, output columns) of one shape's case at m tokens."""
    rows, k, swiglu = SHAPES[shape]
    w, w_scale = _weights(rows, k, seed=rows + k, out_std=2.0)
    return swiglu, w, w_scale, _x(m, k, seed=m), rows // 2 if swiglu else rows


def _launch(request, out, x, w, w_scale) -> None:
    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager

    kernel = load_kernel(default_manager().get(request), out.device)
    kernel.launch([out, x, w, w_scale])


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{s}-t{m}-{'ue8m0' if u else 'f32'}-lim{lim}" for s, m, u, lim in CASES]
)
def test_gemv_matches_reference(case) -> None:
    shape, m, ue8m0, limit = case
    swiglu, w, w_scale, x, cols = _inputs(shape, m)
    out = torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
    _launch(_request(shape, m, ue8m0, limit), out, x, w, w_scale)
    torch.cuda.synchronize()
    want = ref.gemv_reference(x, w, w_scale, swiglu=swiglu, limit=limit, ue8m0=ue8m0)
    err = rel_l2(out, want)
    clipped = ""
    if swiglu and limit is not None:
        pre = ref.block_scaled_gemm(*ref.quantize_activation(x, ue8m0), w, w_scale)
        clipped = f" clipped={float((pre.abs() > limit).float().mean()):.3f}"
    print(f"\n[fp8_gemv] {shape} tokens={m} ue8m0={ue8m0} limit={limit} rel_l2={err:.3e}{clipped}")
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) or NaN outputs"
    assert torch.isfinite(out).all()
    assert err < TOL


@pytest.mark.parametrize(
    "case",
    WIDE_CASES,
    ids=[
        f"{s}-t{m}-"
        + (f"t{c.tiles}r{c.in_regs}c{c.ctas_per_sm}s{c.slices_per_warp}" if c else "plan")
        for s, m, c in WIDE_CASES
    ],
)
def test_wide_warps_match_reference(case) -> None:
    shape, m, config = case
    rows, k, swiglu = SHAPES[shape]
    if config is None:
        config = tuning.choose_config(rows, k, m, swiglu)
        assert config.slices_per_warp > 1, config
    _, w, w_scale, x, cols = _inputs(shape, m)
    out = torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
    _launch(_request(shape, m, True, None, config=config), out, x, w, w_scale)
    torch.cuda.synchronize()
    want = ref.gemv_reference(x, w, w_scale, swiglu=swiglu, ue8m0=True)
    err = rel_l2(out, want)
    print(f"\n[fp8_gemv wide] {shape} tokens={m} {config} rel_l2={err:.3e}")
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) or NaN outputs"
    assert err < TOL


@pytest.mark.parametrize(
    "case",
    CLUSTER_CASES,
    ids=[
        f"{s}-t{m}-t{c.tiles}r{c.in_regs}c{c.ctas_per_sm}s{c.slices_per_warp}n{c.cluster}"
        + ("-send-" if c.send_x else "-")
        + ("ue8m0" if u else "f32")
        for s, m, c, u in CLUSTER_CASES
    ],
)
def test_clusters_match_unclustered_bit_for_bit(case) -> None:
    shape, m, config, ue8m0 = case
    swiglu, w, w_scale, x, cols = _inputs(shape, m)
    outs = []
    for c in (config, dataclasses.replace(config, cluster=1, send_x=False)):
        out = torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
        _launch(_request(shape, m, ue8m0, None, config=c), out, x, w, w_scale)
        outs.append(out)
    torch.cuda.synchronize()
    want = ref.gemv_reference(x, w, w_scale, swiglu=swiglu, ue8m0=ue8m0)
    err = rel_l2(outs[0], want)
    same = torch.equal(outs[0], outs[1])
    print(f"\n[fp8_gemv cluster] {shape} tokens={m} {config} rel_l2={err:.3e} identical={same}")
    assert not torch.isnan(outs[0]).any(), "unwritten (NaN-poisoned) or NaN outputs"
    assert same, "a cluster must not change a single output bit"
    assert err < TOL


# Trace builds (GemvParams.trace): one CTA per tile, persistent, K splits, a cluster.
TRACE_CASES = (
    ("glm5-tp8-gate_up", 1, C(1, 3, 2)),
    ("glm5-tp1-gate_up", 2, C(1, 2, 1, slices_per_warp=2)),
    ("glm5-tp8-down", 1, C(4, 1, 2, slice_k=128, splits=3)),
    ("glm5-tp8-gate_up", 8, C(1, 3, 1, cluster=2)),
)


@pytest.mark.parametrize("case", TRACE_CASES, ids=[f"{s}-t{m}" for s, m, _ in TRACE_CASES])
def test_trace_builds_compute_the_same_and_stamp_in_order(case) -> None:
    """A trace build writes the same outputs bit for bit, and after them, per CTA, stamps
    that follow TRACE_NAMES' order and an SM id the GPU has."""
    shape, m, config = case
    swiglu, w, w_scale, x, cols = _inputs(shape, m)
    plain = torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
    _launch(_request(shape, m, True, None, config=config), plain, x, w, w_scale)
    request = _request(shape, m, True, None, config=config, trace=True)
    p = gemv_params.GemvParams(**request.params)
    buf = torch.zeros(p.out_bytes, dtype=torch.uint8, device="cuda")
    buf[: p.trace_offset].view(torch.bfloat16).fill_(float("nan"))
    _launch(request, buf, x, w, w_scale)
    torch.cuda.synchronize()
    traced = buf[: m * cols * 2].view(torch.bfloat16).view(m, cols)
    stamps = buf[p.trace_offset :].view(torch.int64).view(p.ctas, gemv_params.TRACE_POINTS).cpu()
    times = stamps[:, : len(gemv_params.TRACE_NAMES)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    span = (times[:, -1] - times[:, 0]).max().item() / 1e3
    print(f"\n[fp8_gemv trace] {shape} tokens={m} {config} ctas={p.ctas} longest CTA {span:.2f} us")
    assert torch.equal(traced, plain), "a trace build must not change a single output bit"
    assert (times > 0).all() and (times.diff(dim=1) >= 0).all(), times
    assert ((stamps[:, -1] >= 0) & (stamps[:, -1] < sms)).all()


# late_steps: staged steps requested after x's loads; one tile per CTA, all staged late,
# slices of 128 K (the short-slice quantization), persistent in a cluster with send_x, K
# splits, and one wave of clusters sharing x at a fenced cluster barrier.
LATE_CASES = (
    ("glm5-tp8-gate_up", 1, C(1, 3, 2, late_steps=2)),
    ("glm5-tp8-down", 3, C(2, 3, 2, late_steps=5)),
    ("glm5-tp8-down", 1, C(1, 1, 2, slice_k=128, late_steps=1)),
    ("glm5-tp1-gate_up", 8, C(1, 3, 1, cluster=2, send_x=True, late_steps=2)),
    ("glm5-tp8-down", 1, C(4, 1, 2, slice_k=128, splits=3, late_steps=1)),
    ("glm5-tp8-gate_up", 8, C(1, 3, 2, cluster=2, late_steps=3)),
    # the planned 8-token gate_ups of GLM-5 TP 8 and TP 4 (tuning.LATE_STEPS)
    ("glm5-tp8-gate_up", 8, C(1, 3, 1, cluster=2, send_x=True, late_steps=4)),
    ("glm5-tp4-gate_up", 8, C(1, 3, 1, cluster=2, send_x=True, late_steps=4)),
)


@pytest.mark.parametrize(
    "case", LATE_CASES, ids=[f"{s}-t{m}-l{c.late_steps}" for s, m, c in LATE_CASES]
)
def test_late_steps_compute_the_same(case) -> None:
    """Where the weights are requested changes no output bit."""
    shape, m, config = case
    swiglu, w, w_scale, x, cols = _inputs(shape, m)
    outs = []
    for c in (config, dataclasses.replace(config, late_steps=0)):
        out = torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
        _launch(_request(shape, m, True, None, config=c), out, x, w, w_scale)
        outs.append(out)
    torch.cuda.synchronize()
    err = rel_l2(outs[0], ref.gemv_reference(x, w, w_scale, swiglu=swiglu, ue8m0=True))
    print(f"\n[fp8_gemv late] {shape} tokens={m} {config} rel_l2={err:.3e}")
    assert not torch.isnan(outs[0]).any(), "unwritten (NaN-poisoned) or NaN outputs"
    assert torch.equal(outs[0], outs[1])
    assert err < TOL


# paced: staged steps kept in flight until the PDL wait returns, the rest after x's loads;
# one tile per CTA, all staged, clusters sharing x (st.async or a barrier), 128-K slices, K
# splits, the trigger at entry, persistent grids, several slices per warp.
PACED_CASES = (
    ("glm5-tp8-gate_up", 1, C(1, 3, 2, paced=1)),
    ("glm5-tp8-gate_up", 2, C(1, 0, 2, paced=2)),
    ("glm5-tp8-gate_up", 8, C(1, 3, 2, cluster=2, send_x=True, paced=1)),
    ("glm5-tp8-down", 1, C(1, 0, 2, slice_k=128, paced=1)),
    ("glm5-tp8-down", 3, C(8, 0, 2, slice_k=128, splits=3, paced=1)),
    # a cluster sharing x through its fenced barrier; the PDL trigger at entry
    ("glm5-tp8-gate_up", 6, C(1, 3, 2, cluster=2, paced=1)),
    ("glm4.5-tp8-gate_up", 8, C(2, 2, 1, early_launch=True, paced=1)),
    # persistent grids: the first tile paced, the next tiles' refills as before
    ("glm5-tp8-gate_up", 2, C(1, 3, 1, paced=1)),
    ("glm5-tp8-gate_up", 6, C(1, 3, 1, cluster=2, send_x=True, paced=1)),
    ("glm4.5-tp2-down", 3, C(1, 2, 1, paced=2)),
    # several slices per warp, paced slice after slice: one wave, a persistent grid, K splits
    ("glm5-tp8-down", 2, C(4, 1, 2, slices_per_warp=3, paced=1)),
    ("glm5-tp1-gate_up", 2, C(1, 0, 2, slices_per_warp=3, paced=2)),
    ("glm5-tp8-down", 8, C(6, 1, 1, slices_per_warp=3, slice_k=128, splits=2, paced=1)),
)


@pytest.mark.parametrize(
    "case", PACED_CASES, ids=[f"{s}-t{m}-p{c.paced}" for s, m, c in PACED_CASES]
)
def test_paced_steps_compute_the_same(case) -> None:
    """Paced behind a running kernel (its loop runs until that one is done) or not: the same
    output bits as the kernel that requests every step at once."""
    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager

    shape, m, config = case
    swiglu, w, w_scale, x, cols = _inputs(shape, m)
    plain, paced = (
        load_kernel(default_manager().get(_request(shape, m, True, None, config=c)), x.device)
        for c in (dataclasses.replace(config, paced=0), config)
    )
    outs = [
        torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(4)
    ]
    torch.cuda.synchronize()
    # The first paced launch paces while the plain one runs; the second while the first does.
    for kernel, out in zip((plain, paced, paced, plain), outs, strict=True):
        kernel.launch([out, x, w, w_scale])
    torch.cuda.synchronize()
    err = rel_l2(outs[1], ref.gemv_reference(x, w, w_scale, swiglu=swiglu, ue8m0=True))
    print(f"\n[fp8_gemv paced] {shape} tokens={m} {config} rel_l2={err:.3e}")
    assert not torch.isnan(outs[1]).any(), "unwritten (NaN-poisoned) or NaN outputs"
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    assert err < TOL


# Persistent grids planned for fewer SMs (sms=66: half the H200's): another row-tile to CTA
# assignment, the same outputs bit for bit.
SMS_CASES = (
    ("glm5-tp1-gate_up", 8, C(1, 3, 1, cluster=2)),
    ("glm5-tp1-down", 1, C(1, 0, 1, slices_per_warp=3)),
)


@pytest.mark.parametrize("case", SMS_CASES, ids=[f"{s}-t{m}" for s, m, _ in SMS_CASES])
def test_fewer_sms_same_outputs(case) -> None:
    shape, m, config = case
    swiglu, w, w_scale, x, cols = _inputs(shape, m)
    outs = []
    for sms in (66, hopper.SMS):
        out = torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
        rows, k, _ = SHAPES[shape]
        request = fp8_plan.gemv_request(rows, k, m, swiglu=swiglu, limit=None, ue8m0=True,
                                    arch=ARCH, config=config, sms=sms)  # fmt: skip
        _launch(request, out, x, w, w_scale)
        outs.append(out)
    torch.cuda.synchronize()
    print(f"\n[fp8_gemv sms] {shape} tokens={m} {config} identical={torch.equal(*outs)}")
    assert not torch.isnan(outs[0]).any()
    assert torch.equal(outs[0], outs[1])


def test_cluster_grids_fit_one_wave() -> None:
    """Every one-wave cluster grid that plan accepts is resident at once (cuOccupancyMax-
    ActiveClusters): a cluster that waited for a second wave would double the kernel's time.
    plan refuses persistent grids in clusters of 4 (tuning.MAX_PERSISTENT_CLUSTER) because
    they are not."""
    from cuda.bindings import driver

    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager

    for shape, m, config, ue8m0 in CLUSTER_CASES:
        kernel = load_kernel(default_manager().get(_request(shape, m, ue8m0, None, config=config)),
                             torch.device("cuda", 0))  # fmt: skip
        launch_config = kernel._build_config(torch.cuda.current_stream().cuda_stream, True)
        err, clusters = driver.cuOccupancyMaxActiveClusters(kernel.function, launch_config)
        assert int(err) == 0, err
        grid = kernel.grid[0]
        resident = clusters * config.cluster
        print(f"\n[fp8_gemv cluster] {shape} tokens={m} {config} grid={grid} "
              f"max active clusters={clusters} ({resident} CTAs)")  # fmt: skip
        rows, k, _ = SHAPES[shape]
        if grid <= hopper.SMS * config.ctas_per_sm:  # meant as one wave
            assert (resident >= grid) == tuning.config_fits(rows, k, m, config), (resident, grid)


@pytest.mark.parametrize("clustered", [False, True], ids=["plain", "clusters"])
def test_pdl_chain_gate_up_then_down(clustered: bool) -> None:
    """gate_up then down back to back with PDL: down reads act only after its wait."""
    m = 8 if clustered else 4
    gate_up, down = cluster_chain_requests() if clustered else chain_requests()
    w13, s13 = _weights(3072, 6144, seed=11, out_std=2.0)
    w2, s2 = _weights(6144, 1536, seed=12, out_std=1.0)
    x = _x(m, 6144, seed=13)
    act = torch.full((m, 1536), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = torch.full((m, 6144), float("nan"), dtype=torch.bfloat16, device="cuda")
    for _ in range(3):  # repeated: a stale act read would show up as a mismatch or NaN
        act.fill_(float("nan"))
        out.fill_(float("nan"))
        _launch(gate_up, act, x, w13, s13)
        _launch(down, out, act, w2, s2)
    torch.cuda.synchronize()
    want_act = ref.gemv_reference(x, w13, s13, swiglu=True, limit=None, ue8m0=True)
    want = ref.gemv_reference(want_act, w2, s2, swiglu=False, limit=None, ue8m0=True)
    err_act, err_out = rel_l2(act, want_act), rel_l2(out, want)
    print(f"\n[fp8_gemv] pdl chain glm5-tp8 tokens={m} clusters={clustered} "
          f"act rel_l2={err_act:.3e} out={err_out:.3e}")  # fmt: skip
    assert not torch.isnan(out).any() and not torch.isnan(act).any()
    assert err_act < TOL and err_out < TOL
