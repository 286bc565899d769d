"""CPU checks of the fp8_stream kernel: it compiles for sm_90a without a GPU, and its SASS
has the shape kernel.py's docstring promises (bulk copies counted on mbarriers, FP8 mma, one
PDL wait per waiting role, split tiles met through release/acquire atomics in the grid-wide
form and through st.async in a cluster's shared memory in the cluster form, with no global
fence or atomic there, no spills) and its parameters match the launcher's list."""

from __future__ import annotations

import functools
import re
from collections import Counter

import pytest

pytest.importorskip("cutlass")

from mlpjit.kernels import hopper  # noqa: E402
from mlpjit.kernels.fp8_stream import plan  # noqa: E402
from mlpjit.kernels.fp8_stream.params import KERNEL_ARGS  # noqa: E402
from mlpjit.testing.cubin_info import cubin_kernel_params, sass_facts  # noqa: E402

ARCH = "sm_90a"

# (rows, k, tokens, swiglu, ue8m0, limit, cluster, share_x): GLM-5 TP 8 gate_up at 1 and
# 8 tokens, the DeepSeek-V3 TP-8 shared expert's down (2 blocks per tile: stages span several
# tiles), a clamp; the grid-wide form (cluster 0), the planner's cluster form (None: clusters
# of 2 here) and clusters of 8 (the shared expert's gate_up, 32 tiles); x quantized once per
# cluster of 2 and of 4; whole-tile stages (stage_shape): 6 warps x 2 blocks for 12-block
# K, 15 x 1 for 15, 7 x 3 for 21 (with shared x).
CASES = [
    (3072, 6144, 1, True, True, None, 0, False),
    (3072, 6144, 8, True, False, 3.0, None, False),
    (7168, 256, 4, False, True, None, 0, False),
    (7168, 256, 4, False, True, None, None, False),
    (512, 7168, 1, True, True, None, 8, False),
    (3072, 6144, 8, True, True, None, 2, True),
    (6144, 2816, 6, False, False, None, 4, True),
    (6144, 1536, 1, False, True, None, None, False),
    (3072, 1920, 8, False, True, None, None, False),
    (5376, 2688, 8, True, True, None, 2, True),
]


@functools.cache
def _facts(case: tuple) -> dict:
    from mlpjit.kernels.fp8_stream.kernel import compile_cubin

    rows, k, tokens, swiglu, ue8m0, limit, cluster, share_x = case
    params = plan.stream_params(
        rows, k, tokens, swiglu=swiglu, limit=limit, ue8m0=ue8m0, cluster=cluster,
        share_x=share_x,
    )  # fmt: skip
    binary = compile_cubin(params, ARCH)
    f = sass_facts(binary.cubin)
    return dict(
        params=params, binary=binary, regs=f.regs, stack=f.stack, local=f.local,
        count=Counter(f.ops), cubin_params=cubin_kernel_params(binary.cubin, binary.symbol),
    )  # fmt: skip


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c[0]}x{c[1]}-t{c[2]}-k{c[6]}{'-share' * c[7]}" for c in CASES]
)
def test_stream_kernel_sass(case) -> None:
    f = _facts(case)
    params, binary, count = f["params"], f["binary"], f["count"]
    assert f["stack"] == 0 and f["local"] == 0, "spills"
    assert f["regs"] <= hopper.reg_budget(binary.block[0], params.ctas_per_sm)
    assert binary.grid == (params.ctas, 1, 1) and binary.block == (32 * (params.warps + 2), 1, 1)
    assert binary.smem_bytes == params.smem_bytes <= hopper.smem_budget(params.ctas_per_sm)
    assert binary.pdl is True
    # Weights: bulk copies into the ring (one copy site), counted on mbarriers (expect-tx,
    # try-wait).
    assert count["UBLKCP.S.G"] == 1
    assert any(op.startswith("SYNCS.ARRIVE.TRANS64") for op in count)
    assert any(op.startswith("SYNCS.PHASECHK.TRANS64") for op in count)
    assert not any(op.startswith("LDGSTS.E.BYPASS") for op in count)
    # FP8 mma: one block = 4 m16n8k32 e4m3 mmas, each 2 HMMA.16816.F32 and FP8 unpacks;
    # a warp takes blocks_per_warp blocks per stage.
    assert count["HMMA.16816.F32"] == 8 * params.blocks_per_warp
    assert count["F2FP.F16.E4M3.UNPACK_B"] >= 8 * params.blocks_per_warp
    assert any(op.startswith("F2FP.SATFINITE.E4M3") for op in count)
    # PDL: the consumers and the epilogue warp wait (the producer never does); one trigger.
    assert count["ACQBULK"] == 2 and count["PREEXIT"] == 1
    if params.cluster == 0:
        # Split tiles: arrival counters with release/acquire atomics at gpu scope.
        assert count["ATOMG.E.ADD.STRONG.GPU"] >= 1 and binary.cluster == (1, 1, 1)
    elif params.cluster == 1:
        # Clusters of one CTA: whole tiles each, nothing split, sent or waited for.
        assert binary.cluster == (1, 1, 1)
        banned = ("ATOMG", "RED.", "MEMBAR.ALL.GPU", "STAS", "UCGABAR")
        assert not any(op.startswith(banned) for op in count)
    else:
        # Split tiles meet in the owner's shared memory: st.async after the cluster's entry
        # barrier; no global atomic or fence, nothing read or written in the workspace.
        assert binary.cluster == (params.cluster, 1, 1) and params.cluster > 1
        assert not any(op.startswith(("ATOMG", "RED.", "MEMBAR.ALL.GPU")) for op in count)
        assert count["UCGABAR_ARV"] == 1
        if not params.share_x:
            assert count["STAS.128"] == 1 and count["UCGABAR_WAIT"] == 1
        else:
            # x too: every quantized chunk and its scale go to the cluster's other CTAs by
            # st.async (one pass of stores per chunk batch; the consumers wait at the
            # cluster barrier once, before their first remote store).
            sends = params.x_passes * (params.cluster - 1)
            assert count["STAS.128"] == 1 + sends and count["STAS"] == sends
            assert count["UCGABAR_WAIT"] == 2
    # The launcher passes five raw pointers, in KERNEL_ARGS order.
    assert [p.name for p in binary.params] == list(KERNEL_ARGS)
    assert [p.size for p in f["cubin_params"]] == [8] * len(KERNEL_ARGS)


