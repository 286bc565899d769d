"""fp8_stream launches on the GPU against mlpjit.reference.gemv_reference.

Run on the H200 with a cache compiled on a CPU machine (scripts/gpu_requests.py lists this
file's kernel_requests()). Outputs are poisoned with NaN first, so "no NaN" also means
every element was written. Shapes include block counts that are odd or prime and grids
where every tile is split between CTAs, so the workspace reduction runs everywhere; the
cluster form (whole tiles per thread block cluster, split tiles reduced in distributed
shared memory) runs on the same shapes with clusters of 1, 2, 4 and 8, up to seven CTAs
sending their partials of one tile, and with x quantized once per cluster (share_x).
"""

from __future__ import annotations

import pytest
import torch

from mlpjit import reference as ref
from mlpjit.kernels.fp8_stream import plan
from mlpjit.kernels.fp8_stream.params import workspace_bytes
from mlpjit.testing.layers import block_scale, random_fp8_weight, rel_l2

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("exact_fp32_matmul"),
]

ARCH = "sm_90a"
TOL = 5e-3
LIMIT = 3.0

# name -> (rows, k, swiglu)
SHAPES = {
    "glm5-tp8-gate_up": (3072, 6144, True),
    "glm5-tp8-down": (6144, 1536, False),
    "dsv3-shared-tp8-gate_up": (512, 7168, True),  # 1792 blocks: ranges inside one tile
    "dsv3-shared-tp8-down": (7168, 256, False),  # 2 blocks per tile
    "dsv3-tp8-down": (7168, 2304, False),  # 18 blocks per tile
    "odd-24x13": (384, 1664, False),  # 24 tiles x 13 blocks = 312 blocks on 132 CTAs
    "odd-swiglu-8x13": (128, 1664, True),  # 104 blocks: 104 CTAs, up to 2 per tile
    "tiny-8x5": (128, 640, False),  # 40 blocks: 40 CTAs of one block, 5 per tile
    "prime-72x7": (1152, 896, False),  # 504 blocks: ranges of 3 and 4 blocks
}

CASES = (
    [(s, m, True, None) for s in SHAPES for m in (1, 8)]
    + [(s, 3, False, None) for s in ("glm5-tp8-gate_up", "odd-24x13", "dsv3-shared-tp8-down")]
    + [(s, m, u, LIMIT) for s in ("glm5-tp8-gate_up", "odd-swiglu-8x13") for m in (2, 8)
       for u in (True, False)]
)  # fmt: skip


# (shape, cluster, tma): the grid-wide form and the cluster form (negative: with share_x),
# with row copies and mma.sync or TMA copies and wgmma
GRAPH_CASES = (("odd-24x13", 0, False), ("dsv3-shared-tp8-gate_up", 0, False),
               ("odd-24x13", 4, False), ("dsv3-shared-tp8-gate_up", 8, False),
               ("odd-24x13", -2, False), ("dsv3-shared-tp8-gate_up", -8, False),
               ("odd-24x13", 0, True), ("prime-72x7", -4, True))  # fmt: skip
