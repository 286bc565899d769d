"""Weight-scale forms: float32, float8_e8m0fnu and packed UE8M0 int32 give the same float32."""

from __future__ import annotations

import pytest
import torch

from mlpjit.kernels.blocks import scale_shape
from mlpjit.scales import to_float32_scale


def _exponents(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random UE8M0 exponent bytes [rows/128, k/128] around 2^0 (bias 127)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(100, 140, scale_shape(rows, k), generator=gen, dtype=torch.int32)


def _pack(exponents: torch.Tensor) -> torch.Tensor:
    """Pack exponent bytes four per int32 along K, little-endian (byte j = block 4i+j)."""
    n, kb = exponents.shape
    cols = -(-kb // 4)
    padded = torch.zeros(n, cols * 4, dtype=torch.int64)
    padded[:, :kb] = exponents.to(torch.int64)
    words = sum(padded[:, j::4] << (8 * j) for j in range(4))
    # Exponents >= 128 in byte 3 set the sign bit: wrap to int32 like a checkpoint would.
    return ((words + 2**31) % 2**32 - 2**31).to(torch.int32)


def _float32(exponents: torch.Tensor) -> torch.Tensor:
    return torch.pow(2.0, exponents.to(torch.float64) - 127).to(torch.float32)


def test_float32_contiguous_is_returned_without_copy() -> None:
    scale = torch.rand(4, 6) + 0.5
    out = to_float32_scale(scale, 512, 768)
    assert out.data_ptr() == scale.data_ptr()
    assert out.dtype == torch.float32 and out.shape == (4, 6)


def test_float32_noncontiguous_becomes_contiguous() -> None:
    scale = (torch.rand(6, 4) + 0.5).t()
    out = to_float32_scale(scale, 512, 768)
    assert out.is_contiguous()
    torch.testing.assert_close(out, scale, rtol=0, atol=0)


@pytest.mark.parametrize("rows,k", [(512, 768), (256, 1024), (128, 128), (384, 2304)])
def test_e8m0_matches_float32(rows: int, k: int) -> None:
    exps = _exponents(rows, k)
    e8m0 = exps.to(torch.uint8).view(torch.float8_e8m0fnu)
    out = to_float32_scale(e8m0, rows, k)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _float32(exps), rtol=0, atol=0)


@pytest.mark.parametrize("rows,k", [(512, 768), (256, 1024), (128, 128), (384, 2304)])
def test_packed_int32_matches_float32(rows: int, k: int) -> None:
    exps = _exponents(rows, k, seed=1)
    # Force high exponents into byte 3 so a negative int32 word is exercised.
    exps[:, 3::4] = 139
    packed = _pack(exps)
    assert packed.shape == (rows // 128, -(-(k // 128) // 4))
    out = to_float32_scale(packed, rows, k)
    torch.testing.assert_close(out, _float32(exps), rtol=0, atol=0)


def test_packed_byte_order_is_little_endian() -> None:
    # Word 0x80_7F_7E_7D: block 0 = 0x7D (2^-2), 1 = 0x7E (2^-1), 2 = 0x7F (1), 3 = 0x80 (2).
    word = torch.tensor([[0x807F7E7D - 2**32]], dtype=torch.int32)
    out = to_float32_scale(word, 128, 512)
    assert out.tolist() == [[0.25, 0.5, 1.0, 2.0]]


@pytest.mark.parametrize(
    "scale",
    [
        torch.ones(4, 5),  # wrong K blocks
        torch.ones(3, 6),  # wrong N blocks
        torch.ones(4, 6, dtype=torch.float64),  # wrong dtype
        torch.ones(4, 6, dtype=torch.bfloat16),
        torch.ones(4, 6, dtype=torch.int32),  # int32 must be packed [4, 2]
        torch.ones(24, dtype=torch.float32),  # wrong rank
    ],
)
def test_bad_forms_raise_naming_the_argument(scale: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"w13_scale must be .*\[4, 6\].*int32 \[4, 2\]"):
        to_float32_scale(scale, 512, 768, name="w13_scale")


def test_not_a_tensor_and_bad_weight_shape() -> None:
    with pytest.raises(ValueError, match="w2_scale must be a torch.Tensor"):
        to_float32_scale([[1.0]], 128, 128, name="w2_scale")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple of 128"):
        to_float32_scale(torch.ones(1, 1), 128, 100)


# ---- scale values: finite and >= 0, checked once at conversion -----------------------------------


def test_bad_float32_values_are_counted_and_located() -> None:
    scale = torch.ones(4, 6)
    scale[1, 2] = float("nan")
    scale[3, 0] = float("nan")
    scale[2, 5] = -0.5
    scale[3, 3] = float("inf")
    message = (
        r"^w13_scale has 2 NaN, 1 \+inf, 1 negative values; first at block \[1, 2\] \(nan\); "
        r"block scales must be finite and >= 0"
    )
    with pytest.raises(ValueError, match=message):
        to_float32_scale(scale, 512, 768, name="w13_scale")


@pytest.mark.parametrize(
    "bad,found",
    [
        (float("-inf"), r"1 -inf value; first at block \[2, 4\] \(-inf\)"),
        (-1e-30, r"1 negative value; first at block \[2, 4\] \(-1e-30\)"),
        (float("nan"), r"1 NaN value; first at block \[2, 4\] \(nan\)"),
    ],
)
def test_each_kind_of_bad_float32_value(bad: float, found: str) -> None:
    scale = torch.ones(4, 6)
    scale[2, 4] = bad
    with pytest.raises(ValueError, match=rf"^w2_scale has {found}; .*finite and >= 0"):
        to_float32_scale(scale, 512, 768, name="w2_scale")


def test_e8m0_nan_code_is_named() -> None:
    exps = _exponents(512, 768).to(torch.uint8)
    exps[3, 1] = 0xFF
    exps[0, 5] = 0xFF
    message = (
        r"^w13_scale has 2 NaN values \(the float8_e8m0fnu NaN code 0xFF\); "
        r"first at block \[0, 5\] \(nan\); block scales must be UE8M0 exponent bytes 0x00..0xFE"
    )
    with pytest.raises(ValueError, match=message):
        to_float32_scale(exps.view(torch.float8_e8m0fnu), 512, 768, name="w13_scale")


def test_packed_nan_byte_is_named_with_its_word() -> None:
    exps = _exponents(384, 2304, seed=2)  # 18 K blocks: 5 words per row, the last padded
    exps[2, 13] = 0xFF  # word 3, byte 1
    message = (
        r"^w2_scale has 1 NaN value \(the UE8M0 exponent byte 0xFF: the float8_e8m0fnu NaN "
        r"code\); first at block \[2, 13\] \(nan\), byte 1 of int32 word \[2, 3\]; "
        r"block scales must be UE8M0 exponent bytes 0x00..0xFE"
    )
    with pytest.raises(ValueError, match=message):
        to_float32_scale(_pack(exps), 384, 2304, name="w2_scale")


def test_packed_padding_bytes_are_not_scales() -> None:
    """Bytes past the last K block of a row are padding: 0xFF there is not a NaN scale."""
    exps = _exponents(128, 768)  # 6 K blocks: word 1 holds blocks 4, 5 and 2 padding bytes
    packed = _pack(exps)
    packed[:, 1] |= torch.tensor(0xFFFF << 16).to(torch.int32)  # wraps to a negative int32
    torch.testing.assert_close(to_float32_scale(packed, 128, 768), _float32(exps), rtol=0, atol=0)


def test_zero_and_extreme_scales_are_allowed() -> None:
    """0 is legal (an all-zero weight block whose quantizer had no amax floor), as are the
    smallest and largest UE8M0 codes (0x00 = 2^-127, 0xFE = 2^127) and -0.0."""
    scale = torch.ones(4, 6)
    scale[0, 0] = 0.0
    scale[1, 1] = -0.0
    scale[2, 2] = torch.finfo(torch.float32).max
    assert to_float32_scale(scale, 512, 768).data_ptr() == scale.data_ptr()
    exps = torch.tensor([[0x00, 0xFE, 0x7F]], dtype=torch.uint8)
    out = to_float32_scale(exps.view(torch.float8_e8m0fnu), 128, 384)
    assert out.tolist() == [[2.0**-127, 2.0**127, 1.0]]


def test_meta_scales_are_not_value_checked() -> None:
    """Meta tensors hold no values (planning without memory): shape checks only."""
    out = to_float32_scale(torch.empty(4, 6, device="meta"), 512, 768)
    assert out.device.type == "meta" and out.shape == (4, 6)


@pytest.mark.parametrize("rows,k", [(0, 768), (512, 0), (0, 0), (-128, 128)])
def test_empty_weight_shapes_raise(rows: int, k: int) -> None:
    with pytest.raises(ValueError, match=rf"w2_scale: the weight shape \[{rows}, {k}\] must be "):
        to_float32_scale(torch.ones(0, 6), rows, k, name="w2_scale")


def test_no_value_check_during_graph_capture(monkeypatch) -> None:
    """The check's host sync would invalidate a CUDA graph capture: skipped there."""
    import mlpjit.scales as scales

    monkeypatch.setattr(scales, "_capturing", lambda scale: True)
    nan = torch.full((4, 6), float("nan"))
    assert to_float32_scale(nan, 512, 768).data_ptr() == nan.data_ptr()
