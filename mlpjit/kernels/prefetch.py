"""L2 prefetch of the next kernel's weight, shared by the kernels that offer it.

A kernel built with ``prefetch_next`` takes the next kernel's weight (``next_bytes`` FP8
bytes) as one more pointer and, once its own weights are requested or consumed, asks for
the start of its CTA's equal share of those bytes to be brought into L2: HBM keeps
streaming while this kernel finishes and the next one's CTAs start, and their first copies
hit L2. Nothing waits for the prefetches and nothing lands in shared memory.

Imports cutlass: only kernel modules import this, inside compile functions.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from mlpjit.kernels import ptx
from mlpjit.kernels.checks import PREFETCH_ALIGN as ALIGN

__all__ = ["PIECE", "prefetch_share"]

PIECE = 4096  # bytes of one prefetch instruction; the lanes of a warp take pieces in turn


@cute.jit
def prefetch_share(
    g_next: Int64,
    cta: Int32,
    ctas: cutlass.Constexpr,
    next_bytes: cutlass.Constexpr,
    prefetch_bytes: cutlass.Constexpr,
    lane: Int32,
):
    """One warp: the first ``prefetch_bytes`` of CTA ``cta``'s share (one of ``ctas`` equal
    shares of ``next_bytes``, on 128-byte boundaries; the last CTA's runs to the end) into
    L2, PIECE bytes per lane in turn."""
    start = (Int64(cta) * next_bytes // ctas) & ~Int64(ALIGN - 1)
    stop = (Int64(cta + 1) * next_bytes // ctas) & ~Int64(ALIGN - 1)
    if cta == ctas - 1:
        stop = Int64(next_bytes)
    n = Int32(cutlass.min(stop - start, Int64(prefetch_bytes)))
    for off in cutlass.range(lane * PIECE, n, 32 * PIECE, unroll=1):
        ptx.cp_async_bulk_prefetch_l2(g_next + start + Int64(off), cutlass.min(n - off, PIECE))
