"""fp8_layer launches (a whole dense MLP layer in one kernel) on the GPU against
mlpjit.reference, act and out both.

Run on the H200 with a cache compiled on a CPU machine (scripts/gpu_requests.py lists this
file's kernel_requests()). act and out are poisoned with NaN first, so "no NaN" also means
every element was written. Shapes include block counts that are odd or prime in either
phase, and layers whose every tile is split between CTAs.
"""

from __future__ import annotations

import pytest
import torch

from mlpjit import reference as ref
from mlpjit.kernels.fp8_layer import plan
from mlpjit.kernels.fp8_layer.params import COUNTER_BYTES, LayerParams
from mlpjit.kernels.fp8_stream.params import SLOT_BYTES
from mlpjit.testing.layers import random_fp8_layer, rel_l2

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("exact_fp32_matmul"),
]

ARCH = "sm_90a"
TOL = 5e-3
LIMIT = 3.0

# name -> (hidden, inter)
SHAPES = {
    "dsv3-shared-tp8": (7168, 256),  # gate_up tiles split over ~4 CTAs, down 2 blocks per tile
    "glm5-tp8": (6144, 1536),
    "odd-13x3": (1664, 384),  # gate_up 48 tiles x 13 blocks, down 104 tiles x 3 blocks
    "prime-7x9": (896, 1152),  # gate_up 144 tiles x 7 blocks, down 56 tiles x 9 blocks
}

CASES = (
    [(s, m, True, None) for s in SHAPES for m in (1, 8)]
    + [(s, 3, False, None) for s in ("dsv3-shared-tp8", "odd-13x3")]
    + [(s, m, u, LIMIT) for s in ("glm5-tp8", "prime-7x9") for m in (2, 8) for u in (True, False)]
)  # fmt: skip
GRAPH_SHAPES = ("dsv3-shared-tp8", "odd-13x3")


def _request(shape: str, m: int, ue8m0: bool, limit: float | None, arch: str = ARCH):
    hidden, inter = SHAPES[shape]
    return plan.layer_request(hidden, inter, m, limit=limit, ue8m0=ue8m0, arch=arch)


def kernel_requests(arch: str = ARCH) -> list:
    """Every compile request of these tests (for warming a cache on a machine without GPU)."""
    seen = []
    for case in CASES + [(s, 4, True, None) for s in GRAPH_SHAPES]:
        r = _request(*case, arch=arch)
        if r not in seen:
            seen.append(r)
    return seen


def _kernel(request):
    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager

    return load_kernel(default_manager().get(request), torch.device("cuda", 0))


def _inputs(shape: str, m: int):
    hidden, inter = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(hidden + inter)
    layer = random_fp8_layer(hidden, inter, gen)
    x = torch.randn(m, hidden, generator=gen, device="cuda")
    x[:, 5::301] *= 16  # outlier channels: groups with very different scales
    return layer, x.to(torch.bfloat16)


def _workspace(request) -> torch.Tensor:
    nbytes = LayerParams(**request.params).workspace_bytes
    return torch.zeros(nbytes, dtype=torch.uint8, device="cuda")


def _launch(kernel, layer, x, act, out, work) -> None:
    kernel.launch([out, act, x, layer["w13"], layer["w13_scale"], layer["w2"],
                   layer["w2_scale"], work])  # fmt: skip


def _counters(request, work: torch.Tensor) -> torch.Tensor:
    """Every arrival counter of the workspace: each phase's per-tile counters (after its
    partial-sum slots) and the layer's two."""
    p = LayerParams(**request.params)
    parts = [work[-COUNTER_BYTES:]]
    for base, phase in ((0, p.gate_up), (p.work_down, p.down)):
        start = base + phase.ctas * 2 * SLOT_BYTES
        parts.append(work[start : start + phase.tiles * 4])
    return torch.cat(parts)


def _nan(m: int, cols: int) -> torch.Tensor:
    return torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")


def _case_id(case) -> str:
    s, m, u, lim = case
    return f"{s}-t{m}-{'ue8m0' if u else 'f32'}-lim{lim}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_layer_matches_reference_and_repeats_bit_for_bit(case) -> None:
    shape, m, ue8m0, limit = case
    hidden, inter = SHAPES[shape]
    layer, x = _inputs(shape, m)
    request = _request(shape, m, ue8m0, limit)
    kernel = _kernel(request)
    work = _workspace(request)
    results = []
    for _ in range(3):  # the counters must be back at zero after each launch
        act, out = _nan(m, inter), _nan(m, hidden)
        _launch(kernel, layer, x, act, out, work)
        results.append((act, out))
    torch.cuda.synchronize()
    want_act = ref.gemv_reference(x, layer["w13"], layer["w13_scale"], swiglu=True,
                                  limit=limit, ue8m0=ue8m0)  # fmt: skip
    act, out = results[0]
    # down's input is the kernel's own act: compare out against down of that act
    want_out = ref.gemv_reference(act, layer["w2"], layer["w2_scale"], swiglu=False,
                                  ue8m0=ue8m0)  # fmt: skip
    err_act, err_out = rel_l2(act, want_act), rel_l2(out, want_out)
    print(f"\n[fp8_layer] {shape} tokens={m} ue8m0={ue8m0} limit={limit} "
          f"rel_l2 act={err_act:.3e} out={err_out:.3e}")  # fmt: skip
    assert not torch.isnan(act).any() and not torch.isnan(out).any(), "unwritten or NaN"
    assert err_act < TOL and err_out < TOL
    for a, o in results[1:]:
        assert torch.equal(a, act) and torch.equal(o, out), "repeated launches differ"
    assert not _counters(request, work).any(), "arrival counters left non-zero"


@pytest.mark.parametrize("shape", GRAPH_SHAPES)
def test_graph_replays_equal_eager_and_two_streams_agree(shape: str) -> None:
    m = 4
    hidden, inter = SHAPES[shape]
    layer, x = _inputs(shape, m)
    request = _request(shape, m, True, None)
    kernel = _kernel(request)
    act, eager = _nan(m, inter), _nan(m, hidden)
    _launch(kernel, layer, x, act, eager, _workspace(request))
    torch.cuda.synchronize()

    replayed = _nan(m, hidden)
    work = _workspace(request)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _launch(kernel, layer, x, act, replayed, work)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _launch(kernel, layer, x, act, replayed, work)
    for _ in range(5):
        replayed.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, eager)

    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [_nan(m, hidden) for _ in streams]
    acts = [_nan(m, inter) for _ in streams]
    works = [_workspace(request) for _ in streams]
    for _ in range(20):  # concurrent launches, one workspace and act per stream
        for s, a, o, wk in zip(streams, acts, outs, works, strict=True):
            with torch.cuda.stream(s):
                _launch(kernel, layer, x, a, o, wk)
    torch.cuda.synchronize()
    assert all(torch.equal(o, eager) for o in outs)
    assert all(not _counters(request, wk).any() for wk in works)
    print(f"\n[fp8_layer] {shape} graph and two streams identical to eager")
