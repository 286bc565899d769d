"""DenseMlp on the H200: kernels vs the reference, fallbacks, CUDA graphs, memory.

Run with the prebuilt cache (README: running the GPU tests on an H200), e.g.
    MLPJIT_CACHE_DIR=.gpu-cache python3 -m pytest -q -s tests/gpu/test_dense_mlp_gpu.py
``-s`` shows one line per case with the measured relative L2 errors. The kernels these tests
need are listed by ``kernel_requests()`` (scripts/gpu_requests.py collects them for warming).
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from mlpjit import DenseMlp, dense_mlp
from mlpjit import reference as ref
from mlpjit.dense_mlp import kernel_supported
from mlpjit.errors import CaptureError
from mlpjit.testing.layers import random_fp8_layer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("exact_fp32_matmul"),
]

TOL = 5e-3  # relative L2 error allowed against the reference, for act and out
LIMIT = 3.0  # a clamp that clips: gate/up values here have a standard deviation near 2

# (hidden, intermediate per TP shard)
SHAPES = {
    "glm5-tp1": (6144, 12288),
    "glm5-tp2": (6144, 6144),
    "glm5-tp4": (6144, 3072),
    "glm5-tp8": (6144, 1536),
    "glm4.5-tp8": (5120, 1536),
}
GLM_SHAPES = tuple(SHAPES)
TOKENS = tuple(range(1, 9))

# The other DeepSeek-family shards on the kernel path: K any multiple of 128, K splits over
# clusters, few-row shared experts (hidden, intermediate per shard).
FAMILY_SHAPES = {
    "glm5-shared-tp1": (6144, 2048),
    "glm5-shared-tp2": (6144, 1024),
    "glm5-shared-tp4": (6144, 512),
    "glm5-shared-tp8": (6144, 256),
    "dsv3-tp1": (7168, 18432),
    "dsv3-tp2": (7168, 9216),
    "dsv3-tp4": (7168, 4608),
    "dsv3-tp8": (7168, 2304),
    "dsv3-shared-tp1": (7168, 2048),
    "dsv3-shared-tp2": (7168, 1024),
    "dsv3-shared-tp4": (7168, 512),
    "dsv3-shared-tp8": (7168, 256),
    "glm4.5-tp1": (5120, 12288),
    "glm4.5-tp2": (5120, 6144),
    "glm4.5-tp3": (5120, 4096),
    "glm4.5-tp4": (5120, 3072),
    "glm4.5-tp6": (5120, 2048),
    "glm4.5-shared-tp1": (5120, 1536),
    "glm4.5-shared-tp2": (5120, 768),
    "glm4.5-shared-tp4": (5120, 384),
    "qwen3-8b-tp1": (4096, 12288),
    "qwen3-8b-tp2": (4096, 6144),
    "qwen3-8b-tp4": (4096, 3072),
    "qwen3-8b-tp8": (4096, 1536),
    "qwen3-14b-tp1": (5120, 17408),
    "qwen3-14b-tp2": (5120, 8704),
    "qwen3-14b-tp4": (5120, 4352),
    "qwen3-14b-tp8": (5120, 2176),
    "qwen3-32b-tp1": (5120, 25600),
    "qwen3-32b-tp2": (5120, 12800),
    "qwen3-32b-tp4": (5120, 6400),
    "qwen3-32b-tp8": (5120, 3200),
}
SHAPES.update(FAMILY_SHAPES)
# Shards on fp8_stream's cluster form (layer_plan.stream_halves): h6144-i4864's down
# projection alone (fp8_gemv's plan for it takes 3 waves; qwen3-8b-tp1 and qwen3-14b-tp1/tp2
# above are others), h3072-i2816 both halves (352 gate_up tiles of 24 blocks, 192 down tiles
# of 22; x quantized once per cluster from 6 tokens on; qwen3-8b-tp4, qwen3-14b-tp4,
# qwen3-32b-tp8 and deepseek-v3-shared-tp1 above are others). (gate_up, down) streamed:
# h3072-i1920 (16.9 MB, 15-block down in whole-tile stages of 15 warps) both halves from 6
# tokens only. (gate_up, down) at each token count where a half streams:
STREAM_SHAPES = {
    "h6144-i4864": (6144, 4864),
    "h3072-i2816": (3072, 2816),
    "h3072-i1920": (3072, 1920),
}
STREAMED = {
    "h6144-i4864": {1: (False, True), 8: (False, True)},
    "h3072-i2816": {1: (True, True), 8: (True, True)},
    "h3072-i1920": {8: (True, True)},
}
SHAPES.update(STREAM_SHAPES)
# A shard the kernels decline at every token count (k 196608 would take more than 8 waves of
# CTAs): it runs the stock path (test_fallback_shape_the_kernels_decline).
STOCK_SHAPE = (1024, 196608)

# (shape, tokens, ue8m0, limit): every shape x every token count with vLLM's Hopper default
# (ue8m0, no clamp); the other scale rule and the clamp on GLM-5 TP8 for every token count
# and on a few token counts of the others (each combination is its own compiled kernel).
CASES = (
    [(s, m, True, None) for s in GLM_SHAPES for m in TOKENS]
    + [(s, m, u, lim) for s in ("glm5-tp8",) for m in TOKENS
       for (u, lim) in ((False, None), (True, LIMIT), (False, LIMIT))]
    + [("glm5-tp1", m, False, LIMIT) for m in (1, 6)]
    + [("glm4.5-tp8", m, False, None) for m in (1, 5)]
    + [("glm4.5-tp8", m, True, LIMIT) for m in (2, 7)]
)  # fmt: skip
# Each family shape at three token counts (every count 1..8 on every fourth shape or so),
# the scale rule and the clamp alternating over shapes and counts.
CASES += [
    (shape, m, (i + j) % 2 == 0, LIMIT if (i + j) % 3 == 1 else None)
    for i, shape in enumerate(FAMILY_SHAPES)
    for j, m in enumerate(sorted({1 + (3 * i) % 8, 1 + (3 * i + 4) % 8, 8}))
]

CASES += [
    (shape, m, u, lim)
    for shape in STREAM_SHAPES
    for m, u, lim in ((1, True, None), (3, True, LIMIT), (8, True, None), (1, False, LIMIT),
                      (8, False, None), (5, False, None), (6, True, LIMIT))
]  # fmt: skip

GRAPH_SHAPE, GRAPH_LAYERS, GRAPH_TOKENS = "glm5-tp8", 4, 4
STREAM_TOKENS = (1, 8)


def kernel_requests(arch: str = "sm_90a") -> list:
    """Every compile request these tests use (for warming a cache without a GPU)."""
    from mlpjit.dense_mlp import kernel_requests as layer_requests

    wanted: dict[tuple, set[int]] = {}
    for shape, m, ue8m0, limit in CASES:
        wanted.setdefault((*SHAPES[shape], ue8m0, limit), set()).add(m)
    # graph, memory and allocation tests: GLM-5 TP8, ue8m0, no clamp, tokens 1..8; the
    # K-split repeat and graph tests: their shapes, ue8m0, no clamp, tokens 1..8
    for shape in (GRAPH_SHAPE, *SPLIT_SHAPES):
        wanted.setdefault((*SHAPES[shape], True, None), set()).update(TOKENS)
    for shape in STREAM_SHAPES:
        wanted.setdefault((*SHAPES[shape], True, None), set()).update(STREAM_TOKENS)
    requests = []
    for (hidden, inter, ue8m0, limit), tokens in wanted.items():
        requests += layer_requests(hidden, inter, sorted(tokens), arch, limit=limit, ue8m0=ue8m0)
    return requests


# ---- data -----------------------------------------------------------------------------------


def make_layer(hidden: int, inter: int, seed: int) -> dict[str, torch.Tensor]:
    """Random FP8 weights sized so gate/up come out with a standard deviation near 2 and
    out near 1 for unit inputs (mlpjit.testing.layers)."""
    return random_fp8_layer(hidden, inter, torch.Generator(device="cuda").manual_seed(seed))


def make_x(m: int, hidden: int, seed: int) -> torch.Tensor:
    """Unit-normal activations with a few outlier channels; never an exact zero."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, hidden, generator=gen, device="cuda")
    x[:, 7::997] *= 20
    x = torch.where(x == 0, torch.full_like(x, 0.5), x)
    return x.to(torch.bfloat16)


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    got64, want64 = got.double(), want.double()
    return float((got64 - want64).norm() / want64.norm())


