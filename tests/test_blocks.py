"""mlpjit/kernels/blocks.py: the FP8 block size and a weight's scale grid."""

from __future__ import annotations

from mlpjit.kernels.blocks import BLOCK, scale_shape


def test_block_is_the_128x128_recipe() -> None:
    assert BLOCK == 128


def test_scale_shape_is_one_scale_per_block() -> None:
    assert scale_shape(3072, 6144) == (24, 48)
    assert scale_shape(BLOCK, BLOCK) == (1, 1)
    assert scale_shape(200, 100) == (1, 0)  # rounded down: callers check the multiples