# Two blocks per consumer warp and stage, and two CTAs per SM (knobs beside the default).
KNOB_CASES = [
    (s, m, True, None, dict(warps=8, blocks_per_warp=2, ctas_per_sm=c))
    for s, m, c in (("glm5-tp8-down", 1, 2), ("dsv3-shared-tp8-down", 4, 2),
                    ("odd-24x13", 8, 1), ("glm5-tp8-gate_up", 3, 1))
]  # fmt: skip
# The cluster form: tiles split over 2-8 CTAs of a cluster (odd-swiglu-8x13 with clusters
# of 8: one 13-block tile per cluster, 1-2 blocks per CTA, seven senders), whole tiles
# (cluster 1), and k of 2 blocks.
CLUSTER_CASES = [
    (s, m, u, lim, dict(warps=8, blocks_per_warp=2, cluster=c))
    for s, m, u, lim, c in (
        ("odd-24x13", 8, True, None, 2), ("odd-24x13", 1, False, None, 4),
        ("prime-72x7", 3, True, None, 4), ("dsv3-shared-tp8-gate_up", 8, True, LIMIT, 8),
        ("dsv3-shared-tp8-gate_up", 1, False, None, 8),
        ("odd-swiglu-8x13", 2, False, LIMIT, 8), ("odd-swiglu-8x13", 8, True, None, 2),
        ("glm5-tp8-down", 1, True, None, 1), ("glm5-tp8-gate_up", 8, True, None, 2),
        ("glm5-tp8-gate_up", 1, True, LIMIT, 2), ("tiny-8x5", 1, True, None, 4),
        ("dsv3-shared-tp8-down", 4, True, None, 2), ("dsv3-tp8-down", 8, False, None, 2),
    )
]  # fmt: skip
# x quantized once per cluster: every CTA of a cluster holds all of x, quantizes every
# cluster-th (token, block) chunk and gets the rest by st.async. Chunk counts the cluster
# does not divide (13 blocks x 3 tokens over 2 or 4 CTAs; 7 x 7 over 4), ranges under one
# tile (the shared expert's gate_up in clusters of 8), both scale rules, the clamp, the
# planner's 3 stages.
SHARE_X_CASES = [
    (s, m, u, lim, dict(warps=8, blocks_per_warp=2, stages=3, cluster=c, share_x=True))
    for s, m, u, lim, c in (
        ("odd-24x13", 3, True, None, 2), ("odd-24x13", 8, False, None, 4),
        ("prime-72x7", 7, True, None, 4), ("dsv3-shared-tp8-gate_up", 8, True, LIMIT, 8),
        ("dsv3-shared-tp8-gate_up", 6, False, None, 2),
        ("odd-swiglu-8x13", 3, False, LIMIT, 4), ("glm5-tp8-gate_up", 8, True, None, 2),
        ("glm5-tp8-gate_up", 6, False, LIMIT, 2), ("glm5-tp8-down", 8, True, None, 2),
        ("dsv3-tp8-down", 1, True, None, 2),
    )
]  # fmt: skip
# ... and with the planner's whole-tile stages (stage_shape: 13 warps x 1 block for the
# 13-block K, 7 x 3 for 7 blocks: 21 = three tiles per stage). CASES run them without a
# cluster too: glm5-tp8-down 6 x 2, dsv3-tp8-down 9 x 2, tiny-8x5 10 x 2.
SHARE_X_CASES += [
    (s, m, u, lim, dict(stages=3, cluster=c, share_x=True))
    for s, m, u, lim, c in (("odd-24x13", 8, True, None, 2), ("prime-72x7", 6, False, None, 4))
]


def _request(shape: str, m: int, ue8m0: bool, limit: float | None, knobs=None, arch: str = ARCH):
    rows, k, swiglu = SHAPES[shape]
    return plan.stream_request(
        rows, k, m, swiglu=swiglu, limit=limit, ue8m0=ue8m0, arch=arch, **(knobs or {})
    )


def kernel_requests(arch: str = ARCH) -> list:
    """Every compile request of these tests (for warming a cache on a machine without GPU)."""
    seen = []
    graph_cases = [_graph_case(*case) for case in GRAPH_CASES]
    for case in ALL_CASES + graph_cases:
        r = _request(*case, arch=arch)
        if r not in seen:
            seen.append(r)
    return seen


def _graph_case(shape: str, cluster: int, tma: bool):
    """cluster 0: the grid-wide form; > 0: the cluster form; < 0: clusters of -cluster with
    x quantized once per cluster."""
    knobs = dict(cluster=abs(cluster)) if cluster else {}
    if cluster < 0:
        knobs.update(share_x=True, stages=3)
    if tma:
        knobs.update(tma=True)
    return (shape, 4, True, None, knobs)


def _inputs(shape: str, m: int):
    rows, k, swiglu = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(rows + k)
    w, w_scale = random_fp8_weight(rows, k, gen, scale=block_scale(k, 2.0))
    x = torch.randn(m, k, generator=gen, device="cuda")
    x[:, 5::301] *= 16  # outlier channels: groups with very different scales
    return swiglu, w, w_scale, x.to(torch.bfloat16), rows // 2 if swiglu else rows


def _kernel(request):
    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager

    return load_kernel(default_manager().get(request), torch.device("cuda", 0))


def _maps(request, w: torch.Tensor) -> list:
    """[the weight's tensor map] for a tma build, [] otherwise."""
    from mlpjit.kernels.fp8_stream.params import StreamParams
    from mlpjit.kernels.tensor_map import weight_block_map

    params = StreamParams(**request.params)
    if not params.tma:
        return []
    return [weight_block_map(w.view(torch.uint8), params.tma_box_rows, 1)]


def _workspace(shape: str) -> torch.Tensor:
    rows, k, _ = SHAPES[shape]
    return torch.zeros(workspace_bytes(rows, k), dtype=torch.uint8, device="cuda")


def _case_id(case) -> str:
    s, m, u, lim, *knobs = case
    extra = "-" + "-".join(f"{k}{v}" for k, v in knobs[0].items()) if knobs else ""
    return f"{s}-t{m}-{'ue8m0' if u else 'f32'}-lim{lim}{extra}"