def poisoned(m: int, cols: int) -> torch.Tensor:
    return torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")


_layers: dict[str, dict[str, torch.Tensor]] = {}
_inputs: dict[str, torch.Tensor] = {}
_refs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_mlps: dict[tuple, DenseMlp] = {}


def layer(shape: str) -> dict[str, torch.Tensor]:
    if shape not in _layers:
        _layers[shape] = make_layer(*SHAPES[shape], seed=len(_layers) + 1)
        _inputs[shape] = make_x(8, SHAPES[shape][0], seed=100 + len(_inputs))
    return _layers[shape]


def reference_for(shape: str, ue8m0: bool, limit: float | None) -> tuple:
    """(act, out) of the reference for the shape's 8-token input (rows are independent)."""
    key = (shape, ue8m0, limit)
    if key not in _refs:
        w = layer(shape)
        x = _inputs[shape]
        act = ref.gemv_reference(x, w["w13"], w["w13_scale"], swiglu=True, limit=limit, ue8m0=ue8m0)
        out = ref.gemv_reference(act, w["w2"], w["w2_scale"], swiglu=False, ue8m0=ue8m0)
        _refs[key] = (act, out)
    return _refs[key]


def mlp_for(shape: str, ue8m0: bool, limit: float | None) -> DenseMlp:
    key = (shape, ue8m0, limit)
    if key not in _mlps:
        mlp = DenseMlp(**layer(shape), limit=limit, ue8m0=ue8m0)
        mlp.prepare(sorted({m for s, m, u, lim in CASES if (s, u, lim) == key}))
        _mlps[key] = mlp
    return _mlps[key]


