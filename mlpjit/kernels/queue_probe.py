"""A probe of where a late load waits: behind its own SM's requests, or behind everyone's.

fp8_gemv's traces (docs/KERNEL_NOTES.md, "fp8_gemv under trace") found x's loads, issued
after the PDL wait, ready only about when the CTA's weight requests have landed, whether x
comes by loads (the kernel) or by the copy engine (``x_bulk``), and L2 prefetches in their
place (``late_prefetch``) did not help. Whether a load waits in its own SM's queue or in
the memory system's queue of every SM's requests decides what can help: in the first case
x loaded by a CTA on an SM with nothing queued (and sent on through distributed shared
memory) would be ready in one L2 round trip; in the second only fewer bytes in flight
GPU-wide would.

One CTA per SM (each takes more than half an SM's shared memory). Each of the first
``ctas - quiet`` CTAs (the flooding ones) requests ``flood_bytes`` of its own range of
``buf`` into shared memory by cp.async from launch on (a weight tile requested before the
PDL wait); the last ``quiet`` CTAs request nothing. Every CTA then waits until ``delay_ns``
after its start (the PDL wait returning then: all CTAs start together, so flooding and
quiet CTAs load x at the same moment unless issuing the requests took longer), has its
first warp load 512 bytes of its own line of ``x`` (16 bytes a lane, as x's loads are),
and stamps %globaltimer: at its start, once its requests are issued, when it loads x, when
x has arrived, and when its flood has landed, with its SM id. Compare the x round trip of
flooding and quiet CTAs.

Compile parameters (QueueParams): flood_bytes (a multiple of threads x 16, at most
MAX_FLOOD), quiet (0 to ctas - 1), delay_ns (0 to MAX_DELAY_NS), ctas (1 to 1024).
Kernel parameters: ``out`` (int64 [ctas, STAMPS]: the stamps above, then the SM id and the
XOR of the x words the CTA read), ``buf`` (uint8 [ctas x flood_bytes]) and ``x`` (uint8
[ctas x X_LINE]).

Nothing here is imported by ``import mlpjit``; mlpjit.bench.queue_probe imports it to
register the kernel (``MLPJIT_KERNEL_MODULES`` names it for ``mlpjit warm``).
"""

# No `from __future__ import annotations`: CuTe DSL evaluates the kernel's annotations.
from dataclasses import dataclass
from typing import Any

from mlpjit.jit.binary import KernelBinary, KernelParam
from mlpjit.jit.spec import KernelSpec, register
from mlpjit.kernels.checks import check_int

__all__ = [
    "MAX_DELAY_NS",
    "MAX_FLOOD",
    "PARAMS",
    "SPEC",
    "STAMP_NAMES",
    "STAMPS",
    "THREADS",
    "X_LINE",
    "QueueParams",
    "compile_cubin",
]

PARAMS = (KernelParam("out", "ptr"), KernelParam("buf", "ptr"), KernelParam("x", "ptr"))
THREADS = 256
X_LINE = 512  # bytes of x per CTA: one warp's 16 bytes a lane
MAX_FLOOD = 224 * 1024  # within the 227 KB a CTA's shared memory may take on sm_90
MAX_DELAY_NS = 100_000
# Below this much shared memory two CTAs would fit one SM: every CTA takes at least it.
ONE_PER_SM = 120 * 1024
STAMP_NAMES = ("start", "issued", "x requested", "x ready", "flood landed", "smid", "x xor")
STAMPS = 8  # int64 words per CTA in out (the last unused)


@dataclass(frozen=True)
class QueueParams:
    """flood_bytes: bytes each flooding CTA requests; quiet: CTAs (the last ones) that
    request nothing; delay_ns: when x is loaded, after the CTA's start; ctas: the grid
    (one CTA per SM)."""

    flood_bytes: int
    quiet: int = 4
    delay_ns: int = 0
    ctas: int = 132

    def __post_init__(self) -> None:
        check_int("queue_probe param ctas", self.ctas, 1, 1024)
        check_int("queue_probe param flood_bytes", self.flood_bytes, THREADS * 16, MAX_FLOOD)
        if self.flood_bytes % (THREADS * 16):
            raise ValueError(
                f"queue_probe param flood_bytes must be a multiple of {THREADS * 16}, "
                f"got {self.flood_bytes}"
            )
        check_int("queue_probe param quiet", self.quiet, 0, self.ctas - 1)
        check_int("queue_probe param delay_ns", self.delay_ns, 0, MAX_DELAY_NS)

    @property
    def smem_bytes(self) -> int:
        """The flood's bytes (at least ONE_PER_SM), then 16 for the x words' XOR."""
        return max(self.flood_bytes, ONE_PER_SM) + 16

    @property
    def copies(self) -> int:
        """cp.async copies of 16 bytes per thread."""
        return self.flood_bytes // (THREADS * 16)


