"""A whole dense MLP layer in one kernel, in CuTe DSL: fp8_stream's gate_up (+ SwiGLU)
phase, then its down phase, in the same CTAs.

- One resident wave of ``sms`` CTAs; each phase cuts its own (tile, block) pairs into one
  equal range per CTA, so both are even whatever the shape.
- The producer warp requests gate_up's range into gate_up's ring and, as soon as the last
  of it is requested, down's range into down's ring: down's weights stream during gate_up's
  tail instead of after a kernel boundary (loaders never wait for act).
- The epilogue warp stores each act tile (its own, or the last arrival's of a split tile)
  and announces it: every lane adds one to the layer's act counter with release semantics.
- The consumer warps, done with gate_up, wait until the act counter holds every tile
  (one thread spins with acquire loads; the consumer barrier orders the others after it),
  quantize act (read from L2) and run down. The last CTA past the wait puts both counters
  back to zero, so the workspace needs no reset between calls or graph replays.
- Every CTA must be resident at once (a CTA waiting for act holds its SM): the grid is one
  CTA per SM and the caller checks the device has ``sms`` SMs free for it. No cooperative
  launch: it would give up the PDL overlap with the previous kernel.

Nothing here is imported by ``import mlpjit``; the compile manager imports this module on
a cache miss and calls :func:`compile_cubin`.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int64

from mlpjit.kernels import ptx
from mlpjit.kernels.blocks import BLOCK
from mlpjit.kernels.cubin import compile_to_cubin, launch_options, row_major_tensor
from mlpjit.kernels.fp8_layer.params import KERNEL_ARGS, LayerParams
from mlpjit.kernels.fp8_stream.kernel import Fp8Stream

__all__ = ["Fp8Layer", "compile_cubin"]


class Fp8Layer:
    """One specialization: the two phases are Fp8Stream objects over the layer's params."""

    def __init__(self, params: LayerParams) -> None:
        if not isinstance(params, LayerParams):
            raise ValueError(f"params must be a LayerParams, got {type(params).__name__}")
        self.params = params
        # Offsets from each phase's workspace to the layer's counters.
        self.gate_up = Fp8Stream(params.gate_up, release_at=params.work_counters)
        self.down = Fp8Stream(
            params.down,
            x_after=(params.work_counters - params.work_down, params.gate_up.tiles),
        )

    @cute.jit
    def __call__(
        self,
        m_out: cute.Tensor,
        m_act: cute.Tensor,
        m_x: cute.Tensor,
        m_w13: cute.Tensor,
        m_s13: cute.Tensor,
        m_w2: cute.Tensor,
        m_s2: cute.Tensor,
        m_work: cute.Tensor,
        stream: Any,
    ):
        p = self.params
        self.kernel(m_out, m_act, m_x, m_w13, m_s13, m_w2, m_s2, m_work).launch(
            stream=stream, **launch_options(p.ctas, p.threads, p.smem_bytes, ctas_per_sm=1)
        )

    @cute.kernel
    def kernel(
        self,
        m_out: cute.Tensor,
        m_act: cute.Tensor,
        m_x: cute.Tensor,
        m_w13: cute.Tensor,
        m_s13: cute.Tensor,
        m_w2: cute.Tensor,
        m_s2: cute.Tensor,
        m_work: cute.Tensor,
    ):
        W = self.params.warps
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        warp = tid >> 5
        lane = tid & 31

        smem = cutlass.memory.SmemAllocator()
        s_g = smem.allocate(self.params.smem_bytes, byte_alignment=128).toint()
        s_d = s_g + self.params.smem_down
        g_work = Int64(m_work.iterator.toint())
        w_g = g_work
        w_d = g_work + Int64(self.params.work_down)
        g_act = Int64(m_act.iterator.toint())
        bg0 = self.gate_up.range_start(cta)
        bg1 = self.gate_up.range_start(cta + 1)
        bd0 = self.down.range_start(cta)
        bd1 = self.down.range_start(cta + 1)

        if tid == 0:
            self.gate_up.stamp(w_g, cta, 0)
            self.gate_up.init_barriers(s_g)
            self.down.init_barriers(s_d)
            ptx.fence_mbarrier_init()
        cute.arch.sync_threads()

        if warp == W:
            no_map = Int64(0)  # (row copies: no tensor map)
            self.gate_up.produce(Int64(m_w13.iterator.toint()), no_map, s_g, bg0, bg1, lane)
            self.down.produce(Int64(m_w2.iterator.toint()), no_map, s_d, bd0, bd1, lane)
            if lane == 0:
                self.gate_up.stamp(w_g, cta, 5)
        elif warp == W + 1:
            self.gate_up.finish(g_act, w_g, s_g, cta, bg0, bg1, lane)
            self.down.finish(Int64(m_out.iterator.toint()), w_d, s_d, cta, bd0, bd1, lane)
        else:
            self.gate_up.consume(
                Int64(m_x.iterator.toint()), Int64(m_s13.iterator.toint()), w_g, s_g, cta,
                bg0, bg1, warp, lane,
            )  # fmt: skip
            self.down.consume(
                g_act, Int64(m_s2.iterator.toint()), w_d, s_d, cta, bd0, bd1, warp, lane
            )


def compile_cubin(params: LayerParams, arch: str):
    """Compile one specialization for ``arch`` (e.g. "sm_90a") on any machine, GPU or not.

    Returns a KernelBinary with the eight pointer parameters of KERNEL_ARGS.
    """
    from mlpjit.jit.binary import KernelBinary, KernelParam

    kern = Fp8Layer(params)
    p = params

    fake = row_major_tensor

    def scales(rows, k):
        return fake(cutlass.Float32, ((rows + BLOCK - 1) // BLOCK, k // BLOCK))

    args = (
        fake(cutlass.BFloat16, (p.tokens, p.hidden)),  # out
        fake(cutlass.BFloat16, (p.tokens, p.inter)),  # act
        fake(cutlass.BFloat16, (p.tokens, p.hidden)),  # x
        fake(cutlass.Float8E4M3FN, (2 * p.inter, p.hidden)),
        scales(2 * p.inter, p.hidden),
        fake(cutlass.Float8E4M3FN, (p.hidden, p.inter)),
        scales(p.hidden, p.inter),
        fake(cutlass.Uint8, (p.workspace_bytes,)),
    )
    stream = cute.runtime.make_fake_stream()
    cubin, symbol = compile_to_cubin(kern, *args, stream, arch=arch)
    return KernelBinary(
        cubin=cubin,
        symbol=symbol,
        grid=p.grid,
        block=p.block,
        smem_bytes=p.smem_bytes,
        pdl=True,
        params=tuple(KernelParam(name, "ptr") for name in KERNEL_ARGS),
        cluster=(1, 1, 1),
    )