# ---- the kernels against the reference --------------------------------------------------------


@pytest.mark.parametrize(
    "shape,m,ue8m0,limit",
    CASES,
    ids=[f"{s}-m{m}-{'ue8m0' if u else 'f32s'}-{'L' if lim else 'noL'}" for s, m, u, lim in CASES],
)
def test_kernels_match_reference(shape: str, m: int, ue8m0: bool, limit: float | None) -> None:
    mlp = mlp_for(shape, ue8m0, limit)
    hidden, inter = SHAPES[shape]
    # fp8_gemv's planner decides; a target shape it declines runs (and is checked) on the stock path
    path = mlp.path(m)
    assert path == ("kernel" if kernel_supported(hidden, inter, m) else "stock")
    x = _inputs[shape][:m]
    act, out = poisoned(m, inter), poisoned(m, hidden)
    mlp.forward_into(x, act, out)
    torch.cuda.synchronize()
    want_act, want_out = reference_for(shape, ue8m0, limit)
    err_act = rel_l2(act, want_act[:m])
    err_out = rel_l2(out, want_out[:m])
    print(
        f"[dense_mlp] {shape:10s} m={m} ue8m0={ue8m0!s:5s} limit={limit!s:4s} path={path:6s} "
        f"act_rel_l2={err_act:.2e} out_rel_l2={err_out:.2e}"
    )
    assert torch.isfinite(act).all(), "act has NaN/Inf (unwritten or overflowed elements)"
    assert torch.isfinite(out).all(), "out has NaN/Inf (unwritten or overflowed elements)"
    assert err_act < TOL and err_out < TOL


# Per-token magnitudes of one 5-token call each: bf16 takes up to ~3e38; at 1e17 the layer's
# output is still finite in the reference (it grows with the square of the input).
MAGNITUDES = ((1.0, 1e8, 1e10, 1e12, 1e15), (1e16, 1e17, 1e-2, 1e4, 1e6))


