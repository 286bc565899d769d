"""The tensor map of a weight's 128-K blocks without a GPU: its dimensions, strides and box
(what cuTensorMapEncodeTiled gets), and one-line refusals of what TMA cannot take."""

from __future__ import annotations

import pytest

from mlpjit.kernels.tensor_map import block_map_layout, weight_block_map


def test_layout_views_the_weight_as_blocks_of_rows_of_128_bytes() -> None:
    layout = block_map_layout(3072, 6144, 16, 16)
    assert layout["dims"] == [128, 3072, 48]  # innermost first: a block's row, rows, blocks
    assert layout["strides"] == [6144, 128]  # the next row, the next K block (bytes)
    assert layout["box"] == [128, 16, 16]  # 128 bytes (the swizzle span) x 16 rows x 16 blocks


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((3072, 6100, 16, 4), "k must be a multiple of 128, got 6100"),
        ((3072, 6144, 0, 4), r"box_rows must be an int in \[1, 256\], got 0"),
        ((3072, 6144, 16, 257), r"box_blocks must be an int in \[1, 256\], got 257"),
        ((8, 6144, 16, 4), r"the box \(16 rows x 4 blocks\) must fit the matrix \(8 rows"),
        ((3072, 256, 16, 4), r"must fit the matrix \(3072 rows x 2 blocks\)"),
        ((True, 6144, 16, 4), "rows must be an int"),
    ],
)
def test_layout_refuses_what_tma_cannot_take(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        block_map_layout(*args)


def test_weight_must_be_a_2d_byte_tensor() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="2-D tensor of 1-byte elements"):
        weight_block_map(torch.zeros(16, 128, dtype=torch.float32), 16, 1)
    with pytest.raises(ValueError, match="contiguous CUDA tensor"):
        weight_block_map(torch.zeros(16, 128, dtype=torch.uint8), 16, 1)
