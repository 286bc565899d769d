"""Weight block scales in the forms checkpoints carry them, converted once to float32.

The kernels and the stock path read float32 [N/128, K/128] (one scale per 128x128 weight
block). Checkpoints may instead store UE8M0 exponents (DeepGEMM-style, power-of-two scales):
as torch.float8_e8m0fnu [N/128, K/128], or as exponent bytes packed four per int32 along K
([N/128, ceil(K/128/4)], byte j of word i = exponent of block 4i+j, little-endian).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["BLOCK", "scale_shape", "to_float32_scale"]

BLOCK = 128  # weight rows and columns per scale


def scale_shape(rows: int, k: int) -> tuple[int, int]:
    """The float32 block-scale shape of a weight [rows, k]."""
    return (rows // BLOCK, k // BLOCK)


def _unpack_ue8m0(packed: Tensor, blocks: int) -> Tensor:
    """int32 [R, ceil(blocks/4)] of packed exponent bytes -> uint8 [R, blocks].

    Shifts instead of a byte view, so the result does not depend on the host's byte order.
    """
    words = packed.to(torch.int64)
    parts = [(words >> (8 * j)) & 0xFF for j in range(4)]
    exponents = torch.stack(parts, dim=-1).reshape(packed.shape[0], -1)
    return exponents[:, :blocks].to(torch.uint8)


def to_float32_scale(scale: Tensor, rows: int, k: int, *, name: str = "w_scale") -> Tensor:
    """Return float32 [rows/128, k/128] block scales for a weight [rows, k], converting once.

    Accepts float32 [rows/128, k/128] (returned as is when contiguous: no copy),
    torch.float8_e8m0fnu [rows/128, k/128], or int32 [rows/128, ceil(k/128/4)] packed UE8M0.
    The result lives on ``scale``'s device. Raises ValueError naming ``name`` otherwise.
    """
    if not isinstance(scale, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(scale).__name__}")
    if rows % BLOCK or k % BLOCK:
        raise ValueError(
            f"{name}: the weight shape [{rows}, {k}] must be a multiple of {BLOCK} in both dims"
        )
    n_blocks, k_blocks = scale_shape(rows, k)
    packed_cols = -(-k_blocks // 4)
    expected = (
        f"float32 or float8_e8m0fnu [{n_blocks}, {k_blocks}], "
        f"or int32 [{n_blocks}, {packed_cols}] (UE8M0 bytes packed four per int32 along K)"
    )
    shape = tuple(scale.shape)
    if scale.dtype == torch.float32 and shape == (n_blocks, k_blocks):
        return scale.contiguous()
    if scale.dtype == torch.float8_e8m0fnu and shape == (n_blocks, k_blocks):
        return scale.to(torch.float32).contiguous()
    if scale.dtype == torch.int32 and shape == (n_blocks, packed_cols):
        exponents = _unpack_ue8m0(scale, k_blocks)
        return exponents.view(torch.float8_e8m0fnu).to(torch.float32).contiguous()
    raise ValueError(f"{name} must be {expected}; got {scale.dtype} {list(shape)}")