@pytest.mark.parametrize("ue8m0", [True, False], ids=["ue8m0", "f32s"])
@pytest.mark.parametrize("magnitudes", MAGNITUDES, ids=["up-to-1e15", "extremes"])
def test_large_and_tiny_magnitude_tokens_match_reference(ue8m0: bool, magnitudes: tuple) -> None:
    """Each token scaled by its own factor matches the reference row by row (the SiLU's exp
    once turned NaN for gates beyond ~1e10, zeroing silu of large positive gates)."""
    shape = "glm4.5-tp8"
    mlp = mlp_for(shape, ue8m0, None)
    hidden, inter = SHAPES[shape]
    factors = torch.tensor(magnitudes, device="cuda").unsqueeze(1)
    x = (_inputs[shape][:5].float() * factors).to(torch.bfloat16)
    w = layer(shape)
    want_act = ref.gemv_reference(x, w["w13"], w["w13_scale"], swiglu=True, ue8m0=ue8m0)
    want_out = ref.gemv_reference(want_act, w["w2"], w["w2_scale"], swiglu=False, ue8m0=ue8m0)
    act, out = poisoned(5, inter), poisoned(5, hidden)
    mlp.forward_into(x, act, out)
    torch.cuda.synchronize()
    for i, factor in enumerate(magnitudes):
        assert torch.isfinite(want_out[i]).all(), f"reference overflowed at {factor:g}"
        err_act, err_out = rel_l2(act[i], want_act[i]), rel_l2(out[i], want_out[i])
        print(f"[magnitude] ue8m0={ue8m0!s:5s} x*{factor:<6g} act={err_act:.2e} out={err_out:.2e}")
        assert err_act < TOL and err_out < TOL, f"token scaled by {factor:g}"


@pytest.mark.parametrize("shape", ["glm5-tp8", "glm4.5-tp8"])
def test_clipping_limit_clips(shape: str) -> None:
    """The LIMIT cases really exercise the clamp: many gate/up values exceed it."""
    w = layer(shape)
    gate_up = ref.gemv_reference(
        _inputs[shape], w["w13"], w["w13_scale"], swiglu=False, ue8m0=True
    ).float()
    inter = SHAPES[shape][1]
    clipped = (gate_up[:, :inter] > LIMIT).float().mean() + (
        gate_up[:, inter:].abs() > LIMIT
    ).float().mean()
    assert float(clipped) > 0.02
    act_l, _ = reference_for(shape, True, LIMIT)
    act_n, _ = reference_for(shape, True, None)
    assert rel_l2(act_l, act_n) > 0.05


def test_call_allocating_equals_forward_into() -> None:
    mlp = mlp_for("glm5-tp8", True, None)
    hidden, inter = SHAPES["glm5-tp8"]
    x = _inputs["glm5-tp8"][:3]
    act, out = poisoned(3, inter), poisoned(3, hidden)
    mlp.forward_into(x, act, out)
    assert torch.equal(mlp(x), out)
    given = poisoned(3, hidden)
    assert mlp(x, out=given) is given and torch.equal(given, out)


class _Marked(torch.Tensor):
    """A Tensor subclass: x's checks take the long way for it."""


def test_x_checks_on_the_gpu() -> None:
    """A CUDA layer takes a Tensor subclass x like a plain one, and refuses x on the CPU or
    strided with the messages of the CPU tests."""
    mlp = mlp_for("glm5-tp8", True, None)
    x = _inputs["glm5-tp8"][:3]
    want = mlp(x)
    assert torch.equal(mlp(x.as_subclass(_Marked)), want)
    with pytest.raises(ValueError, match=r"x must be on the weights' device cuda:\d+, got cpu"):
        mlp(x.cpu())
    with pytest.raises(ValueError, match=r"x must be contiguous"):
        mlp(_inputs["glm5-tp8"][::2])


def test_unprepared_token_count_prepares_lazily_outside_capture() -> None:
    mlp = DenseMlp(**layer("glm5-tp8"), ue8m0=True)
    out = mlp(_inputs["glm5-tp8"][:6])
    assert "prepared=[6]" in repr(mlp)
    _, want = reference_for("glm5-tp8", True, None)
    assert rel_l2(out, want[:6]) < TOL


# ---- fallbacks (stock path: torch block-scaled _scaled_mm) -------------------------------------


