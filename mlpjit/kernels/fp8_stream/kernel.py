"""FP8 block-scaled GEMV (+ fused SwiGLU) that streams its weights, in CuTe DSL.

Same product and numerics as fp8_gemv (out = bf16(quant(x) . w^T) with 128x128 weight
block scales and the stock per-(token, 128-group) activation scales; with ``swiglu`` the
16 A rows of a tile are 8 gate rows and their 8 up rows and the kernel writes act), with a
work split and a memory pipeline whose speed follows from the bytes:

- Work: the (16-row tile, 128-K block) pairs in tile-major order, one contiguous range per
  CTA of a single resident wave (stream-K); ranges differ by one block at most.
- Streaming: a producer warp copies each stage (``warps * blocks_per_warp`` consecutive
  blocks of the range, across tile boundaries: per tile it touches, one bulk copy per
  weight row) into a ring of ``stages`` shared-memory slots, from launch on (weights never
  depend on the previous kernel), and refills a slot as soon as the consumers release it,
  so the bytes in flight never drain between tiles.
- Consumers: ``warps`` warps, ``blocks_per_warp`` blocks each per stage, four m16n8k32 e4m3
  mmas per block with the tokens as the 8 B columns, fp32 sums per block scaled by
  w_scale * x_scale. After the PDL wait they quantize the part of x their range touches
  into shared memory. At the end of each tile's share they hand their partials to an
  epilogue warp and go on streaming.
- Tiles split between CTAs (at most the first and the last of a range, processed first so
  their reductions overlap the rest of the stream): the epilogue warp writes the CTA's
  fp32 partial into its own workspace slot and bumps the tile's arrival counter; the last
  to arrive adds the slots in CTA order (bit-identical whoever is last), resets the
  counter for the next launch and runs the epilogue. The counters start at zero and are
  left at zero, so the workspace needs no reset between calls or graph replays; calls on
  two streams at once need two workspaces (the caller's).
- Cluster form (``cluster`` >= 1): each thread block cluster takes whole tiles and cuts
  them into equal ranges for its CTAs, so a split tile never leaves its cluster. The CTA
  holding a split tile's first block owns it: the others send their partials into its
  shared memory with st.async, counted on an mbarrier it made before the cluster's entry
  arrive, and it adds them in rank order after its own. No workspace is read or written
  (trace builds aside), so nothing needs zeroing, ever.
- ``share_x`` (cluster form, clusters of 2 or more): x is quantized once per cluster. Every
  CTA holds all of x; rank r quantizes the (token, K block) chunks r, r + C, ... and sends
  each to the other CTAs with st.async, counted on an x mbarrier each made before the entry
  arrive. Every CTA reading and quantizing all of x (up to 98 KB of L2 reads per CTA at 8
  tokens, competing with the weight stream) is what made 8 tokens slower than 1.

- ``tma``: the producer copies each block of a stage with a TMA tensor copy into wgmma's
  128-byte swizzle (the weight's tensor map is a sixth kernel parameter), and the consumers'
  warpgroups multiply four consecutive blocks at once with wgmma through descriptors, x in
  wgmma's core-matrix layout (params.py: TMA_KERNEL_ARGS). Faster than mma.sync and less
  precise (docs/KERNEL_NOTES.md, variants 50 to 52); no DenseMlp plan takes it.

DenseMlp runs the cluster form for the layer halves mlpjit.layer_plan.stream_halves gives
it; scripts/tune_fp8_stream.py times both forms beside fp8_gemv (docs/KERNEL_NOTES.md,
the streaming kernel).

Nothing here is imported by ``import mlpjit``; the compile manager imports this module on
a cache miss and calls :func:`compile_cubin`.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from mlpjit.kernels import ptx
from mlpjit.kernels.cubin import compile_to_cubin, launch_options, row_major_tensor
from mlpjit.kernels.fp8_stream.params import (
    BLOCK,
    PARTIAL_BUFFERS,
    ROW_PAD,
    SLOT_BYTES,
    TILE_ROWS,
    TMA_BLOCK_BYTES,
    TRACE_POINTS,
    WARPGROUP,
    X_BLOCK_BYTES,
    X_CORE,
    X_PASSES_MAX,
    X_STEP_BYTES,
    StreamParams,
)
from mlpjit.kernels.numerics import quantize16, swiglu
from mlpjit.kernels.tensor_map import MAP_BYTES
from mlpjit.kernels.wgmma_desc import (
    core_matrix_descriptor,
    device_descriptor,
    swizzled_descriptor,
)

__all__ = ["Fp8Stream", "compile_cubin"]

_CONSUMERS = 1  # named barrier of the consumer warps (0 is __syncthreads)
_SLOT_BATCH = 4  # split-tile partials the last CTA loads at once
# tma: wgmma descriptors less their start addresses: A (the ring, 128-byte swizzle) and B
# (x, core matrices; the next 8 of B's rows are the next K block's x)
_A_DESC = swizzled_descriptor(0)
_X_DESC = core_matrix_descriptor(0, X_BLOCK_BYTES, X_CORE)


class Fp8Stream:
    """One specialization: every shape and knob is a Python constant of its StreamParams.

    Also one phase of a one-kernel layer (mlpjit.kernels.fp8_layer), through two options:
    ``release_at`` (gate_up: each stored tile of act is announced on the layer's arrival
    counter at that workspace offset) and ``x_after`` (down: x is the act this kernel writes;
    the consumers wait until the counter at that offset reaches ``tiles * 32`` instead of
    waiting for the previous kernel, and read x from L2).
    """

    def __init__(
        self,
        params: StreamParams,
        *,
        release_at: int | None = None,
        x_after: tuple[int, int] | None = None,
    ) -> None:
        if not isinstance(params, StreamParams):
            raise ValueError(f"params must be a StreamParams, got {type(params).__name__}")
        self.params = params
        self.release_at = release_at  # offset of the act counter from this phase's workspace
        self.x_after = x_after  # (offset of the act counter, act tiles to wait for)

    def __getattr__(self, name: str) -> Any:
        if name == "params":
            raise AttributeError(name)
        return getattr(self.params, name)

    def launch_options(self) -> dict:
        """The launch's grid, block, shared memory, PDL, launch bound and cluster."""
        return launch_options(
            self.ctas, self.threads, self.smem_bytes, self.ctas_per_sm, self.cluster_ctas
        )

    @cute.jit
    def __call__(
        self,
        m_out: cute.Tensor,
        m_x: cute.Tensor,
        m_w: cute.Tensor,
        m_ws: cute.Tensor,
        m_work: cute.Tensor,
        stream: Any,
    ):
        self.kernel(m_out, m_x, m_w, m_ws, m_work).launch(stream=stream, **self.launch_options())

    @cute.kernel
    def kernel(
        self,
        m_out: cute.Tensor,
        m_x: cute.Tensor,
        m_w: cute.Tensor,
        m_ws: cute.Tensor,
        m_work: cute.Tensor,
    ):
        self.body(m_out, m_x, m_w, m_ws, m_work, Int64(0))

    @cute.jit
    def with_map(
        self,
        m_out: cute.Tensor,
        m_x: cute.Tensor,
        m_w: cute.Tensor,
        m_ws: cute.Tensor,
        m_work: cute.Tensor,
        m_map: cute.Tensor,
        stream: Any,
    ):
        """tma's entry: the weight's tensor map as a sixth parameter."""
        self.tma_kernel(m_out, m_x, m_w, m_ws, m_work, m_map).launch(
            stream=stream, **self.launch_options()
        )

    @cute.kernel
    def tma_kernel(
        self,
        m_out: cute.Tensor,
        m_x: cute.Tensor,
        m_w: cute.Tensor,
        m_ws: cute.Tensor,
        m_work: cute.Tensor,
        m_map: cute.Tensor,
    ):
        self.body(m_out, m_x, m_w, m_ws, m_work, Int64(m_map.iterator.toint()))

    @cute.jit
    def body(
        self,
        m_out: cute.Tensor,
        m_x: cute.Tensor,
        m_w: cute.Tensor,
        m_ws: cute.Tensor,
        m_work: cute.Tensor,
        g_map: Int64,
    ):
        W = self.warps
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        warp = tid >> 5
        lane = tid & 31

        smem = cutlass.memory.SmemAllocator()
        s_base = smem.allocate(self.smem_bytes, byte_alignment=1024 if self.tma else 128).toint()
        b0, b1 = self.cta_range(cta)

        if tid == 0:
            self.stamp(Int64(m_work.iterator.toint()), cta, 0)
            self.init_barriers(s_base)
            if cutlass.const_expr(self.cluster > 1):
                self.expect_split_partials(s_base, cta, b0, b1)
            if cutlass.const_expr(self.share_x):
                self.expect_shared_x(s_base, cta)
            ptx.fence_mbarrier_init()
        cute.arch.sync_threads()
        if cutlass.const_expr(self.cluster > 1):
            ptx.cluster_arrive_relaxed()  # "started": the others may send us partials

        if warp == W:
            self.produce(Int64(m_w.iterator.toint()), g_map, s_base, b0, b1, lane)
            if lane == 0:
                self.stamp(Int64(m_work.iterator.toint()), cta, 5)
        elif warp == W + 1:
            self.finish(
                Int64(m_out.iterator.toint()), Int64(m_work.iterator.toint()), s_base, cta,
                b0, b1, lane,
            )  # fmt: skip
        else:
            self.consume(
                Int64(m_x.iterator.toint()), Int64(m_ws.iterator.toint()),
                Int64(m_work.iterator.toint()), s_base, cta, b0, b1, warp, lane,
            )  # fmt: skip

    @cute.jit
    def init_barriers(self, s_base: Int32):
        """One thread: the ring's and the partial buffers' mbarriers."""
        for i in cutlass.range_constexpr(self.stages):
            ptx.mbarrier_init(self.full_bar(s_base, i), 1)
            ptx.mbarrier_init(self.empty_bar(s_base, i), self.warps)
        for i in cutlass.range_constexpr(PARTIAL_BUFFERS):
            ptx.mbarrier_init(self.handed_bar(s_base, i), 32 * self.warps)
            ptx.mbarrier_init(self.taken_bar(s_base, i), 32)

    @cute.jit
    def expect_split_partials(self, s_base: Int32, cta: Int32, b0: Int32, b1: Int32):
        """One thread, cluster form: the mbarrier that counts the partials the cluster's
        other CTAs send for the split tile we own (our last tile, where it starts in our
        range and ends past it), expecting their bytes."""
        bar = s_base + self.smem_split_bar
        ptx.mbarrier_init(bar, 1)
        senders = self.split_senders(cta, b0, b1)
        if senders > 0:
            ptx.mbarrier_arrive_expect_tx(bar, senders * SLOT_BYTES)

    @cute.jit
    def expect_shared_x(self, s_base: Int32, cta: Int32):
        """One thread, share_x: the mbarrier that counts the x chunks (values and scale) the
        cluster's other CTAs quantize for us: every chunk but ours (rank r: r, r + C, ...)."""
        C = self.cluster
        chunks = self.tokens * self.x_blocks_max
        ours = (chunks - cta % C + C - 1) // C
        bar = s_base + self.smem_x_bar
        ptx.mbarrier_init(bar, 1)
        ptx.mbarrier_arrive_expect_tx(bar, (chunks - ours) * (BLOCK + 4))

    @cute.jit
    def stamp(self, g_work: Int64, cta: Int32, point: int):
        """A trace build's %globaltimer stamp ``point`` of this CTA (nothing otherwise); with
        the start stamp (point 0), the CTA's SM id in its last slot."""
        if cutlass.const_expr(self.trace):
            addr = g_work + Int64(self.trace_offset + (cta * TRACE_POINTS + point) * 8)
            ptx.st_global_u64(addr, ptx.globaltimer())
            if cutlass.const_expr(point == 0):
                sm_slot = (cta + 1) * TRACE_POINTS - 1
                ptx.st_global_u64(
                    g_work + Int64(self.trace_offset + sm_slot * 8), Int64(ptx.smid())
                )

    # ------------------------------------------------------------------ shared memory

    def full_bar(self, s_base, i):
        """mbarrier: ring slot i holds its stage (completed by the bulk copies' bytes)."""
        return s_base + 8 * i

    def empty_bar(self, s_base, i):
        """mbarrier: every consumer warp is done with ring slot i."""
        return s_base + 8 * (self.stages + i)

    def handed_bar(self, s_base, i):
        """mbarrier: partials buffer i holds a tile's warp partials (every consumer thread)."""
        return s_base + 16 * self.stages + 8 * i

    def taken_bar(self, s_base, i):
        """mbarrier: the epilogue warp has read partials buffer i."""
        return s_base + 16 * self.stages + 8 * (PARTIAL_BUFFERS + i)

    # ------------------------------------------------------------------ work split

    @cute.jit
    def cta_range(self, cta: Int32):
        """[b0, b1): the CTA's blocks. Cluster form: cluster j takes whole tiles (tiles //
        clusters each, one more for the first tiles % clusters), cut into ranges of equal
        size for its CTAs (cluster_rank_start)."""
        if cutlass.const_expr(self.cluster == 0):
            return self.range_start(cta), self.range_start(cta + 1)
        C = self.cluster
        rank = cta % C
        t0, nt = self.cluster_tiles_of(cta // C)
        base = t0 * self.kblocks
        nb = nt * self.kblocks
        return base + self.cluster_rank_start(nb, rank), base + self.cluster_rank_start(
            nb, rank + 1
        )

    @cute.jit
    def cluster_tiles_of(self, j: Int32):
        """(first tile, tiles) of cluster j."""
        q, r = divmod(self.tiles, self.clusters)
        nt = Int32(q)
        if j < r:
            nt = Int32(q + 1)
        return j * q + cutlass.min(j, r), nt

    @cute.jit
    def cluster_rank_start(self, nb: Int32, rank: Int32) -> Int32:
        """First block (from the cluster's first) of rank's range: nb // cluster each, one
        more for the first nb % cluster ranks."""
        q = nb // self.cluster
        r = nb - q * self.cluster
        return rank * q + cutlass.min(rank, r)

    @cute.jit
    def split_senders(self, cta: Int32, b0: Int32, b1: Int32) -> Int32:
        """Cluster form: how many CTAs of our cluster send us a partial of our last tile
        (0 unless we own a split tile: it starts in our range and ends past it)."""
        C = self.cluster
        KB = self.kblocks
        rank = cta % C
        tile = (b1 - 1) // KB
        senders = Int32(0)
        if tile * KB >= b0:  # noqa: SIM102 (runtime conditions: kept apart)
            if tile * KB + KB > b1:
                t0, nt = self.cluster_tiles_of(cta // C)
                nb = nt * KB
                last = tile * KB + KB - 1 - t0 * KB  # the tile's last block, in the cluster
                hi = rank + 1  # holds part of the tile; start(C) = nb > last ends the walk
                while self.cluster_rank_start(nb, hi + 1) <= last:
                    hi = hi + 1
                senders = hi - rank
        return senders

    @cute.jit
    def range_start(self, cta: Int32) -> Int32:
        """First block of a CTA's range: blocks // ctas each, one more for the first
        blocks % ctas CTAs."""
        q, r = divmod(self.blocks, self.ctas)
        return cta * q + cutlass.min(cta, r)

    @cute.jit
    def cta_of(self, b: Int32) -> Int32:
        """The CTA whose range holds block b (range_start inverted)."""
        q, r = divmod(self.blocks, self.ctas)
        if cutlass.const_expr(r == 0):
            return b // q
        c = b // (q + 1)
        if b >= r * (q + 1):
            c = r + (b - r * (q + 1)) // q
        return c

    @cute.jit
    def segment(self, b0: Int32, b1: Int32, i: Int32):
        """Segment i (0-2) of the range in processing order, as [start, stop) blocks: the
        first tile's share if it is partial, the last tile's share if it is partial (both
        shared with other CTAs: their reductions go first, overlapping the rest), then the
        whole tiles."""
        KB = self.kblocks
        head_end = cutlass.min((b0 // KB + 1) * KB, b1)
        last = ((b1 - 1) // KB) * KB  # the last tile's first block
        head_stop = b0  # [b0, head_stop): the partial first tile's share, if any
        if head_end - b0 < KB:
            head_stop = head_end
        tail = b1  # [tail, b1): the partial last tile's share, if any
        mid_end = b1
        if last >= head_end:  # noqa: SIM102 (a runtime `and` is not one condition here)
            if b1 - last < KB:
                tail = last
                mid_end = last
        start = b0
        stop = head_stop
        if i == 1:
            start = tail
            stop = b1
        if i == 2:
            start = head_stop
            stop = mid_end
        return start, stop

    @cute.jit
    def weight_row(self, tile: Int32, r: Int32) -> Int32:
        """Weight row of A row r (0-15) of a tile (SwiGLU: gate rows, then their up rows)."""
        if cutlass.const_expr(self.swiglu):
            row = tile * 8 + r
            if r >= 8:
                row = row + (self.rows // 2 - 8)
        else:
            row = tile * TILE_ROWS + r
        return row

    @cute.jit
    def scale_rows(self, tile: Int32):
        """Row blocks of the weight scales of a tile's A rows 0-7 and 8-15."""
        if cutlass.const_expr(self.swiglu):
            return (tile * 8) >> 7, (self.rows // 2 + tile * 8) >> 7
        rb = (tile * TILE_ROWS) >> 7
        return rb, rb

    # ------------------------------------------------------------------ producer warp

    @cute.jit
    def produce(self, g_w: Int64, g_map: Int64, s_base: Int32, b0: Int32, b1: Int32, lane):
        """Fill the ring: a stage is up to ``warps`` consecutive blocks of a segment; it
        waits for the consumers' release of its slot (from the second round on), announces
        its bytes and copies its blocks (copy_rows, or with tma copy_blocks)."""
        SB = self.stage_blocks
        R = self.stages
        s_ring = s_base + self.smem_ring
        slot = Int32(0)
        phase = Int32(0)
        again = Int32(0)  # 1 once the ring has wrapped: slots must be released first
        for i_seg in cutlass.range(3, unroll=1):  # a runtime loop: one copy of the body
            start, stop = self.segment(b0, b1, i_seg)
            pos = start
            while pos < stop:
                n = cutlass.min(stop - pos, SB)
                if again != 0:
                    ptx.mbarrier_wait(self.empty_bar(s_base, slot), phase ^ 1)
                if lane == 0:
                    ptx.mbarrier_arrive_expect_tx(
                        self.full_bar(s_base, slot), n * (TILE_ROWS * BLOCK)
                    )
                cute.arch.sync_warp()
                if cutlass.const_expr(self.tma):
                    self.copy_blocks(g_map, s_ring + slot * self.stage_bytes, pos, n,
                                     self.full_bar(s_base, slot), lane)  # fmt: skip
                else:
                    self.copy_rows(g_w, s_ring, slot, pos, n, self.full_bar(s_base, slot), lane)
                pos = pos + n
                slot = slot + 1
                if slot == R:
                    slot = Int32(0)
                    phase = phase ^ 1
                    again = Int32(1)

    @cute.jit
    def copy_rows(self, g_w: Int64, s_ring: Int32, slot: Int32, pos: Int32, n: Int32, bar, lane):
        """The stage's blocks pos .. pos + n - 1: per tile they touch (a part of the slot),
        one bulk copy per weight row, one row per lane."""
        KB = self.kblocks
        off = Int32(0)
        part = Int32(0)
        while off < n:
            tile = (pos + off) // KB
            kb = pos + off - tile * KB
            seg = cutlass.min(KB - kb, n - off)
            if lane < TILE_ROWS:
                row = Int64(self.weight_row(tile, lane))
                s_dst = self.stage_part(s_ring, slot, off, part)
                ptx.cp_async_bulk_g2s(
                    s_dst + lane * (seg * BLOCK + ROW_PAD),
                    g_w + row * self.k + Int64(kb * BLOCK),
                    seg * BLOCK,
                    bar,
                )
            off = off + seg
            part = part + 1

    @cute.jit
    def copy_blocks(self, g_map: Int64, s_stage: Int32, pos: Int32, n: Int32, bar: Int32, lane):
        """tma: the stage's blocks pos .. pos + n - 1, one per lane in turn, each a tensor
        copy of its tile's 16 rows (SwiGLU: the 8 gate rows, then the 8 up rows) at its K
        block, block after block in the slot."""
        KB = self.kblocks
        for p in cutlass.range(lane, n, 32, unroll=1):
            tile = (pos + p) // KB
            kb = pos + p - tile * KB
            s_dst = s_stage + p * TMA_BLOCK_BYTES
            if cutlass.const_expr(self.swiglu):
                ptx.cp_async_bulk_tensor_3d_g2s(s_dst, g_map, Int32(0), tile * 8, kb, bar)
                ptx.cp_async_bulk_tensor_3d_g2s(
                    s_dst + TMA_BLOCK_BYTES // 2, g_map, Int32(0), self.rows // 2 + tile * 8,
                    kb, bar,
                )  # fmt: skip
            else:
                ptx.cp_async_bulk_tensor_3d_g2s(s_dst, g_map, Int32(0), tile * TILE_ROWS, kb, bar)

    def stage_part(self, s_ring, slot, off, part):
        """Where a stage's part (the blocks of one tile from block ``off`` of the stage on,
        the stage's part-th) starts: rows of seg * 128 + ROW_PAD bytes follow."""
        return (
            s_ring
            + slot * self.stage_bytes
            + off * (TILE_ROWS * BLOCK)
            + part * (TILE_ROWS * ROW_PAD)
        )

    # ------------------------------------------------------------------ consumer warps

    @cute.jit
    def consume(
        self,
        g_x: Int64,
        g_ws: Int64,
        g_work: Int64,
        s_base: Int32,
        cta: Int32,
        b0: Int32,
        b1: Int32,
        warp: Int32,
        lane: Int32,
    ):
        W = self.warps
        R = self.stages
        KB = self.kblocks
        T = self.tokens
        s_part = s_base + self.smem_partials
        s_wsc = s_base + self.smem_wscales
        s_xsc = s_base + self.smem_xscales
        s_x = s_base + self.smem_x
        s_ring = s_base + self.smem_ring

        # Weight scales of the range (gate and up, or the tile's block twice), before the
        # wait: they never depend on the previous kernel either. Slot p: block b0 + p.
        for p in cutlass.range(warp * 32 + lane, b1 - b0, 32 * W, unroll=1):
            u = b0 + p
            tile = u // KB
            kb = u - tile * KB
            rg, ru = self.scale_rows(tile)
            ptx.cp_async_ca_4(s_wsc + p * 8, g_ws + Int64((rg * KB + kb) * 4))
            ptx.cp_async_ca_4(s_wsc + p * 8 + 4, g_ws + Int64((ru * KB + kb) * 4))
        cute.arch.cp_async_commit_group()

        if cutlass.const_expr(self.x_after is None):
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        else:
            self.wait_for_act(g_work, warp, lane)
        if warp * 32 + lane == 0:
            self.stamp(g_work, cta, 1)

        if cutlass.const_expr(self.share_x):
            self.quantize_x_across_cluster(g_x, s_base, cta, warp, lane)
        elif cutlass.const_expr(not self.leaves_out_x):
            self.quantize_x(g_x, s_x, s_xsc, b0, b1, warp, lane)
        if cutlass.const_expr(self.tma):
            ptx.fence_proxy_async_shared()  # x's stores, then the wgmmas' reads of them
        cute.arch.cp_async_wait_group(0)
        ptx.bar_sync(_CONSUMERS, 32 * W)
        if warp * 32 + lane == 0:
            self.stamp(g_work, cta, 2)

        g = lane >> 2
        q = lane & 3
        t_b = cutlass.min(g, T - 1)  # B columns >= tokens repeat the last token
        s_b = s_x + t_b * self.x_row + q * 16
        XB = self.x_blocks_max
        s_xs0 = s_xsc + cutlass.min(q * 2, T - 1) * (XB * 4)
        s_xs1 = s_xsc + cutlass.min(q * 2 + 1, T - 1) * (XB * 4)
        kb_first = b0 % KB  # x holds the range's K blocks from here on (mod KB)
        if cutlass.const_expr(self.share_x):
            kb_first = Int32(0)  # x holds every K block, in order

        t0 = Float32(0.0)
        t1 = Float32(0.0)
        t2 = Float32(0.0)
        t3 = Float32(0.0)
        slot = Int32(0)
        phase = Int32(0)
        piece = Int32(0)  # tile shares handed to the epilogue warp so far
        for i_seg in cutlass.range(3, unroll=1):  # a runtime loop: one copy of the body
            start, stop = self.segment(b0, b1, i_seg)
            pos = start
            while pos < stop:
                n = cutlass.min(stop - pos, self.stage_blocks)
                ptx.mbarrier_wait(self.full_bar(s_base, slot), phase)
                sums = []
                if cutlass.const_expr(self.tma):
                    sums = self.stage_sums_tma(
                        s_ring + slot * self.stage_bytes, pos, b0, s_x, s_xs0, s_xs1, s_wsc, warp
                    )
                # Walk the stage's parts (one per tile it touches): the warp's blocks (blocks
                # warp, warp + warps, ... of the stage) are added to their tile's sums, and
                # every tile whose share ends here is handed to the epilogue warp, in order.
                off = Int32(0)
                part = Int32(0)
                while off < n:
                    tile = (pos + off) // KB
                    kb = pos + off - tile * KB
                    seg = cutlass.min(KB - kb, n - off)
                    for j in cutlass.range_constexpr(self.blocks_per_warp):
                        blk = warp + j * W
                        if blk >= off:  # noqa: SIM102 (runtime conditions: kept apart)
                            if blk < off + seg:
                                if cutlass.const_expr(self.tma):
                                    c = sums[j]
                                else:
                                    c = self.block_sums(
                                        s_ring, slot, off, part, seg, blk, kb + blk - off,
                                        kb_first, s_b, s_xs0, s_xs1,
                                        s_wsc + (pos + blk - b0) * 8, g, q,
                                    )  # fmt: skip
                                t0 = t0 + c[0]
                                t1 = t1 + c[1]
                                t2 = t2 + c[2]
                                t3 = t3 + c[3]
                    ends = Int32(0)  # the tile's share ends here (its last block or the segment's)
                    if kb + seg == KB:
                        ends = Int32(1)
                    if pos + off + seg == stop:
                        ends = Int32(1)
                    if ends != 0:
                        self.hand_over(s_base, s_part, piece, warp, lane, t0, t1, t2, t3)
                        t0 = Float32(0.0)
                        t1 = Float32(0.0)
                        t2 = Float32(0.0)
                        t3 = Float32(0.0)
                        piece = piece + 1
                    off = off + seg
                    part = part + 1
                cute.arch.sync_warp()
                if lane == 0:
                    ptx.mbarrier_arrive(self.empty_bar(s_base, slot))
                pos = pos + n
                slot = slot + 1
                if slot == R:
                    slot = Int32(0)
                    phase = phase ^ 1
        if lane == 0:
            if warp == 0:
                self.stamp(g_work, cta, 3)
            if warp == W - 1:
                self.stamp(g_work, cta, 4)

    @cute.jit
    def wait_for_act(self, g_work: Int64, warp: Int32, lane: Int32):
        """One thread spins (acquire) until every act tile is announced; the consumer barrier
        then orders the other consumer threads' act loads after it. The last CTA to pass
        puts the two counters back to zero for the next launch (nobody reads them after
        passing)."""
        offset, act_tiles = self.x_after
        g_cnt = g_work + Int64(offset)
        if warp * 32 + lane == 0:
            seen = ptx.ld_acquire_gpu_u32(g_cnt)
            while seen < act_tiles * 32:
                seen = ptx.ld_acquire_gpu_u32(g_cnt)
            passed = ptx.atom_add_acq_rel_gpu(g_cnt + Int64(4), Int32(1))
            if passed == self.ctas - 1:
                ptx.st_relaxed_gpu_u32(g_cnt, Int32(0))
                ptx.st_relaxed_gpu_u32(g_cnt + Int64(4), Int32(0))
        ptx.bar_sync(_CONSUMERS, 32 * self.warps)

    @cute.jit
    def block_sums(
        self, s_ring, slot, off, part, seg, blk, kb, kb_first, s_b, s_xs0, s_xs1, s_ws, g, q
    ):
        """Block ``blk`` of the stage (K block kb), as the lane's four sums: 2 x 2 mmas (two
        independent chains, one per 64-K step), scaled by w_scale * x_scale."""
        if cutlass.const_expr(self.leaves_out_mma):
            zero = Float32(0.0)
            return [zero, zero, zero, zero]
        KB = self.kblocks
        xb = kb - kb_first  # the block's place in the quantized x
        if xb < 0:
            xb = xb + KB
        stride = seg * BLOCK + ROW_PAD
        s_a = self.stage_part(s_ring, slot, off, part) + (blk - off) * BLOCK + q * 16
        s_a = s_a + g * stride
        acc = []
        for s in cutlass.range_constexpr(2):
            a0 = ptx.ld_shared_v4(s_a + s * 64)
            a1 = ptx.ld_shared_v4(s_a + 8 * stride + s * 64)
            b = ptx.ld_shared_v4(s_b + xb * BLOCK + s * 64)
            zero = Float32(0.0)
            first = ptx.mma_m16n8k32_e4m3(
                (a0[0], a1[0], a0[1], a1[1]), (b[0], b[1]), (zero, zero, zero, zero)
            )
            acc.append(ptx.mma_m16n8k32_e4m3((a0[2], a1[2], a0[3], a1[3]), (b[2], b[3]), first))
        ws0 = ptx.ld_shared_f32(s_ws)
        ws1 = ptx.ld_shared_f32(s_ws + 4)
        xs0 = ptx.ld_shared_f32(s_xs0 + xb * 4)
        xs1 = ptx.ld_shared_f32(s_xs1 + xb * 4)
        return [
            (acc[0][0] + acc[1][0]) * (ws0 * xs0),
            (acc[0][1] + acc[1][1]) * (ws0 * xs1),
            (acc[0][2] + acc[1][2]) * (ws1 * xs0),
            (acc[0][3] + acc[1][3]) * (ws1 * xs1),
        ]

    def x_chunk_address(self, s_x, t, xb, cl):
        """Where chunk cl (K bytes 16 cl .. + 15) of token t's x block xb goes in shared
        memory: its token row, or (tma) row t of the core matrix of step cl // 2, K half
        cl % 2."""
        if self.tma:
            return s_x + xb * X_BLOCK_BYTES + cl * X_CORE + t * 16
        return s_x + t * self.x_row + xb * BLOCK + cl * 16

    @cute.jit
    def stage_sums_tma(self, s_stage, pos, b0, s_x, s_xs0, s_xs1, s_wsc, warp):
        """tma: the warp's blocks of the stage (warp, warp + warps, ...), as [its four sums]
        per block like block_sums (valid for the blocks below the stage's count). Per round
        the warpgroup's four warps take four consecutive blocks, one 64 x 128 A in the slot,
        and one wgmma.m64n32k32 per 32 K multiplies it by the four blocks' x side by side
        (x slots xb .. xb + 3 of the round's first block); each warp keeps its own block's 8
        columns. A round past the stage's blocks computes on what the slot holds and is
        never added. step_sums: each step's wgmma writes accumulators of its own, and the
        warp adds its four picks in fp32, one round at a time."""
        W = self.warps
        KB = self.kblocks
        if cutlass.const_expr(self.leaves_out_mma):
            zero = Float32(0.0)
            return [[zero, zero, zero, zero] for _ in range(self.blocks_per_warp)]
        wi = warp & (WARPGROUP - 1)
        # x slot of block u: (u - b0) mod KB (share_x: u mod KB); slots past KB repeat.
        x_origin = b0
        if cutlass.const_expr(self.share_x):
            x_origin = Int32(0)
        zero = Float32(0.0)
        accs = []
        own = []
        picked = []
        ptx.wgmma_fence()
        for j in cutlass.range_constexpr(self.blocks_per_warp):
            p0 = j * W + warp - wi  # the warpgroup's first block of this round
            xb0 = (pos + p0 - x_origin) % KB
            a_desc = device_descriptor(s_stage + p0 * TMA_BLOCK_BYTES, _A_DESC)
            b_desc = device_descriptor(s_x + xb0 * X_BLOCK_BYTES, _X_DESC)
            acc = tuple(zero for _ in range(4 * WARPGROUP))
            steps = []  # step_sums: each step's own accumulators
            for step in cutlass.range_constexpr(4):
                acc = ptx.wgmma_k32_e4m3(
                    a_desc + Int64(step * (32 >> 4)), b_desc + Int64(step * (X_STEP_BYTES >> 4)),
                    tuple(zero for _ in range(4 * WARPGROUP)) if self.step_sums else acc,
                    step > 0 and not self.step_sums,
                )  # fmt: skip
                steps.append(acc)
            if cutlass.const_expr(self.step_sums):
                # one round at a time: its four accumulator sets, then the next round's
                ptx.wgmma_commit()
                ptx.wgmma_wait()
                v = self.own_columns(steps[0], wi)
                for step in cutlass.range_constexpr(1, 4):
                    u = self.own_columns(steps[step], wi)
                    v = [v[c] + u[c] for c in range(4)]
                picked.append(v)
                if cutlass.const_expr(j + 1 < self.blocks_per_warp):
                    ptx.wgmma_fence()
            else:
                accs.append(acc)
            xb = xb0 + wi
            if xb >= KB:
                xb = xb - KB
            own.append((xb, s_wsc + (pos + p0 + wi - b0) * 8))
        if cutlass.const_expr(not self.step_sums):
            ptx.wgmma_commit()
            ptx.wgmma_wait()
            picked = [self.own_columns(acc, wi) for acc in accs]
        sums = []
        for j in cutlass.range_constexpr(self.blocks_per_warp):
            v0, v1, v2, v3 = picked[j]
            xb, s_ws = own[j]
            ws0 = ptx.ld_shared_f32(s_ws)
            ws1 = ptx.ld_shared_f32(s_ws + 4)
            xs0 = ptx.ld_shared_f32(s_xs0 + xb * 4)
            xs1 = ptx.ld_shared_f32(s_xs1 + xb * 4)
            sums.append([v0 * (ws0 * xs0), v1 * (ws0 * xs1), v2 * (ws1 * xs0), v3 * (ws1 * xs1)])
        return sums

    @cute.jit
    def own_columns(self, acc, wi):
        """A warp's 4 of a wgmma.m64n32's 16 accumulators: the 8 columns of block wi (D
        columns 8 wi .. + 7), in mma.sync's order."""
        v0, v1, v2, v3 = acc[0], acc[1], acc[2], acc[3]
        for w in cutlass.range_constexpr(1, WARPGROUP):
            if wi == w:
                v0, v1, v2, v3 = acc[4 * w], acc[4 * w + 1], acc[4 * w + 2], acc[4 * w + 3]
        return [v0, v1, v2, v3]

    @cute.jit
    def hand_over(self, s_base, s_part, piece, warp, lane, t0, t1, t2, t3):
        """This tile's share is done: the warp's sums go to the epilogue warp (through
        PARTIAL_BUFFERS buffers in turn); the consumers go on streaming."""
        buf = piece % PARTIAL_BUFFERS
        if piece >= PARTIAL_BUFFERS:
            ptx.mbarrier_wait(self.taken_bar(s_base, buf), ((piece // PARTIAL_BUFFERS) & 1) ^ 1)
        s_dst = s_part + (buf * self.warps + warp) * SLOT_BYTES + lane * 16
        ptx.st_shared_v4_f32(s_dst, t0, t1, t2, t3)
        ptx.mbarrier_arrive(self.handed_bar(s_base, buf))

    @cute.jit
    def quantize_x(
        self, g_x: Int64, s_x: Int32, s_xsc: Int32, b0: Int32, b1: Int32, warp: Int32, lane
    ):
        """Quantize the K blocks of x the range touches (all of K once it spans a tile),
        in range order from the first block's (block xb of x is K block kb_first + xb mod
        KB): (token, block) chunks of 8 lanes x 16 values, 4 per warp per pass; each batch
        of passes issues all its loads before the first is quantized."""
        T = self.tokens
        KB = self.kblocks
        W = self.warps
        nb = cutlass.min(b1 - b0, KB)
        if cutlass.const_expr(self.tma):
            nb = cutlass.min(b1 - b0, KB + WARPGROUP - 1)  # the first three again past KB
        kb_first = b0 % KB
        chunks = nb * T
        sub = lane >> 3
        cl = lane & 7
        passes = self.x_passes
        for first in cutlass.range_constexpr(0, passes, X_PASSES_MAX):
            todo = []
            for j in cutlass.range_constexpr(first, min(passes, first + X_PASSES_MAX)):
                c = (j * W + warp) * 4 + sub
                cc = cutlass.min(c, chunks - 1)  # past the end: a valid re-read, not stored
                t = cc % T
                xb = cc // T
                kb = kb_first + xb
                if kb >= KB:
                    kb = kb - KB
                if cutlass.const_expr(self.tma):  # noqa: SIM102 (compile-time, then runtime)
                    if kb >= KB:
                        kb = kb - KB
                g_src = g_x + Int64((t * self.k + kb * BLOCK + cl * 16) * 2)
                if cutlass.const_expr(self.x_after is None):
                    words = list(ptx.ld_global_v4(g_src)) + list(ptx.ld_global_v4(g_src + 16))
                else:  # act of this launch: from L2, never a stale L1 line
                    words = list(ptx.ld_relaxed_gpu_v4(g_src)) + list(
                        ptx.ld_relaxed_gpu_v4(g_src + 16)
                    )
                todo.append((c, t, xb, words))
            for c, t, xb, words in todo:
                packed, scale = quantize16(words, self.ue8m0)
                if c < chunks:
                    s_dst = self.x_chunk_address(s_x, t, xb, cl)
                    ptx.st_shared_v4(s_dst, packed[0], packed[1], packed[2], packed[3])
                    if cl == 0:
                        ptx.st_shared_f32(s_xsc + (t * self.x_blocks_max + xb) * 4, scale)

    @cute.jit
    def quantize_x_across_cluster(self, g_x: Int64, s_base: Int32, cta: Int32, warp, lane):
        """share_x: quantize x once per cluster. Chunk c ((token c % T, K block c // T)) is
        rank c % C's: it stores it in its own shared memory and sends it to the other CTAs of
        the cluster with st.async, counted on their x mbarriers; every CTA then waits on its
        own for the others' chunks. x is laid out by K block (kb_first 0) in every CTA."""
        T = self.tokens
        C = self.cluster
        W = self.warps
        chunks = T * self.x_blocks_max
        s_x = s_base + self.smem_x
        s_xsc = s_base + self.smem_xscales
        bar = s_base + self.smem_x_bar
        rank = cta % C
        sub = lane >> 3
        cl = lane & 7
        # Every CTA of the cluster has made its x mbarrier (its entry arrive) before any
        # remote store; waited for before the loads, which then stay in flight together.
        ptx.trap_unless_cluster_size(C)
        ptx.cluster_wait()
        passes = self.x_passes
        for first in cutlass.range_constexpr(0, passes, X_PASSES_MAX):
            todo = []
            for j in cutlass.range_constexpr(first, min(passes, first + X_PASSES_MAX)):
                c = ((j * W + warp) * 4 + sub) * C + rank
                cc = cutlass.min(c, chunks - 1)  # past the end: a valid re-read, not stored
                t = cc % T
                xb = cc // T  # tma: slots past K repeat its first blocks
                kb = xb
                if cutlass.const_expr(self.tma):  # noqa: SIM102 (compile-time, then runtime)
                    if kb >= self.kblocks:
                        kb = kb - self.kblocks
                g_src = g_x + Int64((t * self.k + kb * BLOCK + cl * 16) * 2)
                words = list(ptx.ld_global_v4(g_src)) + list(ptx.ld_global_v4(g_src + 16))
                todo.append((c, t, xb, words))
            for c, t, xb, words in todo:
                packed, scale = quantize16(words, self.ue8m0)
                if c < chunks:
                    s_dst = self.x_chunk_address(s_x, t, xb, cl)
                    s_scale = s_xsc + (t * self.x_blocks_max + xb) * 4
                    ptx.st_shared_v4(s_dst, packed[0], packed[1], packed[2], packed[3])
                    for d in cutlass.range_constexpr(1, C):
                        r = (rank + d) % C
                        ptx.st_async_v4(
                            ptx.mapa_shared(s_dst, r), packed[0], packed[1], packed[2],
                            packed[3], ptx.mapa_shared(bar, r),
                        )  # fmt: skip
                    if cl == 0:
                        ptx.st_shared_f32(s_scale, scale)
                        for d in cutlass.range_constexpr(1, C):
                            r = (rank + d) % C
                            ptx.st_async_f32(
                                ptx.mapa_shared(s_scale, r), scale, ptx.mapa_shared(bar, r)
                            )
        ptx.mbarrier_wait(bar, Int32(0))  # the others' chunks (our own: the CTA barrier)

    # ------------------------------------------------------------------ epilogue warp

    @cute.jit
    def finish(
        self,
        g_out: Int64,
        g_work: Int64,
        s_base: Int32,
        cta: Int32,
        b0: Int32,
        b1: Int32,
        lane: Int32,
    ):
        """Take each tile share's warp partials in the consumers' order, add them (warps in
        order), and store the tile (the CTA owns it) or reduce it across CTAs."""
        KB = self.kblocks
        W = self.warps
        s_part = s_base + self.smem_partials
        cute.arch.griddepcontrol_wait()  # out and the workspace: after the previous kernel
        piece = Int32(0)
        for i_seg in cutlass.range(3, unroll=1):  # a runtime loop: one copy of the body
            start, stop = self.segment(b0, b1, i_seg)
            pos = start
            while pos < stop:
                tile = pos // KB
                buf = piece % PARTIAL_BUFFERS
                ptx.mbarrier_wait(self.handed_bar(s_base, buf), (piece // PARTIAL_BUFFERS) & 1)
                s_src = s_part + buf * W * SLOT_BYTES + lane * 16
                v = ptx.ld_shared_v4_f32(s_src)
                s0, s1, s2, s3 = v[0], v[1], v[2], v[3]
                for w in cutlass.range_constexpr(1, W):
                    v = ptx.ld_shared_v4_f32(s_src + w * SLOT_BYTES)
                    s0 = s0 + v[0]
                    s1 = s1 + v[1]
                    s2 = s2 + v[2]
                    s3 = s3 + v[3]
                ptx.mbarrier_arrive(self.taken_bar(s_base, buf))
                first = tile * KB
                owned = Int32(0)
                if first >= b0:  # noqa: SIM102 (runtime conditions: kept apart)
                    if first + KB <= b1:
                        owned = Int32(1)
                if owned != 0:
                    self.epilogue(g_out, g_work, tile, lane, s0, s1, s2, s3)
                elif cutlass.const_expr(self.cluster == 0):
                    self.reduce_split_tile(g_out, g_work, cta, b0, tile, lane, s0, s1, s2, s3)
                elif cutlass.const_expr(self.cluster > 1):  # (clusters of 1 split no tile)
                    self.meet_in_cluster(
                        g_out, g_work, s_base, cta, b0, b1, tile, lane, s0, s1, s2, s3
                    )
                pos = cutlass.min(first + KB, stop)
                if piece == 0:  # noqa: SIM102 (runtime conditions: kept apart)
                    if lane == 0:
                        self.stamp(g_work, cta, 6)
                piece = piece + 1
        if lane == 0:
            self.stamp(g_work, cta, 7)

    @cute.jit
    def meet_in_cluster(
        self,
        g_out: Int64,
        g_work: Int64,
        s_base: Int32,
        cta: Int32,
        b0: Int32,
        b1: Int32,
        tile: Int32,
        lane: Int32,
        s0: Float32,
        s1: Float32,
        s2: Float32,
        s3: Float32,
    ):
        """Cluster form, a tile split between CTAs of our cluster: its owner (the rank that
        holds its first block) waits for the others' partials on its mbarrier, adds them in
        rank order after its own and stores the tile; the others send theirs into its
        shared memory with st.async (counted on that mbarrier: no fence, no workspace)."""
        C = self.cluster
        KB = self.kblocks
        rank = cta % C
        s_recv = s_base + self.smem_received + lane * 16
        bar = s_base + self.smem_split_bar
        if tile * KB >= b0:
            senders = self.split_senders(cta, b0, b1)
            ptx.mbarrier_wait(bar, Int32(0))
            for i in cutlass.range(senders, unroll=1):
                v = ptx.ld_shared_v4_f32(s_recv + i * SLOT_BYTES)
                s0 = s0 + v[0]
                s1 = s1 + v[1]
                s2 = s2 + v[2]
                s3 = s3 + v[3]
            self.epilogue(g_out, g_work, tile, lane, s0, s1, s2, s3)
        else:
            t0, nt = self.cluster_tiles_of(cta // C)
            first = tile * KB - t0 * KB  # the tile's first block, in the cluster
            owner = rank - 1
            while self.cluster_rank_start(nt * KB, owner) > first:
                owner = owner - 1
            ptx.trap_unless_cluster_size(C)
            ptx.cluster_wait()  # every CTA of the cluster has made its mbarrier
            dst = ptx.mapa_shared(s_recv + (rank - owner - 1) * SLOT_BYTES, owner)
            ptx.st_async_v4_f32(dst, s0, s1, s2, s3, ptx.mapa_shared(bar, owner))

    @cute.jit
    def reduce_split_tile(
        self,
        g_out: Int64,
        g_work: Int64,
        cta: Int32,
        b0: Int32,
        tile: Int32,
        lane: Int32,
        s0: Float32,
        s1: Float32,
        s2: Float32,
        s3: Float32,
    ):
        """A tile shared with other CTAs: our partial into our workspace slot (slot 0 for
        the range's first tile, 1 for its last), then the tile's arrival counter; the last
        to arrive adds every slot in CTA order, resets the counter and stores the tile."""
        KB = self.kblocks
        first = tile * KB
        which = Int32(0)
        if tile != b0 // KB:
            which = Int32(1)
        g_cnt = g_work + Int64(self.ctas * 2 * SLOT_BYTES) + Int64(tile * 4)
        g_slot = g_work + Int64(((cta * 2 + which) * 32 + lane) * 16)
        ptx.st_global_v4_f32(g_slot, s0, s1, s2, s3)
        c_lo = self.cta_of(first)
        c_hi = self.cta_of(first + KB - 1)
        # Every lane releases its own slot store with its own arrival: 32 per CTA.
        old = ptx.atom_add_acq_rel_gpu(g_cnt, Int32(1))
        last = cute.arch.vote_ballot_sync(old == (c_hi - c_lo + 1) * 32 - 1)
        if last != 0:
            # Last to arrive: every slot of the tile is written; the fence makes them
            # visible to every lane (one lane's atomic observed all the others').
            ptx.fence_acq_rel_gpu()
            if lane == 0:
                ptx.st_relaxed_gpu_u32(g_cnt, Int32(0))
            r0 = Float32(0.0)
            r1 = Float32(0.0)
            r2 = Float32(0.0)
            r3 = Float32(0.0)
            for c0 in cutlass.range(c_lo, c_hi + 1, _SLOT_BATCH, unroll=1):
                got = []  # a batch of slots in flight at once, added in CTA order
                for j in cutlass.range_constexpr(_SLOT_BATCH):
                    c = cutlass.min(c0 + j, c_hi)
                    w_c = Int32(0)
                    if tile != self.range_start(c) // KB:
                        w_c = Int32(1)
                    addr = g_work + Int64(((c * 2 + w_c) * 32 + lane) * 16)
                    got.append(ptx.ld_relaxed_gpu_v4_f32(addr))
                for j in cutlass.range_constexpr(_SLOT_BATCH):
                    if c0 + j <= c_hi:
                        r0 = r0 + got[j][0]
                        r1 = r1 + got[j][1]
                        r2 = r2 + got[j][2]
                        r3 = r3 + got[j][3]
            self.epilogue(g_out, g_work, tile, lane, r0, r1, r2, r3)

    @cute.jit
    def epilogue(
        self, g_out: Int64, g_work: Int64, tile: Int32, lane: Int32, s0: Float32, s1: Float32,
        s2, s3,
    ):  # fmt: skip
        """Lane (g, q) holds A rows g, g+8 x tokens 2q, 2q+1: act (SwiGLU) or out, in BF16;
        with ``release_at``, every lane then announces its stores (a release add)."""
        T = self.tokens
        g = lane >> 2
        q = lane & 3
        lo = (s0, s1)
        hi = (s2, s3)
        for c in cutlass.range_constexpr(2):
            t = q * 2 + c
            if t < T:
                if cutlass.const_expr(self.swiglu):
                    g_dst = g_out + Int64((t * self.out_cols + tile * 8 + g) * 2)
                    ptx.st_global_b16(g_dst, ptx.cvt_bf16(swiglu(lo[c], hi[c], self.limit)))
                else:
                    g_dst = g_out + Int64((t * self.out_cols + tile * TILE_ROWS + g) * 2)
                    ptx.st_global_b16(g_dst, ptx.cvt_bf16(lo[c]))
                    ptx.st_global_b16(g_dst + 16, ptx.cvt_bf16(hi[c]))
        if cutlass.const_expr(self.release_at is not None):
            ptx.red_add_release_gpu(g_work + Int64(self.release_at), Int32(1))


def compile_cubin(params: StreamParams, arch: str):
    """Compile one specialization for ``arch`` (e.g. "sm_90a") on any machine, GPU or not.

    Returns a KernelBinary with the five pointer parameters (out, x, w, w_scale, workspace).
    """
    from mlpjit.jit.binary import KernelBinary, KernelParam

    kern = Fp8Stream(params)

    fake = row_major_tensor

    m_out = fake(cutlass.BFloat16, (kern.tokens, kern.out_cols))
    m_x = fake(cutlass.BFloat16, (kern.tokens, kern.k))
    m_w = fake(cutlass.Float8E4M3FN, (kern.rows, kern.k))
    m_ws = fake(cutlass.Float32, ((kern.rows + BLOCK - 1) // BLOCK, kern.kblocks))
    m_work = fake(cutlass.Uint8, (kern.workspace_bytes,))
    stream = cute.runtime.make_fake_stream()
    tensors = [m_out, m_x, m_w, m_ws, m_work]
    program = kern
    if kern.tma:
        tensors.append(fake(cutlass.Uint8, (MAP_BYTES,)))
        program = kern.with_map
    cubin, symbol = compile_to_cubin(program, *tensors, stream, arch=arch)
    return KernelBinary(
        cubin=cubin,
        symbol=symbol,
        grid=kern.grid,
        block=kern.block,
        smem_bytes=kern.smem_bytes,
        pdl=True,
        params=tuple(KernelParam(name, "ptr") for name in kern.kernel_args),
        cluster=(kern.cluster_ctas, 1, 1),
    )
