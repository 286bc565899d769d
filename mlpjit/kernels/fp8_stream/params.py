"""fp8_stream's compile parameters: one frozen dataclass, its validation and its geometry.

Plain Python (no cutlass, no torch). The work is the layer's 128-K blocks of 16-row tiles,
taken in tile-major order and cut into one contiguous range per CTA (stream-K): every
CTA of the one resident wave gets the same number of blocks, whatever the number of row
tiles or K blocks, so the speed follows from the bytes. With ``cluster`` the row tiles are
first dealt to thread block clusters (whole tiles, as evenly as they go) and cut into equal
ranges inside each cluster only, so a split tile is reduced in distributed shared memory
instead of a global workspace. kernel.py describes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlpjit.kernels import hopper
from mlpjit.kernels.blocks import BLOCK
from mlpjit.kernels.checks import check_bool, check_int
from mlpjit.kernels.fp8_gemv.params import MAX_K, MAX_ROWS, check_limit
from mlpjit.kernels.wgmma_desc import CORE, SWIZZLE_ATOM

__all__ = [
    "ABLATIONS",
    "BLOCK",
    "CLUSTER_SIZES",
    "KERNEL_ARGS",
    "MAX_WARPS",
    "MAX_TOKENS",
    "ROW_PAD",
    "StreamParams",
    "TMA_KERNEL_ARGS",
    "WARPGROUP",
    "X_BLOCK_BYTES",
    "X_CORE",
    "X_STEP_BYTES",
    "workspace_bytes",
]

TILE_ROWS = 16  # A rows of one m16n8k32 mma (SwiGLU: 8 gate rows and their 8 up rows)
MAX_TOKENS = 8  # the mma's N
# Shared-memory rows (weights and quantized x) are padded by half a bank line, so the 16-byte
# fragment loads of rows r and r+1 fall in different bank halves.
ROW_PAD = 64
SLOT_BYTES = 32 * 16  # one tile's fp32 partial sums: 32 lanes x 4 floats
# Tile partials the consumers may hand the epilogue warp before it has taken the oldest.
PARTIAL_BUFFERS = 4
# x loads one thread keeps in flight before quantizing (8 registers each).
X_PASSES_MAX = 12
# Consumer warps per CTA (with the producer and epilogue warps, 18 of the 32 a CTA may have).
MAX_WARPS = 16
# Timestamps per CTA of a ``trace`` build (a developer aid: where a launch spends its time),
# and last, the SM the CTA ran on.
TRACE_POINTS = 9
# The kernel's parameters, in order (device pointers): output, input, weight, scales, and
# the layer's workspace (split partials and arrival counters, zero at first use).
KERNEL_ARGS = ("out", "x", "w", "w_scale", "workspace")
# ``cluster``: 0 splits tiles anywhere in the grid (reduced through the workspace); 1, 2, 4
# or 8 deal whole tiles to clusters of that many CTAs and split them only inside a cluster
# (1: no split tile at all), so the workspace holds nothing but a trace build's stamps.
CLUSTER_SIZES = (0, 1, 2, 4, 8)
# ``ablate`` (a developer aid: what a part of the work costs): "x" leaves x unread and its
# quantized copy unwritten (the sums use whatever shared memory holds), "mma" leaves out
# the consumers' fragment loads, unpacking and mmas (every block sums to zero), "x+mma"
# both. The output is wrong by design; the bytes streamed and the pipeline stay as they are.
ABLATIONS = ("", "x", "mma", "x+mma")
# The mbarriers that count a split tile's partials and (share_x) x's chunks from the cluster
MBARRIER_BYTES = 16
# ``tma``: the weights reach shared memory by TMA tensor copies (a 16-row block of 128 K per
# copy, two of 8 rows with SwiGLU) in wgmma's 128-byte swizzle, block after block, so four
# consecutive blocks of a stage are one 64 x 128 A operand of wgmma by descriptor. The four
# warps of a warpgroup take four consecutive blocks, and one wgmma.m64n32k32 per 32 K
# multiplies their 64 rows by those blocks' x side by side (B's 32 rows: 8 tokens x 4
# blocks); each warp keeps the 8 columns of its own block. x lives in shared memory in
# wgmma's no-swizzle K-major layout: per K block, 4 steps of 32 K, each two core matrices
# (K bytes 0-15 and 16-31 of the step) of 8 tokens x 16 bytes. Core matrices start X_CORE
# apart, 16 bytes more than their size, so the 8 chunks of one token's 128 values (the 8
# lanes of a quarter warp's store) fall in 8 different bank groups. The kernel takes the
# weight's tensor map (mlpjit.kernels.tensor_map.weight_block_map(w, tma_box_rows, 1)) as a
# sixth pointer.
TMA_KERNEL_ARGS = (*KERNEL_ARGS, "w_map")
WARPGROUP = 4  # warps of a warpgroup: K blocks side by side in one wgmma
X_CORE = CORE + 16  # from one core matrix (8 tokens x 16 bytes) of x to the next
X_STEP_BYTES = 2 * X_CORE  # one 32-K step of x (its two K halves)
X_BLOCK_BYTES = 4 * X_STEP_BYTES  # one 128-K block of x for 8 tokens
TMA_BLOCK_BYTES = TILE_ROWS * BLOCK  # one block of the ring: 16 swizzled rows of 128 bytes


def workspace_bytes(rows: int, k: int, sms: int = hopper.SMS, trace: bool = False) -> int:
    """Bytes of the workspace one launch of this shape needs: two partial-sum slots per CTA
    (its first and its last tile) and one arrival counter per tile (and, with ``trace``,
    TRACE_POINTS timestamps per CTA)."""
    blocks = rows // TILE_ROWS * (k // BLOCK)
    ctas = min(sms, blocks)
    nbytes = ctas * 2 * SLOT_BYTES + rows // TILE_ROWS * 4
    if trace:
        nbytes = _align(nbytes, 8) + ctas * TRACE_POINTS * 8
    return nbytes


@dataclass(frozen=True)
class StreamParams:
    """One specialization of fp8_stream: shape, numerics options and the two knobs.

    ``warps``: consumer warps, one 128-K block each per stage (a stage is 16 rows x
    warps * 128 K); ``stages``: the ring of stages a producer warp keeps filled with bulk
    copies (bytes in flight per SM = stages * stage bytes).
    """

    rows: int
    k: int
    tokens: int
    swiglu: bool
    limit: float | None
    ue8m0: bool
    warps: int = 4
    stages: int = 6
    sms: int = hopper.SMS
    trace: bool = False  # record TRACE_POINTS %globaltimer stamps per CTA in the workspace
    # 128-K blocks each consumer warp takes per stage (bigger stages: longer bulk copies)
    blocks_per_warp: int = 1
    # CTAs resident per SM: the shared-memory and register bounds (the grid-wide form keeps
    # one CTA per SM, so 2 leaves the other half free; the cluster form fills both halves)
    ctas_per_sm: int = 1
    # 0: stream-K over the whole grid, split tiles reduced through the workspace; C >= 1:
    # whole tiles per cluster of C CTAs, split tiles reduced in distributed shared memory
    cluster: int = 0
    # Cluster form, clusters of 2 or more: x quantized once per cluster (each CTA quantizes
    # every cluster-th (token, block) chunk and sends it to the others with st.async), so
    # every CTA holds all of x but reads only its share from L2
    share_x: bool = False
    ablate: str = ""  # ABLATIONS: a build that leaves out part of the work (never DenseMlp's)
    # TMA tensor copies and wgmma by descriptor (see TMA_KERNEL_ARGS); warps a multiple of 4
    tma: bool = False
    # tma: each 32-K step's wgmma into accumulators of its own, the four summed in fp32
    # registers (the tensor core's FP8 sums are less precise than fp32), not one chain of four
    step_sums: bool = False

    def __post_init__(self) -> None:
        check_int("rows", self.rows, TILE_ROWS, MAX_ROWS)
        check_int("k", self.k, BLOCK, MAX_K)
        check_int("tokens", self.tokens, 1, MAX_TOKENS)
        check_int("warps", self.warps, 1, MAX_WARPS)
        check_int("stages", self.stages, 2, 16)
        check_int("blocks_per_warp", self.blocks_per_warp, 1, 4)
        check_int("ctas_per_sm", self.ctas_per_sm, 1, 2)
        if isinstance(self.cluster, bool) or self.cluster not in CLUSTER_SIZES:
            raise ValueError(
                f"cluster must be one of {', '.join(map(str, CLUSTER_SIZES))}, got {self.cluster!r}"
            )
        hopper.check_sms(self.sms)
        for name in ("swiglu", "ue8m0", "trace", "share_x", "tma", "step_sums"):
            check_bool(name, getattr(self, name))
        object.__setattr__(self, "limit", check_limit(self.limit))
        if not isinstance(self.ablate, str) or self.ablate not in ABLATIONS:
            raise ValueError(
                f"ablate must be one of {', '.join(map(repr, ABLATIONS))}, got {self.ablate!r}"
            )
        if self.leaves_out_x and self.share_x:
            raise ValueError("ablate='x' needs share_x=False (the cluster's exchange waits for x)")
        if self.step_sums and not self.tma:
            raise ValueError("step_sums needs tma=True (it changes how the wgmmas sum)")
        if self.tma and self.warps % WARPGROUP:
            raise ValueError(
                f"tma needs warps a multiple of {WARPGROUP} (whole warpgroups), got {self.warps}"
            )
        if self.k % BLOCK:
            raise ValueError(f"k must be a multiple of {BLOCK}, got {self.k}")
        if self.rows % TILE_ROWS:
            raise ValueError(f"rows must be a multiple of {TILE_ROWS}, got {self.rows}")
        if self.cluster > self.kblocks:
            raise ValueError(
                f"cluster must be at most k / {BLOCK} = {self.kblocks} (every CTA of a cluster "
                f"takes a block of its tiles), got {self.cluster}"
            )
        if self.share_x and self.cluster < 2:
            raise ValueError(
                f"share_x needs the cluster form with clusters of 2 or more, got cluster="
                f"{self.cluster}"
            )
        budget = hopper.smem_budget(self.ctas_per_sm)
        if self.smem_bytes > budget:
            raise ValueError(
                f"fp8_stream needs {self.smem_bytes} B of shared memory per CTA for k={self.k} "
                f"and {self.tokens} tokens, more than {budget} B at ctas_per_sm="
                f"{self.ctas_per_sm}; lower stages or warps"
            )

    @property
    def leaves_out_x(self) -> bool:
        """An ablated build without x's load and quantization ("x", "x+mma")."""
        return "x" in self.ablate.split("+")

    @property
    def leaves_out_mma(self) -> bool:
        """An ablated build without the consumers' math ("mma", "x+mma")."""
        return "mma" in self.ablate.split("+")

    # Geometry: Python constants, compiled into the kernel.
    @property
    def kblocks(self) -> int:
        return self.k // BLOCK

    @property
    def tiles(self) -> int:
        return self.rows // TILE_ROWS

    @property
    def blocks(self) -> int:
        """The work: (tile, K block) pairs."""
        return self.tiles * self.kblocks

    @property
    def clusters(self) -> int:
        """Clusters of ``cluster`` CTAs (cluster form): as many as can be resident at once,
        at most one per tile."""
        slots = self.sms * self.ctas_per_sm
        return max(1, min(self.tiles, hopper.resident_ctas(slots, self.cluster) // self.cluster))

    @property
    def cluster_tiles(self) -> int:
        """Most tiles one cluster takes (cluster form)."""
        return -(-self.tiles // self.clusters)

    @property
    def ctas(self) -> int:
        if self.cluster:
            return self.clusters * self.cluster
        return min(self.sms, self.blocks)

    def cta_ranges(self) -> list[tuple[int, int]]:
        """[start, stop) blocks of every CTA, in CTA order: what the kernel's cta_range
        computes on the device (grid-wide form: blocks // ctas each, one more for the first
        blocks % ctas CTAs; cluster form: the same cut of each cluster's whole tiles)."""
        if not self.cluster:
            q, r = divmod(self.blocks, self.ctas)
            starts = [c * q + min(c, r) for c in range(self.ctas + 1)]
            return list(zip(starts, starts[1:], strict=False))
        ranges = []
        q, r = divmod(self.tiles, self.clusters)
        for j in range(self.clusters):
            base = (j * q + min(j, r)) * self.kblocks
            nb = (q + (j < r)) * self.kblocks
            qq, rr = divmod(nb, self.cluster)
            starts = [base + i * qq + min(i, rr) for i in range(self.cluster + 1)]
            ranges += zip(starts, starts[1:], strict=False)
        return ranges

    def segments(self, b0: int, b1: int) -> list[tuple[int, int]]:
        """The range [b0, b1)'s three segments in the kernel's processing order, as [start,
        stop) blocks (empty ones included): the first tile's share where it is partial, the
        last tile's share where it is partial (both reduced with other CTAs, so they go
        first), then the whole tiles. The host's twin of the kernel's ``segment``."""
        kb = self.kblocks
        head_end = min((b0 // kb + 1) * kb, b1)
        last = (b1 - 1) // kb * kb  # the last tile's first block
        head_stop = head_end if head_end - b0 < kb else b0
        tail = mid_end = b1
        if last >= head_end and b1 - last < kb:
            tail = mid_end = last
        return [(b0, head_stop), (tail, b1), (head_stop, mid_end)]

    def stage_fills(self, b0: int, b1: int) -> list[int]:
        """Blocks of each stage the producer fills for the range [b0, b1), in order: each
        segment cut into stages of at most ``stage_blocks``."""
        sb = self.stage_blocks
        return [
            min(stop - pos, sb)
            for start, stop in self.segments(b0, b1)
            for pos in range(start, stop, sb)
        ]

    @property
    def cluster_ctas(self) -> int:
        """CTAs per launched thread block cluster (1: launched without clusters)."""
        return max(1, self.cluster)

    @property
    def max_blocks_per_cta(self) -> int:
        if self.cluster:
            return -(-self.cluster_tiles * self.kblocks // self.cluster)
        return -(-self.blocks // self.ctas)

    @property
    def threads(self) -> int:
        return 32 * (self.warps + 2)  # consumers, the producer warp, the epilogue warp

    @property
    def out_cols(self) -> int:
        return self.rows // 2 if self.swiglu else self.rows

    @property
    def stage_blocks(self) -> int:
        """Blocks per stage: blocks_per_warp for each consumer warp."""
        return self.warps * self.blocks_per_warp

    @property
    def stage_tiles(self) -> int:
        """Most tiles a stage of stage_blocks consecutive blocks can touch."""
        return min(self.stage_blocks, -(-(self.stage_blocks - 1) // self.kblocks) + 1)

    @property
    def stage_bytes(self) -> int:
        """A stage: per tile it touches, 16 rows of its blocks, each row padded; tma: its
        blocks one after another, 16 swizzled rows each."""
        if self.tma:
            return self.stage_blocks * TMA_BLOCK_BYTES
        return TILE_ROWS * (self.stage_blocks * BLOCK + self.stage_tiles * ROW_PAD)

    @property
    def tma_box_rows(self) -> int:
        """tma: rows of one tensor copy (SwiGLU: a tile's 8 gate rows, or its 8 up rows)."""
        return TILE_ROWS // 2 if self.swiglu else TILE_ROWS

    @property
    def kernel_args(self) -> tuple[str, ...]:
        return TMA_KERNEL_ARGS if self.tma else KERNEL_ARGS

    @property
    def x_row(self) -> int:
        """Bytes per token row of the quantized x (the range's blocks and the pad)."""
        return self.x_blocks_max * BLOCK + ROW_PAD

    @property
    def x_blocks_max(self) -> int:
        """K blocks of x one CTA quantizes at most (its range covers at most that many; all
        of them with share_x). tma: three more where the range wraps past K, repeating the
        first three, so four consecutive blocks of a stage are four consecutive blocks of
        x."""
        wrap = WARPGROUP - 1 if self.tma else 0
        if self.share_x:
            return self.kblocks + wrap
        return min(self.kblocks + wrap, self.max_blocks_per_cta)

    @property
    def x_slots(self) -> int:
        """tma: K blocks of x in shared memory: x_blocks_max and room for the three a
        warpgroup's wgmma reads past a range's last block (results it discards)."""
        if self.share_x:
            return self.kblocks + WARPGROUP - 1
        return min(self.kblocks, self.max_blocks_per_cta) + WARPGROUP - 1

    @property
    def x_chunks(self) -> int:
        """(token, K block) chunks of x one CTA quantizes at most (with share_x, chunk c
        goes to cluster rank c % cluster)."""
        chunks = self.tokens * self.x_blocks_max
        if self.share_x:
            return -(-chunks // self.cluster)
        return chunks

    @property
    def x_passes(self) -> int:
        """Passes of 4 (token, block) chunks per consumer warp to quantize x."""
        return -(-self.x_chunks // (4 * self.warps))

    # Shared-memory layout: mbarriers (stages full, stages empty, partials full, partials
    # empty) | warp partials | weight scales | x scales | x | ring | (cluster form) the
    # partials the cluster's other CTAs send for our split tile, and their mbarrier
    @property
    def smem_partials(self) -> int:
        return _align(16 * self.stages + 16 * PARTIAL_BUFFERS, 128)

    @property
    def smem_wscales(self) -> int:
        return self.smem_partials + PARTIAL_BUFFERS * self.warps * SLOT_BYTES

    @property
    def smem_xscales(self) -> int:
        return self.smem_wscales + _align(self.max_blocks_per_cta * 8, 16)

    @property
    def smem_x(self) -> int:
        return _align(self.smem_xscales + self.tokens * self.x_blocks_max * 4, 128)

    @property
    def x_bytes(self) -> int:
        """The quantized x in shared memory: token rows, or (tma) x_slots core-matrix blocks
        of 8 tokens."""
        if self.tma:
            return self.x_slots * X_BLOCK_BYTES
        return self.tokens * self.x_row

    @property
    def smem_ring(self) -> int:
        """The ring (tma: at a swizzle atom; the shared memory itself starts at one)."""
        return _align(self.smem_x + self.x_bytes, SWIZZLE_ATOM if self.tma else 128)

    @property
    def smem_received(self) -> int:
        """The other CTAs' partials of our split tile (cluster form: up to cluster - 1)."""
        return self.smem_ring + self.stages * self.stage_bytes

    @property
    def smem_split_bar(self) -> int:
        return self.smem_received + (self.cluster_ctas - 1) * SLOT_BYTES

    @property
    def smem_x_bar(self) -> int:
        """share_x: the mbarrier that counts the x chunks the cluster's other CTAs send."""
        return self.smem_split_bar + 8

    @property
    def smem_bytes(self) -> int:
        if self.cluster > 1:
            return self.smem_split_bar + MBARRIER_BYTES
        return self.smem_ring + self.stages * self.stage_bytes

    @property
    def workspace_bytes(self) -> int:
        if self.cluster:
            return _align(self.ctas * TRACE_POINTS * 8, 16) if self.trace else 16
        return workspace_bytes(self.rows, self.k, self.sms, self.trace)

    @property
    def trace_offset(self) -> int:
        """Where the trace stamps start in the workspace (CTA c, point i: + (c * TRACE_POINTS +
        i) * 8)."""
        if self.cluster:
            return 0
        return _align(self.ctas * 2 * SLOT_BYTES + self.tiles * 4, 8)

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.ctas, 1, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.threads, 1, 1)


def _align(nbytes: int, to: int) -> int:
    return -(-nbytes // to) * to