@pytest.mark.parametrize("m", [9, 16, 40])
def test_fallback_more_than_8_tokens(m: int) -> None:
    hidden, inter = SHAPES["glm5-tp8"]
    w = layer("glm5-tp8")
    mlp = DenseMlp(**w, ue8m0=True)
    assert mlp.path(m) == "stock"
    x = make_x(m, hidden, seed=m)
    act, out = poisoned(m, inter), poisoned(m, hidden)
    mlp.forward_into(x, act, out)
    want_act = ref.gemv_reference(x, w["w13"], w["w13_scale"], swiglu=True, ue8m0=True)
    want_out = ref.gemv_reference(act, w["w2"], w["w2_scale"], swiglu=False, ue8m0=True)
    err_act, err_out = rel_l2(act, want_act), rel_l2(out, want_out)
    print(f"[fallback] glm5-tp8 m={m}: act_rel_l2={err_act:.2e} out_rel_l2={err_out:.2e}")
    assert torch.isfinite(out).all() and torch.isfinite(act).all()
    assert err_act < TOL and err_out < TOL
    assert torch.equal(mlp(x), out)


@pytest.mark.parametrize("m", [1, 4, 8])
@pytest.mark.parametrize("ue8m0,limit", [(True, None), (False, LIMIT)])
def test_fallback_shape_the_kernels_decline(m: int, ue8m0: bool, limit: float | None) -> None:
    """A shard the kernels decline (hidden 1024, intermediate 196608) runs the stock path."""
    hidden, inter = STOCK_SHAPE
    assert not kernel_supported(hidden, inter, m)
    if "stock" not in _layers:
        _layers["stock"] = make_layer(hidden, inter, seed=77)
    w = _layers["stock"]
    mlp = DenseMlp(**w, limit=limit, ue8m0=ue8m0)
    assert mlp.path(m) == "stock"
    x = make_x(m, hidden, seed=200 + m)
    act, out = poisoned(m, inter), poisoned(m, hidden)
    mlp.forward_into(x, act, out)
    want_act = ref.gemv_reference(
        x, w["w13"], w["w13_scale"], swiglu=True, limit=limit, ue8m0=ue8m0
    )
    # The stock path's act differs from the reference's in a few BF16 ulps (cuBLAS sums in
    # another order); re-quantizing flips some FP8 values, so judge the down GEMM on its input.
    want_out = ref.gemv_reference(act, w["w2"], w["w2_scale"], swiglu=False, ue8m0=ue8m0)
    err_act, err_out = rel_l2(act, want_act), rel_l2(out, want_out)
    print(
        f"[fallback] 1024x196608 m={m} ue8m0={ue8m0} limit={limit}: "
        f"act_rel_l2={err_act:.2e} out_rel_l2={err_out:.2e}"
    )
    assert torch.isfinite(out).all() and torch.isfinite(act).all()
    assert err_act < TOL and err_out < TOL


# ---- CUDA graphs ------------------------------------------------------------------------------


def test_plans_for_the_devices_sm_count() -> None:
    mlp = DenseMlp(**layer(GRAPH_SHAPE), ue8m0=True)
    assert mlp.sms == torch.cuda.get_device_properties(mlp.device).multi_processor_count


def test_layers_of_one_shape_share_their_kernels() -> None:
    """Many layers of one shape: one cache lookup and one module load per distinct kernel,
    the later layers served by the pairs the first one loaded (without even asking the
    kernel memo), every layer launching the same pair."""
    from mlpjit.jit import launcher, loaded

    hidden, inter = SHAPES[GRAPH_SHAPE]
    layers = [DenseMlp(**make_layer(hidden, inter, seed=800 + i)) for i in range(3)]
    loaded.clear()
    loads = launcher.module_loads()
    for mlp in layers:
        mlp.prepare(TOKENS)
    assert launcher.module_loads() - loads <= 2 * len(TOKENS)
    assert loaded.stats() == loaded.MemoStats(asked=2 * len(TOKENS), hits=0)
    assert all(layers[2]._kernels[m] is layers[0]._kernels[m] for m in TOKENS)
    x = make_x(2, hidden, seed=810)
    for mlp in layers:
        assert rel_l2(mlp(x), ref.dense_mlp_reference(x, **_weights_of(mlp))) < TOL


