"""wgmma's shared-memory matrix descriptors (sm_90a), for the two K-major layouts mlpjit's
kernels hand it: the no-swizzle core-matrix layout (x, a probe's B) and the 128-byte
swizzle a TMA copy writes (the weights).

A descriptor is 64 bits: the start address / 16 (bits 0-13), the leading-byte offset / 16
(16-29), the stride-byte offset / 16 (32-45), the layout type (62-63: 0 no swizzle, 1 the
128-byte swizzle). The host functions give the fields; a kernel ORs its start address in
with :func:`device_descriptor`. Plain Python at import (no cutlass).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CORE",
    "SWIZZLE_ATOM",
    "core_matrix_descriptor",
    "device_descriptor",
    "swizzled_descriptor",
]

CORE = 128  # a core matrix: 8 rows x 16 bytes
SWIZZLE_ATOM = 1024  # 8 rows x 128 bytes: the 128-byte swizzle's period


def _start(smem_address: int) -> int:
    return (smem_address >> 4) & 0x3FFF


def core_matrix_descriptor(smem_address: int, group_bytes: int, k_pitch: int = CORE) -> int:
    """No swizzle, K-major: a 32-K step is two core matrices (K bytes 0-15, 16-31)
    ``k_pitch`` bytes apart (the leading-byte offset; any multiple of 16 from CORE on), and
    the next 8 rows start ``group_bytes`` on (the stride-byte offset)."""
    return _start(smem_address) | ((k_pitch >> 4) << 16) | ((group_bytes >> 4) << 32)


def swizzled_descriptor(smem_address: int) -> int:
    """The 128-byte swizzle, K-major: rows of 128 bytes in 1 KB atoms of 8 rows, the next 8
    rows an atom on (the stride-byte offset); a 32-K step starts 32 bytes into its rows
    (``smem_address`` includes that); the leading-byte offset is unused (16)."""
    return _start(smem_address) | (1 << 16) | ((SWIZZLE_ATOM >> 4) << 32) | (1 << 62)


def device_descriptor(smem_address: Any, fields: int) -> Any:
    """In a kernel: the descriptor of the shared-memory address ``smem_address`` (an Int32)
    with the other ``fields`` of a host descriptor of address 0."""
    from cutlass import Int64

    return Int64((smem_address >> 4) & 0x3FFF) | Int64(fields)
