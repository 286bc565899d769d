"""TMA tensor maps that copy a weight matrix's 128-K blocks into wgmma's 128-byte swizzle.

A kernel that takes its A operand (the weights) by a wgmma shared-memory descriptor needs
the weights in shared memory in wgmma's canonical K-major layout, which a plain bulk copy
of contiguous bytes cannot produce; a TMA tensor copy can. The map here views an e4m3
weight ``[rows, k]`` as three dimensions, innermost first: the 128 bytes of a K block, the
rows, the K blocks. A box of (128, ``box_rows``, ``box_blocks``) then lands in shared memory
block by block, each block ``box_rows`` rows of 128 bytes with the 128-byte swizzle (the
16-byte chunks of row r XOR-permuted by r mod 8 within each 1 KB atom), so ``box_rows``
16-row blocks side by side are one (16 x blocks) x 128 A operand whose 8-row groups are
1 KB apart (docs/KERNEL_NOTES.md, the wgmma sections).

Host side only: the map is made by the CUDA driver (cuTensorMapEncodeTiled, through
cuda-python) and handed to kernels as a 128-byte device buffer they read by pointer.
"""

from __future__ import annotations

import struct
from typing import Any

from mlpjit.kernels.blocks import BLOCK

__all__ = ["MAP_BYTES", "SWIZZLE_BYTES", "block_map_layout", "weight_block_map"]

MAP_BYTES = 128  # a CUtensorMap
SWIZZLE_BYTES = 128  # the swizzle span: one K block's row
MAX_BOX = 256  # TMA's limit on each box dimension


def block_map_layout(rows: int, k: int, box_rows: int, box_blocks: int) -> dict[str, list[int]]:
    """The map's dimensions, byte strides (of every dimension but the innermost) and box,
    innermost first; ValueError naming the argument when TMA cannot take them."""
    for name, value, high in (
        ("rows", rows, 1 << 31),
        ("k", k, 1 << 31),
        ("box_rows", box_rows, MAX_BOX),
        ("box_blocks", box_blocks, MAX_BOX),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise ValueError(f"{name} must be an int in [1, {high}], got {value!r}")
    if k % BLOCK:
        raise ValueError(f"k must be a multiple of {BLOCK}, got {k}")
    if box_rows > rows or box_blocks > k // BLOCK:
        raise ValueError(
            f"the box ({box_rows} rows x {box_blocks} blocks) must fit the matrix ({rows} rows "
            f"x {k // BLOCK} blocks)"
        )
    return {
        "dims": [BLOCK, rows, k // BLOCK],
        "strides": [k, BLOCK],
        "box": [SWIZZLE_BYTES, box_rows, box_blocks],
    }


def weight_block_map(weight: Any, box_rows: int, box_blocks: int) -> Any:
    """The tensor map of a row-major e4m3 (or uint8) CUDA tensor ``weight`` [rows, k], as a
    128-byte uint8 tensor on its device (64-byte aligned, as TMA requires)."""
    import torch

    from mlpjit.jit.launcher import check_cuda, cuda_driver

    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.element_size() != 1:
        raise ValueError("weight must be a 2-D tensor of 1-byte elements (e4m3 or uint8)")
    if not weight.is_cuda or not weight.is_contiguous() or weight.data_ptr() % 16:
        raise ValueError("weight must be a contiguous CUDA tensor, 16-byte aligned")
    rows, k = weight.shape
    layout = block_map_layout(rows, k, box_rows, box_blocks)
    d = cuda_driver()
    u64, u32 = d.cuuint64_t, d.cuuint32_t
    (tensor_map,) = check_cuda(
        d,
        d.cuTensorMapEncodeTiled(
            d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8,
            3,
            weight.data_ptr(),
            [u64(v) for v in layout["dims"]],
            [u64(v) for v in layout["strides"]],
            [u32(v) for v in layout["box"]],
            [u32(1)] * 3,
            d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ),
        "cuTensorMapEncodeTiled",
    )
    raw = struct.pack("<16Q", *(int(word) for word in tensor_map.opaque))
    host = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    out = torch.empty(MAP_BYTES, dtype=torch.uint8, device=weight.device)
    if out.data_ptr() % 64:
        raise ValueError("the tensor map's buffer is not 64-byte aligned")
    return out.copy_(host)