def _weights_of(mlp: DenseMlp) -> dict[str, torch.Tensor]:
    return {name: getattr(mlp, name) for name in ("w13", "w13_scale", "w2", "w2_scale")}


@pytest.mark.parametrize("tokens", [GRAPH_TOKENS, 8], ids=["plain", "clusters"])
def test_graph_of_a_chain_replays_like_eager(tokens: int) -> None:
    """Captured launches replay like eager ones, including cluster launches (GLM-5 TP8 runs
    both kernels in clusters of 2 at 8 tokens)."""
    hidden, inter = SHAPES[GRAPH_SHAPE]
    layers = [
        DenseMlp(**make_layer(hidden, inter, seed=300 + i), ue8m0=True) for i in range(GRAPH_LAYERS)
    ]
    for mlp in layers:
        mlp.prepare(TOKENS)
        assert mlp.path(tokens) == "kernel"
    pair = layers[0]._kernels[tokens]
    clusters = {pair.first.cluster, pair.second.cluster}
    assert clusters == ({(2, 1, 1)} if tokens == 8 else {(1, 1, 1)})
    assert_chain_replays_like_eager(layers, tokens, seed=400)


SPLIT_SHAPES = ("dsv3-shared-tp8", "dsv3-tp8", "dsv3-tp1", "glm5-shared-tp8")


def split_cluster_sizes(mlp: DenseMlp, m: int) -> list[int]:
    """Cluster sizes of the m-token kernels that split K (from their compile params)."""
    requests = dense_mlp.kernel_requests(
        mlp.hidden, mlp.intermediate, [m], mlp.arch, limit=mlp.limit, ue8m0=mlp.ue8m0, sms=mlp.sms
    )
    return [r.params.get("splits", 1) for r in requests if r.params.get("splits", 1) > 1]


def assert_repeats_on_two_streams(
    mlp: DenseMlp, inputs: list[torch.Tensor], first: torch.Tensor, rounds: int
) -> None:
    """mlp(inputs[0]) gives ``first`` again on three more calls, and each input gives its
    own result bit for bit over ``rounds`` calls on two streams running at the same time."""
    for _ in range(3):
        assert torch.equal(mlp(inputs[0]), first)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    wants = [first, mlp(inputs[1])]
    torch.cuda.synchronize()
    outs: list[list[torch.Tensor]] = [[], []]
    for _ in range(rounds):
        for i, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                outs[i].append(mlp(inputs[i]))
    torch.cuda.synchronize()
    for i in range(2):
        assert all(torch.equal(o, wants[i]) for o in outs[i]), f"stream {i}, m={len(first)}"


@pytest.mark.parametrize("shape", SPLIT_SHAPES)
def test_k_split_results_repeat_bit_for_bit(shape: str) -> None:
    """The K splits of a tile add up in a fixed order: every call gives the same bits, on
    the default stream and on two streams running the layer at the same time (nothing is
    shared between calls: the partials meet in the cluster's shared memory)."""
    hidden, inter = SHAPES[shape]
    mlp = DenseMlp(**layer(shape), ue8m0=True)
    mlp.prepare(TOKENS)
    assert any(split_cluster_sizes(mlp, m) for m in TOKENS), "no K-split kernel in this shape"
    for m in TOKENS:
        x = make_x(m, hidden, seed=500 + m)
        first = mlp(x)
        assert_repeats_on_two_streams(mlp, [x, make_x(m, hidden, seed=600 + m)], first, 20)
    print(f"[k-split] {shape}: splits per token count "
          f"{ {m: split_cluster_sizes(mlp, m) for m in TOKENS} }")  # fmt: skip


@pytest.mark.parametrize(
    "shape,tokens", [("dsv3-shared-tp8", 1), ("dsv3-shared-tp8", 8), ("dsv3-tp8", 8)]
)
def test_graph_of_k_split_layers_replays_like_eager(shape: str, tokens: int) -> None:
    """Captured K-split launches (clusters of the splits) replay like eager ones, with no
    workspace to reset between replays."""
    hidden, inter = SHAPES[shape]
    layers = [DenseMlp(**make_layer(hidden, inter, seed=700 + i), ue8m0=True) for i in range(3)]
    for mlp in layers:
        mlp.prepare([tokens])
    assert split_cluster_sizes(layers[0], tokens), "no K-split kernel at this token count"
    assert_chain_replays_like_eager(layers, tokens, seed=800)


