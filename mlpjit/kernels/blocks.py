"""The FP8 block size: one home for the 128 that every kernel, loader and check shares.

Weights carry one scale per BLOCK x BLOCK block ([rows/BLOCK, k/BLOCK] of them) and
activations one per 1 x BLOCK group along K: DeepSeek-V3's recipe, what FP8 checkpoints,
transformers' FineGrainedFP8Config and the kernels all use. Plain Python importing nothing,
so the kernels' params, the scale converters, the checkpoint loader and DenseMlp read it
without importing torch or cutlass.
"""

from __future__ import annotations

__all__ = ["BLOCK", "scale_shape"]

BLOCK = 128


def scale_shape(rows: int, k: int) -> tuple[int, int]:
    """The block-scale grid of a weight [rows, k]: (rows / BLOCK, k / BLOCK), rounded down."""
    return (rows // BLOCK, k // BLOCK)