# tma: the ring filled by TMA tensor copies (128-byte swizzle) and read by wgmma through a
# descriptor, four warps' consecutive K blocks side by side (x in the core-matrix layout,
# the first three blocks repeated past K): every shape at 1 and 8 tokens with the planner's
# knobs (the cluster form), the grid-wide form (ranges inside one tile and over many),
# shared x, both scale rules, the clamp, and stages over two and three tiles (4 x 3 over
# 7-block tiles, 12 x 1).
TMA = dict(tma=True)
TMA_CASES = (
    [(s, m, True, None, TMA) for s in SHAPES for m in (1, 8)]
    + [(s, m, u, lim, dict(TMA, cluster=0)) for s, m, u, lim in (
        ("odd-24x13", 3, False, None), ("prime-72x7", 8, True, None),
        ("dsv3-shared-tp8-gate_up", 1, True, LIMIT), ("tiny-8x5", 5, True, None),
        ("glm5-tp8-gate_up", 2, False, LIMIT))]
    + [(s, m, u, lim, dict(TMA, cluster=c, share_x=True, stages=3)) for s, m, u, lim, c in (
        ("odd-24x13", 3, True, None, 2), ("prime-72x7", 7, False, None, 4),
        ("glm5-tp8-gate_up", 8, True, LIMIT, 2), ("dsv3-shared-tp8-gate_up", 6, True, None, 8),
        ("dsv3-tp8-down", 8, False, None, 2))]
    + [(s, m, True, None, dict(TMA, warps=w, blocks_per_warp=b)) for s, m, w, b in (
        ("prime-72x7", 1, 4, 3), ("odd-24x13", 8, 4, 1), ("glm5-tp8-down", 4, 12, 1),
        ("odd-swiglu-8x13", 2, 16, 1))]
    # each 32-K step's wgmma summed in fp32 registers (step_sums): its precision beside the
    # cases above
    + [(s, 1, True, None, dict(TMA, step_sums=True)) for s in SHAPES]
    + [("glm5-tp8-gate_up", 5, False, LIMIT, dict(TMA, step_sums=True)),
       ("odd-24x13", 3, True, None, dict(TMA, step_sums=True, cluster=2, share_x=True,
                                          stages=3))]
)  # fmt: skip

ALL_CASES = CASES + KNOB_CASES + CLUSTER_CASES + SHARE_X_CASES + TMA_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[_case_id(c) for c in ALL_CASES])
def test_stream_matches_reference_and_repeats_bit_for_bit(case) -> None:
    shape, m, ue8m0, limit, *knobs = case
    swiglu, w, w_scale, x, cols = _inputs(shape, m)
    request = _request(shape, m, ue8m0, limit, *knobs)
    kernel = _kernel(request)
    maps = _maps(request, w)
    work = _workspace(shape)
    outs = []
    for _ in range(3):  # the arrival counters must be back at zero after each launch
        out = torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
        kernel.launch([out, x, w, w_scale, work, *maps])
        outs.append(out)
    torch.cuda.synchronize()
    want = ref.gemv_reference(x, w, w_scale, swiglu=swiglu, limit=limit, ue8m0=ue8m0)
    err = rel_l2(outs[0], want)
    print(f"\n[fp8_stream] {shape} tokens={m} ue8m0={ue8m0} limit={limit} rel_l2={err:.3e}")
    assert not torch.isnan(outs[0]).any(), "unwritten (NaN-poisoned) or NaN outputs"
    assert err < TOL
    assert all(torch.equal(outs[0], o) for o in outs[1:]), "repeated launches differ"
    # (the cluster form never writes its workspace: all of it stays zero)
    assert not work[-(SHAPES[shape][0] // 16) * 4 :].any(), "arrival counters left non-zero"


@pytest.mark.parametrize(("shape", "cluster", "tma"), GRAPH_CASES)
def test_graph_replays_equal_eager_and_two_streams_agree(
    shape: str, cluster: int, tma: bool
) -> None:
    m = 4
    swiglu, w, w_scale, x, cols = _inputs(shape, m)
    request = _request(*_graph_case(shape, cluster, tma))
    kernel = _kernel(request)
    maps = _maps(request, w)
    eager = torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
    kernel.launch([eager, x, w, w_scale, _workspace(shape), *maps])
    torch.cuda.synchronize()

    replayed = torch.full_like(eager, float("nan"))
    work = _workspace(shape)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernel.launch([replayed, x, w, w_scale, work, *maps])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.launch([replayed, x, w, w_scale, work, *maps])
    for _ in range(5):
        replayed.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, eager)

    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [torch.full_like(eager, float("nan")) for _ in streams]
    works = [_workspace(shape) for _ in streams]
    for _ in range(20):  # concurrent launches, one workspace per stream
        for s, out, wk in zip(streams, outs, works, strict=True):
            with torch.cuda.stream(s):
                kernel.launch([out, x, w, w_scale, wk, *maps])
    torch.cuda.synchronize()
    assert all(torch.equal(o, eager) for o in outs)
    print(
        f"\n[fp8_stream] {shape} cluster={cluster} tma={tma} graph and two streams identical "
        "to eager"
    )