def assert_chain_replays_like_eager(layers: list[DenseMlp], tokens: int, seed: int) -> None:
    """A CUDA graph of the layers called in a chain replays bit-identically to eager calls,
    three times, and again after its input changes."""

    def chain(x: torch.Tensor) -> torch.Tensor:
        for mlp in layers:
            x = mlp(x)
        return x

    static_x = make_x(tokens, layers[0].hidden, seed=seed)
    eager = chain(static_x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = chain(static_x)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(static_out).all()
        assert torch.equal(static_out, eager)
    static_x.copy_(make_x(tokens, layers[0].hidden, seed=seed + 1))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, chain(static_x))
    assert not torch.equal(static_out, eager)


@pytest.mark.parametrize("shape", list(STREAM_SHAPES))
def test_streamed_layers_repeat_bit_for_bit_on_two_streams(shape: str) -> None:
    """fp8_stream's cluster form has no workspace: its split tiles meet in the cluster's
    shared memory, so the layer gives the reference's result and the same bits on every
    call, also on two streams at once, with nothing kept or reset between calls."""
    hidden, inter = SHAPES[shape]
    mlp = DenseMlp(**layer(shape), ue8m0=True)
    mlp.prepare(STREAM_TOKENS)
    assert mlp._streamed == STREAMED[shape]
    want_act, want_out = reference_for(shape, True, None)
    for m in STREAM_TOKENS:
        x = _inputs[shape][:m]
        first = mlp(x)
        torch.cuda.synchronize()
        err = rel_l2(first, want_out[:m])
        assert torch.isfinite(first).all() and err < TOL, f"m={m}: rel L2 {err:.2e}"
        assert_repeats_on_two_streams(mlp, [x, make_x(m, hidden, seed=650 + m)], first, 10)
        print(f"[stream] {shape} m={m} {STREAMED[shape].get(m)} out_rel_l2={err:.2e}")


@pytest.mark.parametrize("shape", list(STREAM_SHAPES))
@pytest.mark.parametrize("tokens", STREAM_TOKENS)
def test_graph_of_streamed_layers_replays_like_eager(shape: str, tokens: int) -> None:
    """Captured layers with fp8_stream kernels replay like eager calls, with nothing reset
    between replays."""
    hidden, inter = SHAPES[shape]
    layers = [DenseMlp(**make_layer(hidden, inter, seed=900 + i), ue8m0=True) for i in range(2)]
    for mlp in layers:
        mlp.prepare([tokens])
    assert layers[0]._streamed.get(tokens, (False, False)) == STREAMED[shape].get(
        tokens, (False, False)
    )
    assert_chain_replays_like_eager(layers, tokens, seed=950)


def test_unprepared_token_count_during_capture_raises() -> None:
    hidden, _ = SHAPES[GRAPH_SHAPE]
    mlp = DenseMlp(**layer(GRAPH_SHAPE), ue8m0=True)
    mlp.prepare([1, 2])
    x = make_x(3, hidden, seed=500)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match=r"prepare\(tokens\)"), torch.cuda.graph(graph):
        mlp(x)
    assert "prepared=[1, 2]" in repr(mlp)  # nothing was compiled or loaded during capture


# ---- memory -----------------------------------------------------------------------------------


