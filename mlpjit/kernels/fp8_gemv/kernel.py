"""FP8 block-scaled GEMV (+ fused SwiGLU) for decode, in CuTe DSL.

out[tokens, rows] = bf16(quant(x)[tokens, k] . w[rows, k]^T) with 128x128 float32 weight
block scales and per-(token, 128-group) activation scales computed in the kernel by the
stock rule. With ``swiglu`` the CTA pairs gate row j with up row rows/2 + j and writes
act[tokens, rows/2] = bf16(silu(bf16 gate) * bf16 up) directly.

Shape of the work: a CTA owns ``tiles`` tiles of 16 weight rows over its K (all of K, or
one of ``splits`` equal parts); one warp per (tile, ``slices_per_warp`` consecutive
``slice_k``-K slices) issues one m16n8k32 e4m3 mma per 32 K with the tokens as the 8 B
columns. Weights are loaded before griddepcontrol.wait (PDL): per slice, the first
``in_regs`` 64-K steps into registers (L2 evict-first hint), the rest by cp.async into
shared memory (no hint: see ptx.cp_async_cg_16); ``late_steps`` of them after x's loads, or
with ``paced`` only that many at a time until the wait returns, so that x does not queue
behind the whole share. With ``cluster`` > 1 the CTAs of a thread
block cluster quantize x together (each a share, written to all of them through
distributed shared memory; with ``send_x``, sent by st.async counted on each one's
mbarrier). With ``splits`` > 1 the K splits of a row tile are the CTAs of
one cluster, each quantizing only its part of x; the others send their fp32 partials into
the first one's shared memory (st.async counted on its mbarrier; in a persistent grid, whose
slots every tile reuses, written and ordered by cluster barriers), and it adds them in split
order and runs the epilogue: a fixed order (bit-identical results) with no workspace in
global memory to reset or to share between streams.

Nothing here is imported by ``import mlpjit``; the compile manager imports this module on
a cache miss and calls :func:`compile_cubin`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from mlpjit.kernels import ptx
from mlpjit.kernels.cubin import compile_to_cubin, launch_options
from mlpjit.kernels.fp8_gemv.params import (
    GROUP,
    KERNEL_ARGS,
    STEP,
    TRACE_NAMES,
    TRACE_POINTS,
    GemvParams,
    split_slots,
)
from mlpjit.kernels.numerics import quantize16, swiglu

__all__ = ["Fp8Gemv", "compile_cubin"]


class Fp8Gemv:
    """One specialization of the kernel: every shape and tuning fact is a Python constant,
    read from its GemvParams (validated there)."""

    def __init__(self, params: GemvParams) -> None:
        if not isinstance(params, GemvParams):
            raise ValueError(f"params must be a GemvParams, got {type(params).__name__}")
        self.params = params

    def __getattr__(self, name: str) -> Any:
        # self.rows, self.warps, self.smem_bytes, ...: the params' fields and geometry.
        if name == "params":  # not set yet (e.g. a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.params, name)

    # ------------------------------------------------------------------ host side

    @cute.jit
    def __call__(
        self,
        m_out: cute.Tensor,
        m_x: cute.Tensor,
        m_w: cute.Tensor,
        m_ws: cute.Tensor,
        stream: Any,
    ):
        self.kernel(m_out, m_x, m_w, m_ws).launch(stream=stream, **self.launch_options())

    def launch_options(self) -> dict:
        """The launch's grid, block, shared memory, PDL, launch bound and cluster."""
        return launch_options(
            self.ctas, self.threads, self.smem_bytes, self.ctas_per_sm, self.cluster_ctas
        )

    # ------------------------------------------------------------------ device side

    @cute.kernel
    def kernel(self, m_out: cute.Tensor, m_x: cute.Tensor, m_w: cute.Tensor, m_ws: cute.Tensor):
        self.body(m_out, m_x, m_w, m_ws)

    @cute.jit
    def body(self, m_out: cute.Tensor, m_x: cute.Tensor, m_w: cute.Tensor, m_ws: cute.Tensor):
        """The kernel."""
        T = self.tokens
        K = self.k
        CG = self.cta_groups
        GS = self.slice_groups
        SL = self.slice_k
        TL = self.tiles

        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        lane = tid & 31
        warp = tid >> 5
        tile = warp % TL
        SPW = self.spw
        slc0 = (warp // TL) * SPW  # the warp's first slice of the CTA's K; it owns SPW in a row
        g = lane >> 2
        q = lane & 3
        # K split: CTA rank `split` of its cluster takes K [split * kc, (split + 1) * kc) of
        # row tile `blk`.
        blk0 = cta
        split = Int32(0)
        if cutlass.const_expr(self.splits > 1):
            blk0 = cta // self.splits
            split = cta % self.splits

        smem = cutlass.memory.SmemAllocator()
        s_base = smem.allocate(self.smem_bytes, byte_alignment=128).toint()
        s_wgt = s_base
        s_act = s_base + self.smem_weights
        s_xsc = s_act + self.smem_act
        s_red = s_base + self.smem_reduce_offset
        s_bar = s_base + self.smem_mbarrier

        g_out = Int64(m_out.iterator.toint())
        self.stamp(g_out, tid, cta, "start")
        g_x = Int64(m_x.iterator.toint())
        g_w = Int64(m_w.iterator.toint())
        g_ws = Int64(m_ws.iterator.toint())
        row0, row1 = self.tile_rows(blk0, tile, g)
        k_lane = slc0 * SL + q * 16  # slice s of the warp: + s * SL
        grp0 = Int32(0)  # the split's first 128-group of K
        if cutlass.const_expr(self.splits > 1):
            g_x = g_x + Int64(split * (self.kc * 2))  # x row t of this split: + t * k * 2
            grp0 = split * CG
            k_lane = k_lane + split * self.kc
        g_a0 = g_w + Int64(row0) * K + Int64(k_lane)
        g_a1 = g_w + Int64(row1) * K + Int64(k_lane)

        # PDL trigger: the next kernel may launch once every CTA of this grid has passed it.
        # early_launch: at entry, so the next kernel's CTAs (where they fit) stream their
        # weights while this one still does; otherwise after the wait, as usual.
        if cutlass.const_expr(self.early_launch):
            cute.arch.griddepcontrol_launch_dependents()
        # K splits sent with st.async (send_splits): the first split's mbarrier counts them.
        split_barrier = self.splits > 1 and not self.persistent
        # send_x: the others' shares of x sent with st.async, counted on our mbarrier.
        x_barrier = self.send_x
        if cutlass.const_expr(self.cluster_ctas > 1 and not (split_barrier or x_barrier)):
            ptx.cluster_arrive_relaxed()  # "started": others may write our smem after the wait
        # ---- weights in flight before the dependency wait (they never depend on it)
        policy = ptx.createpolicy_evict_first()
        # Per slice s of the warp: register steps r_a*[s], staged slots from
        # s_stage + s * staged KB, weight scales r_ws*[s]; cp.async groups in (s, step) order.
        r_a0 = [[] for _ in range(SPW)]
        r_a1 = [[] for _ in range(SPW)]
        for s in cutlass.range_constexpr(SPW):
            for st in cutlass.range_constexpr(self.in_regs):
                r_a0[s].append(ptx.ld_global_nc_v4_hint(g_a0 + (s * SL + st * STEP), policy))
                r_a1[s].append(ptx.ld_global_nc_v4_hint(g_a1 + (s * SL + st * STEP), policy))
        s_stage = s_wgt + (warp * SPW * self.staged) * 1024 + lane * 16
        warp_staged = SPW * self.staged  # the warp's staged steps, slice after slice
        early = warp_staged - self.late_steps
        if cutlass.const_expr(self.paced):
            early = self.paced
        self.request_staged(s_stage, g_a0, g_a1, 0, early)
        late = (s_stage, g_a0, g_a1, early, warp_staged, True)  # once x's loads are out
        if cutlass.const_expr(self.paced):
            s_flag = s_base + self.smem_flag
            requested = Int32(early)  # the warp's staged steps requested so far
            # Warp 0 waits for the previous grid (below) and requests all of its steps now.
            if warp == 0:
                self.request_staged(s_stage, g_a0, g_a1, early, warp_staged)
                requested = Int32(warp_staged)
            if tid == 0:
                ptx.st_volatile_shared_u32(s_flag, Int32(0))
        r_ws0, r_ws1 = self.weight_scales(g_ws, row0, row1, slc0, grp0)
        if cutlass.const_expr(split_barrier):
            # Made before our arrive, so no other split can signal it earlier; after the
            # weight loads, so nothing delays them.
            nbytes = split_slots(TL, self.splits)
            ptx.mbarrier_init_expect_tx_if_zero(s_bar, tid | split, nbytes)
            ptx.cluster_arrive_relaxed()  # "started": others may send to us after the wait
        if cutlass.const_expr(x_barrier):
            # The same, for the bytes of x the other CTAs of the cluster send us.
            ptx.mbarrier_init_expect_tx_if_zero(s_bar, tid, self.shared_x_bytes())
            ptx.cluster_arrive_relaxed()  # "started": others may send to us after the wait
        self.stamp(g_out, tid, cta, "issued")

        if cutlass.const_expr(self.paced):
            cute.arch.sync_threads()  # the flag is 0 before anyone reads it
            requested = self.pace(s_stage, g_a0, g_a1, s_flag, requested)
            late = (*late, requested)
        cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(self.paced):  # noqa: SIM102 (compile time, then run time)
            if tid == 0:
                ptx.st_volatile_shared_u32(s_flag, Int32(1))
        self.stamp(g_out, tid, cta, "waited")
        if cutlass.const_expr(not self.early_launch):
            cute.arch.griddepcontrol_launch_dependents()

        if cutlass.const_expr(self.cluster > 1):
            self.quantize_across_cluster(g_x, s_act, s_xsc, s_bar, warp, lane, late)
        elif cutlass.const_expr(self.chunk_lanes == 32):
            # ---- quantize x once per CTA: warp (tile i, slice s) takes tokens i, i+tiles, ...
            # All of a warp's x loads are issued before the first is consumed, so the global
            # round trips overlap (ptxas still sinks some of them when registers run short).
            per_warp = (T + TL - 1) // TL
            words = [
                self.load_chunk(g_x, self.token_of(tile, j), slc0 + s, lane)
                for s in range(SPW)
                for j in range(per_warp)
            ]
            self.request_staged(*late)
            for s in cutlass.range_constexpr(SPW):
                for j in cutlass.range_constexpr(per_warp):
                    word = words[s * per_warp + j]
                    self.quantize_if_valid(word, s_act, s_xsc, tile + j * TL, slc0 + s, lane)
            cute.arch.sync_threads()
        else:
            self.quantize_short_slices(g_x, s_act, s_xsc, tile, slc0, lane, late)
            cute.arch.sync_threads()
        self.stamp(g_out, tid, cta, "x ready")

        # ---- main loop per row tile, partial sums, epilogue
        t_b = cutlass.min(g, T - 1)  # B columns >= tokens repeat the last token
        s_b = s_act + (slc0 * T + t_b) * SL  # slice s: + s * T * SL
        sw_b = (t_b & 1) << 2
        c0 = cutlass.min(q * 2, T - 1)
        c1 = cutlass.min(q * 2 + 1, T - 1)
        s_xs0 = s_xsc + (c0 * CG + slc0 * GS) * 4  # slice s: + s * GS * 4
        s_xs1 = s_xsc + (c1 * CG + slc0 * GS) * 4
        # Each warp writes its K-slice partials over its own last staged slot: only this lane
        # read those 16 bytes, and the slot's cp.async group is complete by then. (With
        # nothing staged the activation area is reused after a barrier; never persistent.)
        s_part = s_stage + (SPW * self.staged - 1) * 1024
        if cutlass.const_expr(not self.persistent):
            total = self.warp_sums(r_a0, r_a1, r_ws0, r_ws1, s_stage, s_b, q, sw_b, s_xs0, s_xs1)
            if cutlass.const_expr(self.staged == 0):
                cute.arch.sync_threads()
                s_part = s_act + tid * 16
            ptx.st_shared_v4_f32(s_part, total[0], total[1], total[2], total[3])
            cute.arch.sync_threads()
            self.stamp(g_out, tid, cta, "sums 1st")
            self.stamp(g_out, tid, cta, "sums last")
            if cutlass.const_expr(self.splits == 1):
                if warp < TL:
                    # Warp `tile` < tiles is slice 0 of its tile: s_part is where it reads from.
                    self.reduce_and_store(g_out, s_part, ptx.fresh_ctaid_x())
            else:
                blk = ptx.fresh_ctaid_x() // self.splits
                self.send_splits(g_out, s_part, s_red, s_bar, warp, lane, split, blk)
            self.stamp(g_out, tid, cta, "done")
        else:
            # Persistent: row tiles cta, cta + grid, ... Tile i+1's weights are requested
            # while tile i is computed: each register step and staged slot is refilled as soon
            # as tile i has consumed it (the last slot after the epilogue, since it holds the
            # partial sums meanwhile), so HBM streaming does not pause between tiles.
            # K-split: the cluster takes row tiles c, c + clusters, ... (c: its index).
            stride = self.ctas // self.splits
            for blk in cutlass.range(blk0, self.row_tiles, stride, unroll=1):
                nxt = blk + stride
                more = Int32(nxt < self.row_tiles)
                n_row0, n_row1 = self.tile_rows(nxt, tile, g)
                g_n0 = g_w + Int64(n_row0) * K + Int64(k_lane)
                g_n1 = g_w + Int64(n_row1) * K + Int64(k_lane)
                total = self.warp_sums(
                    r_a0, r_a1, r_ws0, r_ws1, s_stage, s_b, q, sw_b, s_xs0, s_xs1,
                    (g_n0, g_n1, more),
                )  # fmt: skip
                ptx.st_shared_v4_f32(s_part, total[0], total[1], total[2], total[3])
                cute.arch.sync_threads()
                if cutlass.const_expr(self.trace):
                    if blk == blk0:
                        self.stamp(g_out, tid, cta, "sums 1st")
                    self.stamp(g_out, tid, cta, "sums last")
                if cutlass.const_expr(self.splits == 1):
                    if warp < TL:
                        self.reduce_and_store(g_out, s_part, blk)
                else:
                    self.reduce_splits(g_out, s_part, s_red, warp, lane, split, blk)
                # Every reader of the partials is done: the last slot takes tile i+1's step.
                cute.arch.sync_threads()
                last = (SPW - 1) * SL + (self.steps - 1) * STEP
                ptx.cp_async_cg_16_if(s_part, g_n0 + last, more)
                ptx.cp_async_cg_16_if(s_part + 512, g_n1 + last, more)
                cute.arch.cp_async_commit_group()
                # The register steps and weight scales of tile i+1 only now: loaded earlier
                # they would be live through the main loop or the epilogue and spill at the
                # 80-register bound; the staged steps (most of the bytes) are in flight.
                r_a0 = [[] for _ in range(SPW)]
                r_a1 = [[] for _ in range(SPW)]
                for s in cutlass.range_constexpr(SPW):
                    for st in cutlass.range_constexpr(self.in_regs):
                        off = s * SL + st * STEP
                        r_a0[s].append(ptx.ld_global_nc_v4_hint_if(g_n0 + off, policy, more))
                        r_a1[s].append(ptx.ld_global_nc_v4_hint_if(g_n1 + off, policy, more))
                # Past the last tile: a valid re-read, never used.
                w_row0, w_row1 = self.tile_rows(cutlass.min(nxt, self.row_tiles - 1), tile, g)
                r_ws0, r_ws1 = self.weight_scales(g_ws, w_row0, w_row1, slc0, grp0)
            self.stamp(g_out, tid, cta, "done")

    @cute.jit
    def request_staged(
        self,
        s_stage: Int32,
        g_a0: Int64,
        g_a1: Int64,
        first: int,
        end: int,
        after_x: bool = False,
        requested=None,
    ):
        """cp.async the warp's staged steps [first, end) into their slots, one group per
        step; a warp's steps are numbered slice after slice (slice s, step j: s * staged + j),
        the order its groups commit in. ``after_x``: they follow x's loads. ``requested`` (a
        paced warp's count of steps it requested before the wait, at run time): the steps
        below it are not copied again, their groups left empty."""
        if cutlass.const_expr(after_x and first < end):
            # A warp barrier orders them after the x loads issued before this: without it
            # ptxas schedules the copies first, and x would wait behind them again.
            cute.arch.sync_warp()
        for n in cutlass.range_constexpr(first, end):
            s, j = divmod(n, self.staged)
            st = self.in_regs + j
            s_slot = s_stage + n * 1024
            src0 = g_a0 + (s * self.slice_k + st * STEP)
            src1 = g_a1 + (s * self.slice_k + st * STEP)
            if cutlass.const_expr(requested is None):
                ptx.cp_async_cg_16(s_slot, src0)
                ptx.cp_async_cg_16(s_slot + 512, src1)
            else:
                # Predicated, not branched: ptxas would place a branch after x's data
                # (stalling the copies). An empty group keeps the waits right: step n's
                # group is followed by SPW*staged-1-n groups, or by more for the first
                # `paced` steps (which then wait a little longer than they need to); a
                # persistent kernel's refills all come after these, as before.
                due = Int32(n >= requested)
                ptx.cp_async_cg_16_if(s_slot, src0, due)
                ptx.cp_async_cg_16_if(s_slot + 512, src1, due)
            cute.arch.cp_async_commit_group()

    @cute.jit
    def pace(self, s_stage: Int32, g_a0: Int64, g_a1: Int64, s_flag: Int32, requested: Int32):
        """Until warp 0 flags that the PDL wait returned, request the warp's staged step n
        (slice after slice) only once step n - paced has landed, so the warp keeps ``paced``
        steps in flight; returns the steps requested (warp 0: all of them, so it skips
        this)."""
        for n in cutlass.range_constexpr(self.paced, self.spw * self.staged):
            if requested == n:  # noqa: SIM102 (runtime conditions, kept apart)
                if ptx.ld_volatile_shared_u32(s_flag) == 0:
                    cute.arch.cp_async_wait_group(self.paced - 1)
                    if ptx.ld_volatile_shared_u32(s_flag) == 0:
                        self.request_staged(s_stage, g_a0, g_a1, n, n + 1)
                        requested = Int32(n + 1)
        return requested

    @cute.jit
    def stamp(self, g_out: Int64, tid: Int32, cta: Int32, name: str):
        """A trace build's %globaltimer stamp at point ``name`` (TRACE_NAMES) of this CTA,
        from its first thread (nothing otherwise); with the start stamp, the CTA's SM id in
        its last slot."""
        if cutlass.const_expr(self.trace):  # noqa: SIM102 (compile time, then run time)
            if tid == 0:
                base = g_out + Int64(self.trace_offset + cta * (TRACE_POINTS * 8))
                point = TRACE_NAMES.index(name)
                ptx.st_global_u64(base + point * 8, ptx.globaltimer())
                if cutlass.const_expr(point == 0):
                    ptx.st_global_u64(base + (TRACE_POINTS - 1) * 8, Int64(ptx.smid()))

    @cute.jit
    def weight_scales(self, g_ws: Int64, row0: Int32, row1: Int32, slc0: Int32, grp0: Int32):
        """Per slice of the warp (slc0: its first), the slice_k/128 float32 block scales of
        rows row0 and row1 (the same block unless SwiGLU pairs a gate row with its up row);
        grp0 is the split's first 128-group of K."""
        G = self.groups
        r_ws0 = []
        r_ws1 = []
        for s in cutlass.range_constexpr(self.spw):
            sc = (slc0 + s) * self.slice_groups
            if cutlass.const_expr(self.splits > 1):
                sc = sc + grp0
            r_ws0.append(self.block_scales(g_ws + Int64(((row0 >> 7) * G + sc) * 4)))
            if cutlass.const_expr(self.swiglu):
                r_ws1.append(self.block_scales(g_ws + Int64(((row1 >> 7) * G + sc) * 4)))
            else:
                r_ws1.append(r_ws0[s])
        return r_ws0, r_ws1

    @cute.jit
    def block_scales(self, addr: Int64):
        """The slice_groups consecutive float32 scales at addr, in one load (k is a multiple
        of slice_k, so addr is aligned to their size)."""
        if cutlass.const_expr(self.slice_groups == 4):
            return ptx.ld_global_nc_v4_f32(addr)
        elif cutlass.const_expr(self.slice_groups == 2):
            return ptx.ld_global_nc_v2_f32(addr)
        else:
            return (ptx.ld_global_nc_f32(addr),)

    @cute.jit
    def warp_sums(
        self,
        r_a0: list,
        r_a1: list,
        r_ws0: list,
        r_ws1: list,
        s_stage: Int32,
        s_b: Int32,
        q: Int32,
        sw_b: Int32,
        s_xs0: Int32,
        s_xs1: Int32,
        refill: tuple | None = None,
    ):
        """The warp's share of one row tile: slice_sums over each of its slices, added up.

        cp.async groups were committed in (slice, step) order, so slice s waits past the
        later slices' groups; a persistent kernel's refills keep SPW*staged-1 groups newer
        than any slot's. Only the warp's last slot is held back for the partial sums.
        """
        SPW = self.spw
        total = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]
        for s in cutlass.range_constexpr(SPW):
            slice_refill = None
            if cutlass.const_expr(refill is not None):
                g_n0, g_n1, more = refill
                slice_refill = (g_n0 + s * self.slice_k, g_n1 + s * self.slice_k, more)
            newer = (SPW - 1) * self.staged if refill is not None else (SPW - 1 - s) * self.staged
            total = self.slice_sums(
                total,
                r_a0[s],
                r_a1[s],
                (r_ws0[s], r_ws1[s]),
                s_stage + s * self.staged * 1024,
                s_b + s * self.tokens * self.slice_k,
                q,
                sw_b,
                s_xs0 + s * self.slice_groups * 4,
                s_xs1 + s * self.slice_groups * 4,
                slice_refill,
                newer,
                s == SPW - 1,
            )
        return total

    @cute.jit
    def slice_sums(
        self,
        total: list,
        r_a0: list,
        r_a1: list,
        r_ws: tuple,
        s_stage: Int32,
        s_b: Int32,
        q: Int32,
        sw_b: Int32,
        s_xs0: Int32,
        s_xs1: Int32,
        refill: tuple | None,
        newer_groups: int,
        hold_last: bool,
    ):
        """One slice of a row tile: slice_k/128 groups x (2 steps x 2 mmas), fp32 group sums,
        then the scales, added to ``total``.

        With ``refill`` = (next row-0 address, next row-1 address, predicate), each staged
        slot is reloaded with the next tile's step right after use, except the last one when
        ``hold_last`` (it takes the partial sums). ``newer_groups``: cp.async groups
        committed after this slice's, which the waits must not wait for.
        """
        r_ws0, r_ws1 = r_ws
        for grp in cutlass.range_constexpr(self.slice_groups):
            acc = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]
            for sub in cutlass.range_constexpr(2):
                st = grp * 2 + sub
                j = st - self.in_regs
                if cutlass.const_expr(st < self.in_regs):
                    a0 = r_a0[st]
                    a1 = r_a1[st]
                else:
                    # Groups commit in step order; a persistent kernel commits one refill
                    # group per consumed step, so staged-1 newer groups are always pending
                    # (plus newer_groups of the warp's later slices).
                    newer = self.staged - 1 if refill is not None else self.staged - 1 - j
                    newer += newer_groups
                    cute.arch.cp_async_wait_group(newer)
                    a0 = ptx.ld_shared_v4(s_stage + j * 1024)
                    a1 = ptx.ld_shared_v4(s_stage + j * 1024 + 512)
                b = ptx.ld_shared_v4(s_b + (((st * 4 + q) ^ sw_b) * 16))
                acc = ptx.mma_m16n8k32_e4m3((a0[0], a1[0], a0[1], a1[1]), (b[0], b[1]), acc)
                acc = ptx.mma_m16n8k32_e4m3((a0[2], a1[2], a0[3], a1[3]), (b[2], b[3]), acc)
                if cutlass.const_expr(refill is not None):
                    g_n0, g_n1, more = refill
                    if cutlass.const_expr(self.in_regs <= st < self.steps - int(hold_last)):
                        ptx.cp_async_cg_16_if(s_stage + j * 1024, g_n0 + st * STEP, more)
                        ptx.cp_async_cg_16_if(s_stage + j * 1024 + 512, g_n1 + st * STEP, more)
                        cute.arch.cp_async_commit_group()
            xs0 = ptx.ld_shared_f32(s_xs0 + grp * 4)
            xs1 = ptx.ld_shared_f32(s_xs1 + grp * 4)
            total[0] = total[0] + acc[0] * (r_ws0[grp] * xs0)
            total[1] = total[1] + acc[1] * (r_ws0[grp] * xs1)
            total[2] = total[2] + acc[2] * (r_ws1[grp] * xs0)
            total[3] = total[3] + acc[3] * (r_ws1[grp] * xs1)
        return total

    @cute.jit
    def token_of(self, tile: Int32, j: int):
        """Token of a warp's j-th chunk, clamped to T-1 where tokens % tiles leaves it empty
        (the load then re-reads a valid row and the chunk is not quantized)."""
        t = tile + j * self.tiles
        if cutlass.const_expr(self.tokens % self.tiles):
            t = cutlass.min(t, self.tokens - 1)
        return t

    @cute.jit
    def load_chunk(self, g_x: Int64, t: Int32, slc: Int32, cl) -> list:
        """The 16 BF16 of x[t, slc*slice_k + 16*cl ..] as 8 words (two 16-byte loads); cl is
        the lane's place in its chunk (a chunk: one slice of one token)."""
        g_src = g_x + Int64((t * self.k + slc * self.slice_k + cl * 16) * 2)
        return list(ptx.ld_global_v4(g_src)) + list(ptx.ld_global_v4(g_src + 16))

    @cute.jit
    def quantize_short_slices(
        self,
        g_x: Int64,
        s_act: Int32,
        s_xsc: Int32,
        tile: Int32,
        slc0: Int32,
        lane: Int32,
        late: tuple,
    ):
        """The per-CTA quantization for slices shorter than 512: a chunk takes slice_k/16
        lanes, so a warp quantizes 32/(slice_k/16) tokens of its slice at once (warp of tile
        i: tokens i, i+tiles, ...); lanes past the last token re-read it and store nothing."""
        T = self.tokens
        TL = self.tiles
        lanes = self.chunk_lanes
        per_pass = 32 // lanes
        passes = ((T + TL - 1) // TL + per_pass - 1) // per_pass
        sub = lane // lanes
        cl = lane % lanes
        words = [
            self.load_chunk(g_x, cutlass.min(tile + (p * per_pass + sub) * TL, T - 1), slc0 + s, cl)
            for s in range(self.spw)
            for p in range(passes)
        ]
        self.request_staged(*late)
        for s in cutlass.range_constexpr(self.spw):
            for p in cutlass.range_constexpr(passes):
                t = tile + (p * per_pass + sub) * TL
                self.quantize_chunk(
                    words[s * passes + p], s_act, s_xsc, cutlass.min(t, T - 1), slc0 + s, cl,
                    valid=t < T,
                )  # fmt: skip

    @cute.jit
    def quantize_if_valid(self, words: list, s_act: Int32, s_xsc: Int32, t: Int32, slc, lane):
        """quantize_chunk for t < tokens; the check is static when tiles divides tokens."""
        # Not merged into one `or`: that would turn the static branch into a runtime one.
        if cutlass.const_expr(self.tokens % self.tiles == 0):  # noqa: SIM114
            self.quantize_chunk(words, s_act, s_xsc, t, slc, lane)
        elif t < self.tokens:
            self.quantize_chunk(words, s_act, s_xsc, t, slc, lane)

    def shared_x_chunks(self) -> tuple[int, int, int]:
        """(chunks, chunks per CTA, chunks per warp) of x shared over a cluster: the
        (token, 512-K) chunks, dealt round robin to the cluster's CTAs and their warps."""
        chunks = self.tokens * self.slices
        per_cta = (chunks + self.cluster - 1) // self.cluster
        return chunks, per_cta, (per_cta + self.warps - 1) // self.warps

    @cute.jit
    def shared_x_bytes(self):
        """Bytes of x this CTA receives from the others with send_x: the values and scales
        of every chunk its cluster rank does not quantize (rank r quantizes chunks r, r + N,
        ...); a constant where the cluster divides the chunks."""
        N = self.cluster
        chunks, _, _ = self.shared_x_chunks()
        per_chunk = self.slice_k + self.slice_groups * 4
        if cutlass.const_expr(chunks % N == 0):
            return (chunks - chunks // N) * per_chunk
        return (chunks - (chunks - ptx.cluster_ctarank() + (N - 1)) // N) * per_chunk

    @cute.jit
    def quantize_across_cluster(
        self, g_x: Int64, s_act: Int32, s_xsc: Int32, s_bar: Int32, warp, lane, late: tuple
    ):
        """Quantize x once per cluster instead of once per CTA: the (token, 512-K) chunks are
        dealt round robin to the cluster's CTAs, and each quantized chunk and its scales are
        written into the shared memory of every CTA of the cluster (DSMEM; with send_x, sent
        to the others with st.async, counted on their mbarriers at s_bar).

        Reading and quantizing x costs more with more tokens; the cluster splits that cost
        over its CTAs (docs/KERNEL_NOTES.md, variant 14).
        """
        N = self.cluster
        T = self.tokens
        chunks, per_cta, per_warp = self.shared_x_chunks()
        always_valid = per_cta * N == chunks and per_warp * self.warps == per_cta
        rank = ptx.cluster_ctarank()
        # Before any remote store (off the weight loads' path): clusters of the size planned.
        ptx.trap_unless_cluster_size(N)
        # Every CTA of the cluster has started (its entry arrive): its smem may be written
        # (with send_x: its mbarrier is made).
        # Waited for before the x loads: after them, ptxas keeps every chunk live across the
        # barrier instead of quantizing while the later ones arrive (and spills).
        ptx.cluster_wait()
        sends = (s_bar, rank) if self.send_x else None
        todo = []
        for j in cutlass.range_constexpr(per_warp):
            c = (warp + j * self.warps) * N + rank
            if cutlass.const_expr(not always_valid):
                c = cutlass.min(c, chunks - 1)  # past the end: a valid re-read, not quantized
            todo.append((c, self.load_chunk(g_x, c % T, c // T, lane)))
        self.request_staged(*late)  # (late weight steps, if any: after x's loads)
        for j in cutlass.range_constexpr(per_warp):
            c, words = todo[j]
            if cutlass.const_expr(always_valid):  # noqa: SIM114 (static branch, see above)
                self.quantize_chunk(words, s_act, s_xsc, c % T, c // T, lane, sends=sends)
            elif (warp + j * self.warps) * N + rank < chunks:
                self.quantize_chunk(words, s_act, s_xsc, c % T, c // T, lane, sends=sends)
        if cutlass.const_expr(self.send_x):
            # Our own chunks (plain stores) from every warp, then the others' (their bytes
            # counted on our mbarrier: no release fence anywhere).
            cute.arch.sync_threads()
            ptx.mbarrier_wait(s_bar, Int32(0))
        else:
            # Release our remote writes, acquire everyone's: the whole x is then in our smem.
            # (The release costs a MEMBAR.ALL.GPU. send_x avoids it; st.async for every
            # store, our own too, was slower everywhere: docs/KERNEL_NOTES.md variant 34.)
            ptx.cluster_sync_acq_rel()

    @cute.jit
    def quantize_chunk(
        self,
        words: list,
        s_act: Int32,
        s_xsc: Int32,
        t: Int32,
        slc: Int32,
        lane,
        valid=None,
        sends=None,
    ):
        """Lane l (of its chunk) quantizes K = slc*slice_k + 16l .. +15 of token t; 8 lanes
        share a 128-group (numerics.quantize16). With a cluster, the result goes to the same
        place in every CTA's shared memory (``sends``: (mbarrier, own rank) with send_x).
        ``valid`` (a runtime predicate, or None for always): whether to store.
        """
        packed, scale = quantize16(words, self.ue8m0)
        chunk = lane ^ ((t & 1) << 2)  # swizzle odd tokens: conflict-free B reads
        s_dst = s_act + (slc * self.tokens + t) * self.slice_k + chunk * 16
        GS = self.slice_groups
        if cutlass.const_expr(valid is not None):
            if valid:
                ptx.st_shared_v4(s_dst, packed[0], packed[1], packed[2], packed[3])
                if lane & 7 == 0:
                    s_scale = s_xsc + (t * self.cta_groups + slc * GS + (lane >> 3)) * 4
                    ptx.st_shared_f32(s_scale, scale)
        elif cutlass.const_expr(self.cluster == 1):
            ptx.st_shared_v4(s_dst, packed[0], packed[1], packed[2], packed[3])
            if lane & 7 == 0:
                ptx.st_shared_f32(s_xsc + (t * self.cta_groups + slc * GS + (lane >> 3)) * 4, scale)
        elif cutlass.const_expr(sends is not None):
            s_scale = s_xsc + (t * self.cta_groups + slc * GS + (lane >> 3)) * 4
            s_bar, me = sends
            ptx.st_shared_v4(s_dst, packed[0], packed[1], packed[2], packed[3])
            for d in cutlass.range_constexpr(1, self.cluster):
                r = (me + d) % self.cluster
                dst, bar = ptx.mapa_shared(s_dst, r), ptx.mapa_shared(s_bar, r)
                ptx.st_async_v4(dst, packed[0], packed[1], packed[2], packed[3], bar)
            if lane & 7 == 0:
                ptx.st_shared_f32(s_scale, scale)
                for d in cutlass.range_constexpr(1, self.cluster):
                    r = (me + d) % self.cluster
                    dst, bar = ptx.mapa_shared(s_scale, r), ptx.mapa_shared(s_bar, r)
                    ptx.st_async_f32(dst, scale, bar)
        else:
            # (Not hoisted above the branch: that reorders the plain kernel's SASS.)
            s_scale = s_xsc + (t * self.cta_groups + slc * GS + (lane >> 3)) * 4
            for rank in cutlass.range_constexpr(self.cluster):
                dst = ptx.mapa_shared(s_dst, Int32(rank))
                ptx.st_cluster_v4(dst, packed[0], packed[1], packed[2], packed[3])
            if lane & 7 == 0:
                for rank in cutlass.range_constexpr(self.cluster):
                    ptx.st_cluster_f32(ptx.mapa_shared(s_scale, Int32(rank)), scale)

    @cute.jit
    def tile_rows(self, cta: Int32, tile: Int32, g: Int32):
        """Weight rows of A rows g and g+8 (SwiGLU: gate row = output column, and its up row)."""
        if cutlass.const_expr(self.swiglu):
            row0 = cta * (8 * self.tiles) + tile * 8 + g
            row1 = row0 + self.rows // 2
        else:
            row0 = cta * (16 * self.tiles) + tile * 16 + g
            row1 = row0 + 8
        return row0, row1

    @cute.jit
    def split_slot(self, s_red: Int32, warp: Int32, lane: Int32) -> Int32:
        """Where the K splits meet: trap unless launched in clusters of the splits, wait at
        the cluster barrier (every CTA of the cluster has arrived: started, or done with the
        slots), and return this lane's slot for split 1 in s_red (split r: + (r - 1) *
        tiles * 512)."""
        ptx.trap_unless_cluster_size(self.splits)
        ptx.cluster_wait()
        return s_red + (warp * 32 + lane) * 16

    @cute.jit
    def send_splits(
        self,
        g_out: Int64,
        s_part: Int32,
        s_red: Int32,
        s_bar: Int32,
        warp: Int32,
        lane: Int32,
        split: Int32,
        blk: Int32,
    ):
        """The K splits of row tile ``blk`` meet in the cluster's first CTA (split 0), once
        (not persistent): the others send their tile sums into its s_red slots with st.async,
        counted on its mbarrier; it waits for the count, adds them in split order and runs
        the epilogue. No cluster barrier after the entry one: its release would be a
        MEMBAR.ALL.GPU in every CTA, and the other splits exit as soon as they have sent."""
        TL = self.tiles
        # (Its entry arrive made the first CTA's mbarrier: the wait below pairs with it.)
        slot = self.split_slot(s_red, warp, lane)
        if split != 0:  # noqa: SIM102 (a runtime `and` of two conditions: kept apart)
            if warp < TL:
                acc = self.tile_partials(s_part)
                dst = ptx.mapa_shared(slot + (split - 1) * (TL * 512), Int32(0))
                bar = ptx.mapa_shared(s_bar, Int32(0))
                ptx.st_async_v4_f32(dst, acc[0], acc[1], acc[2], acc[3], bar)
        elif warp < TL:
            ptx.mbarrier_wait(s_bar, Int32(0))
            self.reduce_and_store(g_out, s_part, blk, slot)

    @cute.jit
    def reduce_splits(
        self,
        g_out: Int64,
        s_part: Int32,
        s_red: Int32,
        warp: Int32,
        lane: Int32,
        split: Int32,
        blk: Int32,
    ):
        """The K splits of row tile ``blk`` of a persistent kernel meet in the cluster's first
        CTA (split 0): the others write their tile sums into its s_red slots, and it adds
        them in split order (the same order whichever CTA finishes first) and runs the
        epilogue. The slots are reused by the next tile, hence the barriers."""
        TL = self.tiles
        # (The wait pairs with the entry arrive, or with the previous tile's last arrive:
        # its slots were read.)
        slot = self.split_slot(s_red, warp, lane)
        if split != 0:  # noqa: SIM102 (a runtime `and` of two conditions: kept apart)
            if warp < TL:
                acc = self.tile_partials(s_part)
                dst = ptx.mapa_shared(slot + (split - 1) * (TL * 512), Int32(0))
                ptx.st_cluster_v4_f32(dst, acc[0], acc[1], acc[2], acc[3])
        # Release our slot writes, acquire everyone's.
        ptx.cluster_sync_acq_rel()
        if split == 0:  # noqa: SIM102
            if warp < TL:
                self.reduce_and_store(g_out, s_part, blk, slot)
        ptx.cluster_arrive_release()  # our slot reads are done (the leader's)

    @cute.jit
    def tile_partials(self, s_part: Int32) -> list:
        """Sum of the tile's k/splits/slice_k/spw warp partials (s_part: this lane's in the
        tile's first warp; warp w of the tile is w * tiles warps further on)."""
        # Bytes per warp of the partials: its staged weights, or 32 lanes x 16 B of s_act.
        warp_stride = self.spw * self.staged * 1024 if self.staged else 32 * 16
        acc = list(ptx.ld_shared_v4_f32(s_part))
        for s in cutlass.range_constexpr(1, self.warps_per_tile):
            part = ptx.ld_shared_v4_f32(s_part + s * self.tiles * warp_stride)
            acc = [acc[i] + part[i] for i in range(4)]
        return acc

    @cute.jit
    def reduce_and_store(self, g_out: Int64, s_part: Int32, blk: Int32, s_slots=None):
        """Sum the tile's partials (tile_partials, then the other splits' from ``s_slots``
        in split order) and store the tile; lane (g, q) holds rows g, g+8 x tokens 2q, 2q+1.

        blk: the row tile (the CTA index unless persistent or split).
        """
        T = self.tokens
        # Indices are re-derived from fresh special-register reads: holding them across the
        # main loop costs registers (ptxas spilled row0 at the 80-register bound).
        tid = ptx.fresh_tid_x()
        lane = tid & 31
        row0, _ = self.tile_rows(blk, tid >> 5, lane >> 2)
        q = lane & 3
        acc = self.tile_partials(s_part)
        if cutlass.const_expr(s_slots is not None):
            for r in cutlass.range_constexpr(1, self.splits):
                part = ptx.ld_shared_v4_f32(s_slots + (r - 1) * (self.tiles * 512))
                acc = [acc[i] + part[i] for i in range(4)]
        if cutlass.const_expr(self.swiglu):
            # Row g is the gate, row g+8 the matching up: act[t, row0] for t = 2q, 2q+1.
            for c in cutlass.range_constexpr(2):
                t = q * 2 + c
                if t < T:
                    val = swiglu(acc[c], acc[2 + c], self.limit)
                    g_dst = g_out + Int64((t * self.out_cols + row0) * 2)
                    ptx.st_global_b16(g_dst, ptx.cvt_bf16(val))
        else:
            for c in cutlass.range_constexpr(2):
                t = q * 2 + c
                if t < T:
                    g_dst = g_out + Int64((t * self.out_cols + row0) * 2)
                    ptx.st_global_b16(g_dst, ptx.cvt_bf16(acc[c]))
                    ptx.st_global_b16(g_dst + 16, ptx.cvt_bf16(acc[2 + c]))


def compile_cubin(params: GemvParams, arch: str):
    """Compile one specialization for ``arch`` (e.g. "sm_90a") on any machine, GPU or not.

    Returns a KernelBinary: cubin bytes, kernel symbol, grid/block/dynamic smem, PDL on, and
    the pointer parameters (out, x, w, w_scale) in order.
    """
    from mlpjit.jit.binary import KernelBinary, KernelParam

    gemv = Fp8Gemv(params)
    out_cols = gemv.out_cols
    fake = cute.runtime.make_fake_compact_tensor
    m_out = fake(cutlass.BFloat16, (gemv.tokens, out_cols), stride_order=(1, 0), assumed_align=16)
    m_x = fake(cutlass.BFloat16, (gemv.tokens, gemv.k), stride_order=(1, 0), assumed_align=16)
    m_w = fake(cutlass.Float8E4M3FN, (gemv.rows, gemv.k), stride_order=(1, 0), assumed_align=16)
    m_ws = fake(
        cutlass.Float32,
        ((gemv.rows + GROUP - 1) // GROUP, gemv.groups),
        stride_order=(1, 0),
        assumed_align=16,
    )
    stream = cute.runtime.make_fake_stream()
    cubin, symbol = compile_to_cubin(gemv, m_out, m_x, m_w, m_ws, stream, arch=arch)
    return KernelBinary(
        cubin=cubin,
        symbol=symbol,
        grid=gemv.grid,
        block=gemv.block,
        smem_bytes=gemv.smem_bytes,
        pdl=True,
        params=tuple(KernelParam(name, "ptr") for name in KERNEL_ARGS),
        cluster=(gemv.cluster_ctas, 1, 1),
    )


def _main() -> None:  # pragma: no cover - developer aid: python -m mlpjit.kernels.fp8_gemv.kernel
    import sys

    t0 = time.perf_counter()
    params = GemvParams(
        rows=3072, k=6144, tokens=8, tiles=1, in_regs=4, ctas_per_sm=1, swiglu=True,
        limit=None, ue8m0=True,
    )  # fmt: skip
    binary = compile_cubin(params, os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    sys.stdout.write(f"{binary.symbol} {len(binary.cubin)} B {time.perf_counter() - t0:.2f}s\n")


if __name__ == "__main__":  # pragma: no cover
    _main()