def _compiled(rows: int, k: int, tokens: int, **options) -> tuple:
    from mlpjit.kernels.fp8_stream.kernel import compile_cubin

    params = plan.stream_params(rows, k, tokens, swiglu=True, limit=None, ue8m0=True, **options)
    binary = compile_cubin(params, ARCH)
    return params, binary, sass_facts(binary.cubin)


@pytest.mark.parametrize("tokens", [1, 8])
def test_ablated_builds_leave_out_only_their_part(tokens) -> None:
    """A developer's ablation keeps the stream (bulk copies, mbarriers, PDL) and drops only
    its part: 'mma' every FP8 mma, 'x' the loads and quantization of x."""
    counts = {}
    for ablate in ("", "x", "mma"):
        _, _, f = _compiled(3072, 6144, tokens, ablate=ablate)
        assert f.stack == 0 and f.local == 0, "spills"
        count = Counter(f.ops)
        assert count["UBLKCP.S.G"] == 1 and count["ACQBULK"] == 2 and count["PREEXIT"] == 1
        counts[ablate] = count
    assert counts[""]["HMMA.16816.F32"] == counts["x"]["HMMA.16816.F32"] > 0
    assert counts["mma"]["HMMA.16816.F32"] == 0
    quantized = [op for op in counts[""] if op.startswith("F2FP.SATFINITE.E4M3")]
    assert quantized and not any(counts["x"][op] for op in quantized)
    assert all(counts["mma"][op] for op in quantized)


@pytest.mark.parametrize(
    ("rows", "k", "tokens", "options"),
    [
        (3072, 6144, 1, dict(cluster=0)),
        (3072, 6144, 8, dict(cluster=2, share_x=True)),
        (1152, 896, 3, dict(warps=4, blocks_per_warp=3)),  # stages over three 7-block tiles
        (3072, 6144, 1, dict(step_sums=True)),  # a fence and a wait per round
    ],
)
def test_tma_builds_copy_by_tensor_maps_and_multiply_by_wgmma(rows, k, tokens, options) -> None:
    """tma: the producer's tensor copies (two per block with SwiGLU: gate and up rows)
    instead of row copies, still before the PDL wait; one QGMMA.64x32x32 with A by
    descriptor per 32 K of each round a warpgroup takes, no emulated FP8 mma, one
    warpgroup fence and wait per stage; a sixth pointer (the map); no spills."""
    params, binary, f = _compiled(rows, k, tokens, tma=True, **options)
    count = Counter(f.ops)
    assert f.stack == 0 and f.local == 0, "spills"
    assert count["UTMALDG.3D"] == 2 and "UBLKCP.S.G" not in count  # SwiGLU: gate and up
    assert f.ops.index("UTMALDG.3D") < f.ops.index("ACQBULK")
    assert count["QGMMA.64"] == 4 * params.blocks_per_warp
    # A by descriptor: the accumulator, then the descriptor, no A registers between
    by_descriptor = re.findall(r"QGMMA\.64x32x32\.F32\.E4M3\.E4M3 R\d+, gdesc\[", f.sass)
    assert len(by_descriptor) == 4 * params.blocks_per_warp
    waits = params.blocks_per_warp if params.step_sums else 1
    assert count["WARPGROUP.ARRIVE"] == waits and count["WARPGROUP.DEPBAR.LE"] == waits
    assert not any(op.startswith(("HMMA", "F2FP.F16.E4M3.UNPACK")) for op in count)
    assert any(op.startswith("FENCE.VIEW.ASYNC.S") for op in count), "x: proxy fence"
    assert [p.name for p in binary.params] == [*KERNEL_ARGS, "w_map"]


@pytest.mark.parametrize("tokens", [1, 8])
def test_tma_x_chunks_of_a_quarter_warp_fall_in_eight_bank_groups(tokens: int) -> None:
    """tma: the 8 lanes of a quarter warp store the 8 16-byte chunks of one token's K block
    of x; they land in 8 different 16-byte bank groups, where wgmma's descriptor finds them
    (core matrix c of the block X_CORE * c on, row t 16 * t on)."""
    from mlpjit.kernels.fp8_stream.kernel import _X_DESC, Fp8Stream
    from mlpjit.kernels.fp8_stream.params import X_BLOCK_BYTES, X_CORE, StreamParams

    stream = Fp8Stream(StreamParams(3072, 6144, tokens, True, None, True, tma=True))
    assert (_X_DESC >> 16) & 0x3FFF == X_CORE // 16  # leading-byte offset: the next K half
    assert (_X_DESC >> 32) & 0x3FFF == X_BLOCK_BYTES // 16  # stride-byte offset: next block
    for t in range(tokens):
        for xb in range(3):
            chunks = [stream.x_chunk_address(0, t, xb, cl) for cl in range(8)]
            assert chunks == [xb * X_BLOCK_BYTES + cl * X_CORE + t * 16 for cl in range(8)]
            assert len({address // 16 % 8 for address in chunks}) == 8