SPEC = register(
    KernelSpec(
        name="queue_probe",
        builder="mlpjit.kernels.queue_probe",
        params=QueueParams,
        sources="mlpjit.kernels.queue_probe",
        archs=("sm_90a",),
    )
)


def _program(params: QueueParams) -> Any:
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int64

    from mlpjit.kernels import ptx
    from mlpjit.kernels.cubin import launch_options

    P = params
    flooders = P.ctas - P.quiet
    s_xor_offset = P.smem_bytes - 16

    @cute.kernel
    def kernel(m_out: cute.Tensor, m_buf: cute.Tensor, m_x: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        s_base = smem.allocate(P.smem_bytes, byte_alignment=128).toint()
        g_out = Int64(m_out.iterator.toint()) + Int64(cta * (STAMPS * 8))
        g_buf = Int64(m_buf.iterator.toint()) + Int64(cta) * P.flood_bytes
        g_x = Int64(m_x.iterator.toint()) + Int64(cta * X_LINE)
        start = ptx.globaltimer()
        if cta < flooders:
            for i in cutlass.range(P.copies, unroll=1):
                off = (i * THREADS + tid) * 16
                ptx.cp_async_cg_16(s_base + off, g_buf + Int64(off))
            cute.arch.cp_async_commit_group()
        cute.arch.sync_threads()
        issued = ptx.globaltimer()
        now = issued
        if cutlass.const_expr(P.delay_ns > 0):
            # the same moment for flooding and quiet CTAs (all start together)
            while now - start < P.delay_ns:
                now = ptx.globaltimer()
        requested = ptx.globaltimer()
        if tid < 32:
            v = ptx.ld_global_v4(g_x + Int64(tid * 16))
            word = v[0] ^ v[1] ^ v[2] ^ v[3]
            for width in (16, 8, 4, 2, 1):
                word = word ^ cute.arch.shuffle_sync_bfly(word, offset=width)
            if tid == 0:
                ptx.st_shared_v4(s_base + s_xor_offset, word, word, word, word)
        # thread 0's shared store needs x's words: the barrier stamps after they arrived
        cute.arch.sync_threads()
        ready = ptx.globaltimer()
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        landed = ptx.globaltimer()
        if tid == 0:
            stamps = (start, issued, requested, ready, landed)
            for i in cutlass.range_constexpr(len(stamps)):
                ptx.st_global_u64(g_out + i * 8, stamps[i])
            ptx.st_global_u64(g_out + STAMP_NAMES.index("smid") * 8, Int64(ptx.smid()))
            xor = ptx.ld_shared_v4(s_base + s_xor_offset)
            word_at = g_out + STAMP_NAMES.index("x xor") * 8
            ptx.st_global_u64(word_at, Int64(xor[0]) & Int64(0xFFFFFFFF))

    options = launch_options(P.ctas, THREADS, P.smem_bytes)
    options["use_pdl"] = False

    @cute.jit
    def launch(m_out: cute.Tensor, m_buf: cute.Tensor, m_x: cute.Tensor, stream: Any):
        kernel(m_out, m_buf, m_x).launch(stream=stream, **options)

    return launch


def compile_cubin(params: QueueParams, arch: str) -> KernelBinary:
    """Compile the probe for ``arch`` ("sm_90a") on any machine, GPU or not."""
    import cutlass
    import cutlass.cute as cute

    from mlpjit.kernels.cubin import compile_to_cubin, row_major_tensor

    m_out = row_major_tensor(cutlass.Int64, (params.ctas * STAMPS,))
    m_buf = row_major_tensor(cutlass.Uint8, (params.ctas * params.flood_bytes,))
    m_x = row_major_tensor(cutlass.Uint8, (params.ctas * X_LINE,))
    stream = cute.runtime.make_fake_stream()
    cubin, symbol = compile_to_cubin(_program(params), m_out, m_buf, m_x, stream, arch=arch)
    return KernelBinary(
        cubin=cubin,
        symbol=symbol,
        grid=(params.ctas, 1, 1),
        block=(THREADS, 1, 1),
        smem_bytes=params.smem_bytes,
        pdl=False,
        params=PARAMS,
    )
