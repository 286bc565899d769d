"""mlpjit/testing/layers.py helpers the benchmarks share, without a GPU (the shard shapes are
tested with the model presets, tests/test_models.py)."""

from __future__ import annotations

import types

import pytest
import torch

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