def _block(nbytes: int) -> int:
    """Bytes torch's caching allocator accounts for an allocation (512-byte granules)."""
    return -(-nbytes // 512) * 512


def test_memory_no_weight_copies_act_kept_out_per_call() -> None:
    """No weight copies; prepare makes one act buffer per token count (for its thread and
    stream), and then a call allocates only out (nothing with a caller's out)."""
    # Garbage of earlier tests (a failed test's traceback, say) freed mid-count would show as
    # negative allocations: collect it first and keep the collector off while counting.
    gc.collect()
    gc.disable()
    try:
        _count_memory_of_calls()
    finally:
        gc.enable()


def _count_memory_of_calls() -> None:
    hidden, inter = SHAPES["glm5-tp8"]
    w = make_layer(hidden, inter, seed=600)
    x = make_x(8, hidden, seed=601)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    mlp = DenseMlp(**w, ue8m0=True)
    assert torch.cuda.memory_allocated() == base, "construction allocated device memory"
    assert mlp.w13.data_ptr() == w["w13"].data_ptr() and mlp.w2.data_ptr() == w["w2"].data_ptr()
    # prepare keeps one act buffer per token count for this thread and stream, shared with
    # every other layer of this size (earlier tests may have made some already).
    device = torch.cuda.current_device()

    def key(m: int) -> tuple:
        return (device, threading.get_ident(), 0, m, inter)

    missing = [m for m in TOKENS if key(m) not in dense_mlp._KEPT_ACT]
    mlp.prepare(TOKENS)
    kept = sum(_block(m * inter * 2) for m in missing)
    assert torch.cuda.memory_allocated() - base == kept, "prepare: act buffers only"
    assert all(key(m) in dense_mlp._KEPT_ACT for m in TOKENS)
    for m in (1, 5, 8):
        xm = x[:m]
        out_b = _block(m * hidden * 2)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        out = mlp(xm)
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() - start == out_b
        assert torch.cuda.memory_allocated() - start == out_b
        del out
        given = torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        mlp(xm, out=given)
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() == start
        del given


def test_back_to_back_eager_calls_reusing_act() -> None:
    """Many calls in flight at once (no sync), alternating inputs, on the default stream and
    on a side stream at the same time: every output equals its input's forward_into."""
    mlp = mlp_for("glm5-tp8", True, None)
    hidden, inter = SHAPES["glm5-tp8"]
    xs = [make_x(4, hidden, seed=700 + i) for i in range(3)]
    want = []
    for x in xs:
        out = poisoned(4, hidden)
        mlp.forward_into(x, poisoned(4, inter), out)
        want.append(out)
    torch.cuda.synchronize()
    # mlp_for prepared on this thread's default stream: those calls reuse one kept act.
    device = torch.cuda.current_device()
    kept = dense_mlp._KEPT_ACT[(device, threading.get_ident(), 0, 4, inter)]
    assert mlp._act_buffers.get(xs[0], 4, torch.cuda.current_stream().cuda_stream) is kept
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # another stream: allocated
        assert mlp._act_buffers.get(xs[0], 4, side.cuda_stream) is not kept
    outs, side_outs = [], []
    for i in range(30):
        outs.append(mlp(xs[i % 3]))
        with torch.cuda.stream(side):
            side_outs.append(mlp(xs[(i + 1) % 3]))
    torch.cuda.synchronize()
    for i, (out, side_out) in enumerate(zip(outs, side_outs, strict=True)):
        assert torch.equal(out, want[i % 3]), i
        assert torch.equal(side_out, want[(i + 1) % 3]), i


def test_scale_forms_on_gpu() -> None:
    w = layer("glm4.5-tp8")
    exponent = torch.log2(w["w13_scale"]).round()
    pow2 = torch.exp2(exponent)
    e8m0 = (exponent + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    mlp = DenseMlp(w["w13"], e8m0, w["w2"], w["w2_scale"], ue8m0=True)
    assert mlp.w13_scale.device.type == "cuda"
    assert torch.equal(mlp.w13_scale, pow2)
    # the same exponents packed four per int32 along K (little-endian bytes)
    exps = (exponent + 127).to(torch.int64).cpu()
    n, kb = exps.shape
    padded = torch.zeros(n, -(-kb // 4) * 4, dtype=torch.int64)
    padded[:, :kb] = exps
    words = sum(padded[:, j::4] << (8 * j) for j in range(4))
    packed = ((words + 2**31) % 2**32 - 2**31).to(torch.int32).cuda()
    mlp2 = DenseMlp(w["w13"], packed, w["w2"], w["w2_scale"], ue8m0=True)
    assert torch.equal(mlp2.w13_scale, pow2)
