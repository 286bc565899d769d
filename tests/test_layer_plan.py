"""The layer planner (mlpjit.layer_plan): token counts, which halves of a layer stream, the
options of a streamed half, and the requests of a dense-MLP shard."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlpjit import layer_plan, models
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv import params as gemv_params
from mlpjit.kernels.fp8_gemv import tuning
from mlpjit.kernels.fp8_stream import plan as stream_plan

ARCH = "sm_90a"


def test_layer_plan_imports_no_cutlass_or_torch() -> None:
    code = "import sys, mlpjit.layer_plan; print('cutlass' in sys.modules, 'torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False False"


def test_dense_mlp_requests_glm5_tp8() -> None:
    hidden, inter = models.MODELS["glm5"]
    reqs = layer_plan.dense_mlp_requests(hidden, inter, 8, range(1, 9), ARCH)
    assert len(reqs) == 16
    gate_up, down = reqs[0].params, reqs[1].params
    assert (gate_up["rows"], gate_up["k"], gate_up["swiglu"]) == (3072, 6144, True)
    assert (down["rows"], down["k"], down["swiglu"]) == (6144, 1536, False)
    assert [r.params["tokens"] for r in reqs] == [m for m in range(1, 9) for _ in (0, 1)]
    assert all(r.params["ue8m0"] is True and r.params["limit"] is None for r in reqs)


def test_dense_mlp_requests_skips_unsupported() -> None:
    # Token counts above 8 and a shard of more than SPREAD_MAX_WAVES waves take the stock
    # path; DeepSeek-V3's TP-8 shard (k = 2304) takes the kernels.
    assert layer_plan.dense_mlp_requests(6144, 12288, 8, [9, 16], ARCH) == []
    assert layer_plan.dense_mlp_requests(1024, 196608, 1, [1, 8], ARCH) == []
    assert len(layer_plan.dense_mlp_requests(7168, 18432, 8, [1], ARCH)) == 2
    reqs = layer_plan.dense_mlp_requests(5120, 12288, 8, 3, ARCH, ue8m0=False, limit=5.0)
    assert [r.params["limit"] for r in reqs] == [5.0, None]
    assert all(r.params["ue8m0"] is False for r in reqs)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((6144, 12288, 5, [1]), "tp must divide"),
        ((6144, 12288, 0, [1]), "tp must be"),
        ((6144, 12288, 8, [0]), "tokens must be"),
        ((-1, 12288, 8, [1]), "hidden must be"),
    ],
)
def test_dense_mlp_requests_errors(args, match) -> None:
    with pytest.raises(ValueError, match=match):
        layer_plan.dense_mlp_requests(*args, ARCH)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((gemv_params.MAX_HIDDEN + 128, 1024, 1), r"^hidden must be in \[1, 65536\]"),
        ((10**18, 128, 1), r"^hidden must be in \[1, 65536\], got 1000000000000000000$"),
        ((1024, gemv_params.MAX_INTERMEDIATE + 128, 1), r"^intermediate must be in"),
        ((1024, 1024, 10**40), r"^tp must be in \[1, 1024\]"),
    ],
)
def test_sizes_are_bounded_before_any_planning(args, match) -> None:
    """hidden 1e18 once searched divisors forever; every size has a documented maximum."""
    with pytest.raises(ValueError, match=match):
        layer_plan.dense_mlp_requests(*args, [1], ARCH)


def test_endless_token_lists_are_refused() -> None:
    import itertools

    with pytest.raises(ValueError, match=r"^tokens must be a finite iterable of at most 65536"):
        layer_plan.dense_mlp_requests(1024, 1024, 1, itertools.count(1), ARCH)


@pytest.mark.parametrize("sms", range(hopper.MIN_SMS, hopper.MIN_SMS + 8))
def test_few_sms_plan_without_dividing_by_zero(sms: int) -> None:
    """At 1-8 SMs no cluster of 4 or 8 K splits is resident: those configs are skipped
    (they were a ZeroDivisionError), not planned."""
    for r in layer_plan.dense_mlp_requests(1024, 1024, 1, range(1, 9), ARCH, sms=sms):
        assert r.params["sms"] == sms


def test_shard_requests_are_planned_once_per_shape(monkeypatch) -> None:
    """Many layers of one shape (a model's shared experts) plan once per process; each call
    still gets its own list."""
    calls = []
    real = layer_plan.kernel_supports

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(layer_plan, "kernel_supports", counting)
    layer_plan._shard_requests.cache_clear()
    first = layer_plan.dense_mlp_requests(6144, 2048, 8, range(1, 9), "sm_90a")
    planned = len(calls)
    second = layer_plan.dense_mlp_requests(6144, 2048, 8, range(1, 9), "sm_90a")
    assert planned > 0 and len(calls) == planned
    assert first == second and first is not second
    first.clear()
    assert layer_plan.dense_mlp_requests(6144, 2048, 8, range(1, 9), "sm_90a") == second
    with pytest.raises(ValueError, match="ue8m0 must be a bool"):
        layer_plan.dense_mlp_requests(6144, 2048, 8, [1], "sm_90a", ue8m0=[True])


# ---- the halves on fp8_stream's cluster form -----------------------------------------------


def _halves_code(hidden: int, inter: int) -> str:
    """stream_halves at 1-8 tokens: '-' fp8_gemv, 'g' / 'd' that half on fp8_stream."""
    codes = []
    for m in range(1, 9):
        gate_up, down = layer_plan.stream_halves(hidden, inter, m)
        codes.append(("g" if gate_up else "-") + ("d" if down else "-"))
    return " ".join(codes)


def test_stream_halves_pins_the_shards_that_stream() -> None:
    from mlpjit.testing.layers import DENSE_SHAPES, GRID_SHAPES

    shapes = {**DENSE_SHAPES, **GRID_SHAPES}
    both = " ".join(["gd"] * 8)
    down = " ".join(["-d"] * 8)
    taken = {name: _halves_code(*shape) for name, shape in shapes.items()}
    taken = {name: code for name, code in taken.items() if code != " ".join(["--"] * 8)}
    from_six = " ".join(["--"] * 5 + ["gd"] * 3)
    assert taken == {
        **{name: from_six for name in ("h2048-i2816", "h3072-i1920", "h4096-i1920")},
        **{name: down for name in ("qwen3-8b-tp1", "qwen3-14b-tp1", "qwen3-14b-tp2",
                                   "h6144-i4864", "h7168-i4864", "h8192-i4864")},
        **{name: both for name in (
            "glm5-shared-tp1", "qwen3-8b-tp4", "qwen3-14b-tp4", "qwen3-32b-tp8",
            "deepseek-v3-shared-tp1", "h2048-i4864", "h3072-i2816",
            "h3072-i4864", "h4096-i2816", "h4096-i4864", "h6144-i1920", "h6144-i2816",
            "h7168-i1920", "h7168-i2816", "h8192-i1920", "h8192-i2816")},
    }  # fmt: skip
    # the benchmark's other shapes keep fp8_gemv: their measured (table) picks beat the stream
    for name in ("glm5-tp8", "glm4.5-tp8", "deepseek-v3-tp8", "glm5-tp4", "glm5-tp1",
                 "deepseek-v3-shared-tp8"):  # fmt: skip
        assert name not in taken


def test_stream_halves_follow_size_evenness_waves_and_the_table() -> None:
    # several waves of fp8_gemv CTAs for the down projection: it streams, gate_up does not
    assert tuning.planned_waves(6144, 4864, 1, False) > 1
    assert layer_plan.stream_halves(6144, 4864, 1) == (False, True)
    # 24-70 MiB with tiles that deal evenly: both; 1152-wide shards (144 gate_up tiles) do not
    assert layer_plan.stream_halves(3072, 2816, 4) == (True, True)
    assert stream_plan.imbalance(2 * 2816, 3072) <= layer_plan.STREAM_MAX_IMBALANCE
    assert stream_plan.imbalance(2 * 1152, 8192) > layer_plan.STREAM_MAX_IMBALANCE
    assert layer_plan.stream_halves(8192, 1152, 4) == (False, False)
    # 12-24 MiB: from 6 tokens where the down projection has 13 K blocks or more
    assert layer_plan.STREAM_MID_MIN_BYTES <= 3 * 3072 * 1920 < layer_plan.STREAM_MIN_BYTES
    assert [layer_plan.stream_halves(3072, 1920, m) for m in (5, 6, 8)] == [
        (False, False),
        (True, True),
        (True, True),
    ]
    assert layer_plan.stream_halves(4096, 1664, 6) == (True, True)  # 13 blocks
    assert layer_plan.stream_halves(4096, 1536, 8) == (False, False)  # 12 blocks
    assert layer_plan.stream_halves(2048, 1920, 8) == (False, False)  # 11.25 MiB
    # size bounds: GLM-5's TP-2 shared expert is 18.9 MB; Qwen3-8B TP 2 (75.5 MB) past the max
    assert layer_plan.STREAM_MIN_BYTES > 3 * 6144 * 1024
    assert layer_plan.stream_halves(6144, 1024, 1) == (False, False)
    assert layer_plan.STREAM_MAX_BYTES < 3 * 4096 * 6144
    assert layer_plan.stream_halves(4096, 6144, 1) == (False, False)
    # a measured table pick for either half keeps fp8_gemv (GLM-5 TP 4: 57 MB)
    assert tuning.tuned(6144, 6144, 1, True) is not None
    assert layer_plan.STREAM_MIN_BYTES <= 3 * 6144 * 3072 <= layer_plan.STREAM_MAX_BYTES
    assert layer_plan.stream_halves(6144, 3072, 1) == (False, False)
    # other GPUs have no table: the rule alone
    assert layer_plan.stream_halves(6144, 3072, 1, sms=114)[1] in (True, False)
    # x of 8 tokens at k 17408 leaves no room for stages of two blocks per warp: one block
    stream = stream_plan.stream_params(5120, 17408, 8, swiglu=False, limit=None, ue8m0=True)
    assert stream.blocks_per_warp == 1 and stream.stages >= stream_plan.MIN_STAGES
    assert stream.cluster == stream_plan.choose_cluster(5120, 17408) >= 1
    assert layer_plan.stream_halves(5120, 17408, 8) == (False, True)
    at_7 = stream_plan.stream_params(5120, 17408, 7, swiglu=False, limit=None, ue8m0=True)
    assert at_7.blocks_per_warp == stream_plan.DEFAULT_BLOCKS_PER_WARP
    # ... and nothing fits at a k whose x alone fills shared memory
    assert not stream_plan.fits(5120, 65536, 8)
    with pytest.raises(ValueError, match="cannot hold x"):
        stream_plan.stream_params(5120, 65536, 8, swiglu=False, limit=None, ue8m0=True)
    # one wave (a persistent grid) keeps fp8_gemv's down, whatever the size or the K
    assert tuning.planned_waves(5120, 6400, 8, False) == 1
    assert layer_plan.stream_halves(5120, 6400, 8)[1] is (3 * 5120 * 6400 <= (70 << 20))


def test_streamed_halves_request_the_cluster_form() -> None:
    from mlpjit.kernels.fp8_stream.params import StreamParams

    requests = layer_plan.dense_mlp_requests(3072, 2816, 1, [1, 8], ARCH)
    assert [(r.kernel, r.params["tokens"], r.params["swiglu"]) for r in requests] == [
        ("fp8_stream", 1, True), ("fp8_stream", 1, False),
        ("fp8_stream", 8, True), ("fp8_stream", 8, False),
    ]  # fmt: skip
    for r in requests:
        stream = StreamParams(**r.params)
        assert stream.cluster >= 1 and not stream.trace  # no workspace read or written
    down_only = layer_plan.dense_mlp_requests(6144, 4864, 1, [1, 8], ARCH)
    assert [r.kernel for r in down_only] == ["fp8_gemv", "fp8_stream"] * 2
    assert not any(r.params.get("share_x") for r in down_only)
    # every other layer: fp8_gemv kernels
    for r in layer_plan.dense_mlp_requests(6144, 1536, 1, range(1, 9), ARCH):
        assert r.kernel == "fp8_gemv"


def test_streamed_layers_share_x_from_six_tokens() -> None:
    from mlpjit.kernels.fp8_stream.params import StreamParams

    counts = range(1, 9)
    for hidden, inter in ((3072, 2816), (6144, 2816), (7168, 2048)):
        requests = layer_plan.dense_mlp_requests(hidden, inter, 1, counts, ARCH)
        assert len(requests) == 2 * len(counts)
        for r in requests:
            stream = StreamParams(**r.params)
            shared = stream.tokens >= layer_plan.SHARE_X_MIN_TOKENS
            assert stream.share_x is shared
            if shared:
                assert stream.cluster >= 2 and stream.stages <= layer_plan.SHARE_X_MAX_STAGES
                assert stream.x_blocks_max == stream.kblocks
            else:  # the planner's cluster size (1 for this gate_up) and deepest ring
                assert stream.cluster == stream_plan.choose_cluster(stream.rows, stream.k)
    # a half streamed alone, or a size that does not fit, keeps the planner's defaults
    assert layer_plan.layer_stream_options(6144, 4864, 8, False) == {}
    assert layer_plan.layer_stream_options(5632, 6144, 5, True) == {}
    assert layer_plan.layer_stream_options(5120, 65536, 8, True) == {}
    assert layer_plan.layer_stream_options(5632, 6144, 6, True) == {
        "cluster": 2, "share_x": True, "stages": 3,
    }  # fmt: skip


def test_shared_x_layers_take_the_stage_shape() -> None:
    """h3072-i1920 at 8 tokens: its 15-block down in stages of 15 warps x 1 block, x shared,
    at most SHARE_X_MAX_STAGES stages."""
    gate_up, down = layer_plan.dense_mlp_requests(3072, 1920, 1, [8], "sm_90a")
    assert gate_up.kernel == down.kernel == "fp8_stream"
    assert down.params["warps"] == 15 and down.params.get("blocks_per_warp", 1) == 1
    assert down.params["share_x"] and down.params["stages"] <= layer_plan.SHARE_X_MAX_STAGES
    assert gate_up.params["warps"] == 8 and gate_up.params["blocks_per_warp"] == 2
