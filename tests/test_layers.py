"""mlpjit/testing/layers.py helpers the benchmarks share, without a GPU (the shard shapes are
tested with the model presets, tests/test_models.py)."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mlpjit.kernels.blocks import BLOCK
from mlpjit.testing import layers


def test_device_l2_bytes_falls_back_to_the_h200s(monkeypatch) -> None:
    props = types.SimpleNamespace(name="FakeGPU", L2_cache_size=50 << 20)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    assert layers.device_l2_bytes() == 50 << 20
    props.L2_cache_size = 0  # not reported
    assert layers.device_l2_bytes() == layers.L2_BYTES_H200


def test_weight_bytes_count_the_float32_block_scales() -> None:
    assert layers.weight_bytes(3072, 6144) == 3072 * 6144 + (3072 // BLOCK) * (6144 // BLOCK) * 4
    assert layers.layer_bytes(6144, 1536) == (
        layers.weight_bytes(3072, 6144) + layers.weight_bytes(6144, 1536)
    )


def test_random_weights_have_one_scale_per_block() -> None:
    gen = torch.Generator().manual_seed(0)
    w, s = layers.random_fp8_weight(256, 384, gen, scale=1.0)
    assert w.shape == (256, 384) and w.dtype == torch.float8_e4m3fn
    assert s.shape == (2, 3) and s.dtype == torch.float32


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("glm5-tp8", (6144, 1536)),
        ("h3072-i1152", (3072, 1152)),  # a grid shape
        ("h2560-i2304", (2560, 2304)),  # any multiples of 128
        ("h2560-i2300", None),  # 2300 is not a multiple of 128
        ("h0-i256", None),
        ("h02048-i256", None),
        ("h2048-i256 ", None),
        ("glm6-tp8", None),
    ],
)
def test_shape_by_name(name: str, shape: tuple[int, int] | None) -> None:
    assert layers.shape_by_name(name) == shape


def test_layer_shapes_name_every_unknown_shape() -> None:
    assert layers.layer_shapes(["glm5-tp8", "h2560-i2304"]) == {
        "glm5-tp8": (6144, 1536),
        "h2560-i2304": (2560, 2304),
    }
    with pytest.raises(ValueError, match=r"unknown \['nope', 'h2560-i2300'\]; known: glm5-tp8"):
        layers.layer_shapes(["glm5-tp8", "nope", "h2560-i2300"])


@given(count=st.integers(0, 12), rounds=st.integers(1, 6))
def test_round_order_times_every_variant_once_per_round_alternating(
    count: int, rounds: int
) -> None:
    order = layers.round_order(count, rounds)
    per_round = [order[r * count : (r + 1) * count] for r in range(rounds)]
    assert len(order) == count * rounds
    for r, seq in enumerate(per_round):
        assert seq == (list(range(count)) if r % 2 == 0 else list(range(count))[::-1])


@pytest.mark.parametrize(("count", "rounds"), [(-1, 2), (3, 0)])
def test_round_order_rejects_bad_counts(count: int, rounds: int) -> None:
    with pytest.raises(ValueError, match="rounds >= 1"):
        layers.round_order(count, rounds)


@given(
    count=st.integers(1, 8),
    start=st.floats(1.0, 10.0),
    drift=st.floats(0.01, 0.5),
    sign=st.sampled_from([-1.0, 1.0]),
)
def test_equal_variants_time_equal_under_a_linear_drift(
    count: int, start: float, drift: float, sign: float
) -> None:
    """Variants that cost the same come out the same in two alternating rounds however the
    GPU's speed drifts linearly over the run; in one round the first would look fastest
    (or slowest)."""
    calls = iter(range(10_000))

    def drifting_timer(fn) -> list[float]:
        t = start + sign * drift * next(calls)
        return [t, t, t]

    fns = [lambda: None] * count
    summaries = [layers.round_summary(r) for r in layers.times_in_rounds(fns, 2, drifting_timer)]
    us = [s["us"] for s in summaries]
    assert max(us) - min(us) <= 1e-9 * max(1.0, abs(max(us)))
    assert all(len(s["round_us"]) == 2 for s in summaries)
    calls = iter(range(10_000))
    one_round = [
        layers.round_summary(r)["us"] for r in layers.times_in_rounds(fns, 1, drifting_timer)
    ]
    if count > 1 and drift != 0:
        assert one_round[0] != one_round[-1]


def test_round_summary_scales_and_takes_the_mean_of_round_medians() -> None:
    summary = layers.round_summary([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0]], scale=10.0)
    assert summary["us"] == pytest.approx(30.0)  # medians 20 and 40
    assert summary["round_us"] == [20.0, 40.0]
    assert summary["p10_us"] == 10.0


def test_the_first_timings_of_a_run_are_discarded(monkeypatch) -> None:
    """A fresh GPU's first timings come out fast; they must not reach any variant, and
    only the process's first timings are discarded."""
    monkeypatch.setattr(layers, "_settled", False)
    calls = iter(range(100))

    def fast_start_timer(fn) -> list[float]:
        return [1.0 if next(calls) < layers.SETTLE_TIMINGS else 2.0]

    samples = layers.times_in_rounds([lambda: None] * 3, 2, fast_start_timer)
    assert [[t for r in v for t in r] for v in samples] == [[2.0, 2.0]] * 3
    assert layers.times_in_rounds([], 2, fast_start_timer) == []
    later = layers.times_in_rounds([lambda: None] * 2, 1, fast_start_timer)
    assert next(calls) == layers.SETTLE_TIMINGS + 6 + 2  # settled once, not again
    assert len(later) == 2


def test_norm_between_writes_x_in_place_and_keeps_its_values() -> None:
    x = torch.tensor([[1.5, -0.0, float("inf"), 3.0e38], [float("nan"), 2.0**-133, -7.0, 0.0]])
    x = x.to(torch.bfloat16)
    before, version, ptr = x.clone(), x._version, x.data_ptr()
    layers.norm_between(x)
    assert x._version == version + 1 and x.data_ptr() == ptr  # one kernel wrote x itself
    number = ~before.isnan()
    assert torch.equal(x[number].view(torch.int16), before[number].view(torch.int16))
    assert torch.equal(x.isnan(), before.isnan())  # a NaN stays one (its payload may not)


def test_between_layers_runs_a_norm_only_when_asked() -> None:
    x = torch.ones(2, 8, dtype=torch.bfloat16)
    version = x._version
    layers.between_layers(False)(x)
    assert x._version == version  # back to back: no kernel between the layers
    layers.between_layers(True)(x)
    assert x._version == version + 1


def test_norms_alone_runs_count_norms_on_x() -> None:
    x = torch.ones(2, 8, dtype=torch.bfloat16)
    version = x._version
    chain = layers.norms_alone(x, 3)
    assert x._version == version  # built, not run
    chain()
    assert x._version == version + 3 and torch.equal(x, torch.ones_like(x))
