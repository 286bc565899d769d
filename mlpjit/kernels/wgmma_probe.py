"""A one-warpgroup kernel that checks how sm_90's native FP8 mma takes its operands.

fp8_stream's consumers run ``mma.sync.m16n8k32.e4m3``, which sm_90 emulates (FP8 unpacks,
two f16 HMMAs and adds per mma); ``wgmma.mma_async.m64n8k32.f32.e4m3.e4m3`` is one
instruction per 64 rows x 32 K (docs/KERNEL_NOTES.md, "What fp8_stream's own work costs").
This probe computes ``out = a . b^T`` for a 64 x k e4m3 matrix ``a`` and an n x k e4m3
matrix ``b`` (n 8, 16 or 32) with ``wgmma.mma_async.m64nNk32``, taking A from registers in
mma.sync's per-warp m16n8k32 fragment (warp w holds rows 16 w + lane / 4 and + 8, K bytes
4 (lane % 4) .. + 3 and + 16 of each 32-K step) and B from shared memory by a descriptor
in the no-swizzle K-major layout (8 tokens x 16 bytes per core matrix, the step's two K
halves a leading-byte offset apart, each group of 8 tokens holding all of its K, the groups
a stride-byte offset apart). tests/gpu/test_wgmma_probe_gpu.py checks on a GPU that this
reproduces a . b^T exactly (it does on the H100: docs/KERNEL_NOTES.md).

Compile parameters (ProbeParams): ``k`` (a multiple of 32, at most 256: every A fragment
is loaded before the first wgmma) and ``n`` (8, 16 or 32). Kernel parameters: ``out``
(float32 [64, n]), ``a`` (e4m3 [64, k]), ``b`` (e4m3 [n, k]).

Nothing here is imported by ``import mlpjit``; its GPU test imports it to register the
kernel (``MLPJIT_KERNEL_MODULES`` names it for ``mlpjit warm``).
"""

# No `from __future__ import annotations`: CuTe DSL evaluates the kernel's annotations.
from dataclasses import dataclass
from typing import Any

from mlpjit.jit.binary import KernelBinary, KernelParam
from mlpjit.jit.spec import KernelSpec, register
from mlpjit.kernels.tensor_map import MAP_BYTES
from mlpjit.kernels.wgmma_desc import (
    CORE,
    SWIZZLE_ATOM,
    core_matrix_descriptor,
    device_descriptor,
    swizzled_descriptor,
)

__all__ = [
    "A_SOURCES",
    "PARAMS",
    "SPEC",
    "ProbeParams",
    "b_offset",
    "compile_cubin",
]

PARAMS = (KernelParam("out", "ptr"), KernelParam("a", "ptr"), KernelParam("b", "ptr"))
# "tma": A by descriptor from a TMA tensor copy with the 128-byte swizzle (one more kernel
# parameter: the tensor map, mlpjit.kernels.tensor_map.weight_block_map(a, 16, 4))
A_SOURCES = ("registers", "tma")
TMA_PARAMS = (*PARAMS, KernelParam("a_map", "ptr"))
TMA_TILE_ROWS = 16  # tma: a is one 16-row tile of four 128-K blocks, A's 64 rows block-major
TMA_BLOCKS = 4
ROWS = 64  # wgmma's M: four warps of 16 rows
GROUP = 8  # B rows (tokens) of one core matrix
NS = (8, 16, 32)  # wgmma's N here
STEP = 32  # K per wgmma (bytes of e4m3)
MAX_K = 256


@dataclass(frozen=True)
class ProbeParams:
    """k: the K of a and b; n: b's rows (wgmma's N); a_from: where A comes from (A_SOURCES;
    "tma" takes k = 128: a is [16, 512], A's row 16 j + r is a's row r, K block j)."""

    k: int
    n: int = 8
    a_from: str = "registers"

    def __post_init__(self) -> None:
        if type(self.k) is not int or not STEP <= self.k <= MAX_K or self.k % STEP:
            raise ValueError(
                f"wgmma_probe param k must be a multiple of {STEP} in [{STEP}, {MAX_K}], "
                f"got {self.k!r}"
            )
        if type(self.n) is not int or self.n not in NS:
            raise ValueError(
                f"wgmma_probe param n must be one of {', '.join(map(str, NS))}, got {self.n!r}"
            )
        if not isinstance(self.a_from, str) or self.a_from not in A_SOURCES:
            raise ValueError(
                f"wgmma_probe param a_from must be one of {', '.join(A_SOURCES)}, got "
                f"{self.a_from!r}"
            )
        if self.a_from == "tma" and self.k != 128:
            raise ValueError(f"wgmma_probe param k must be 128 with a_from='tma', got {self.k}")

    @property
    def steps(self) -> int:
        return self.k // STEP

    @property
    def group_bytes(self) -> int:
        """One group of 8 tokens: per step two core matrices (K bytes 0-15, 16-31)."""
        return self.steps * 2 * CORE

    @property
    def b_bytes(self) -> int:
        return self.n // GROUP * self.group_bytes

    @property
    def smem_bytes(self) -> int:
        """B, then (tma) A's four swizzled blocks and the copy's mbarrier."""
        if self.a_from == "tma":
            return self.a_offset + ROWS * self.k + 8
        return self.b_bytes

    @property
    def a_offset(self) -> int:
        """tma: where A starts in shared memory (after B, at a swizzle atom)."""
        return -(-self.b_bytes // SWIZZLE_ATOM) * SWIZZLE_ATOM

    @property
    def params(self) -> tuple:
        return TMA_PARAMS if self.a_from == "tma" else PARAMS


def b_offset(n: int, kk: int, group_bytes: int) -> int:
    """Byte of B's token n, K byte kk in shared memory (no swizzle, K-major): n's group of
    8 tokens, the step, the core matrix of the step's K half, row n % 8 of it, the byte."""
    step, within = divmod(kk, STEP)
    group, row = divmod(n, GROUP)
    return group * group_bytes + step * 2 * CORE + (within // 16) * CORE + row * 16 + within % 16


SPEC = register(
    KernelSpec(
        name="wgmma_probe",
        builder="mlpjit.kernels.wgmma_probe",
        params=ProbeParams,
        sources="mlpjit.kernels.wgmma_probe",
        archs=("sm_90a",),
    )
)


def _program(params: ProbeParams) -> Any:
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64

    from mlpjit.kernels import ptx

    P = params
    K = P.k
    N = P.n
    GB = P.group_bytes

    @cute.kernel
    def kernel(m_out: cute.Tensor, m_a: cute.Tensor, m_b: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        q = lane & 3
        smem = cutlass.memory.SmemAllocator()
        s_b = smem.allocate(P.smem_bytes, byte_alignment=128).toint()
        g_a = Int64(m_a.iterator.toint())
        store_b(Int64(m_b.iterator.toint()), s_b, tid)
        cute.arch.sync_threads()
        # A: mma.sync's m16n8k32 fragment of this warp's 16 rows, every step, before the
        # first wgmma (a register written after wgmma_fence would need another fence).
        row0 = Int64(warp * 16 + g) * K
        row1 = row0 + 8 * K
        frags = []
        for s in cutlass.range_constexpr(P.steps):
            words = []
            for row, half in ((row0, 0), (row1, 0), (row0, 16), (row1, 16)):
                addr = g_a + row + Int64(s * STEP + half + q * 4)
                words.append(ptx.f32_as_i32(ptx.ld_global_nc_f32(addr)))
            frags.append(words)
        acc = tuple(Float32(0.0) for _ in range(N // 2))
        ptx.wgmma_fence()
        for s in cutlass.range_constexpr(P.steps):
            desc = device_descriptor(s_b + s * 2 * CORE, core_matrix_descriptor(0, GB))
            acc = ptx.wgmma_k32_e4m3(tuple(frags[s]), desc, acc, s > 0)
        ptx.wgmma_commit()
        ptx.wgmma_wait()
        store_d(m_out, acc, warp * 16 + g, q)

    @cute.jit
    def store_b(g_b: Int64, s_b: Int32, tid: Int32):
        """B into the core-matrix layout, 16 bytes per thread and pass."""
        for c in cutlass.range(tid, N * (K // 16), 128, unroll=1):
            n = c // (K // 16)
            kc = c - n * (K // 16)
            v = ptx.ld_global_v4(g_b + Int64(n * K + kc * 16))
            # b_offset(n, 16 kc, GB)
            dst = s_b + (n >> 3) * GB + (kc // 2) * (2 * CORE) + (kc % 2) * CORE + (n & 7) * 16
            ptx.st_shared_v4(dst, v[0], v[1], v[2], v[3])
        ptx.fence_proxy_async_shared()

    @cute.jit
    def store_d(m_out: cute.Tensor, acc, r0: Int32, q: Int32):
        """D: rows r0 = 16 w + lane / 4 (d[4j], d[4j + 1]) and + 8 (d[4j + 2], d[4j + 3]),
        tokens 8 j + 2 (lane % 4) and + 1."""
        for i in cutlass.range_constexpr(N // 2):
            row = r0 + ((i // 2) % 2) * 8
            m_out[row * N + (i // 4) * 8 + q * 2 + i % 2] = acc[i]

    @cute.jit
    def launch(m_out: cute.Tensor, m_a: cute.Tensor, m_b: cute.Tensor, stream: Any):
        kernel(m_out, m_a, m_b).launch(
            grid=[1, 1, 1], block=[128, 1, 1], smem=P.smem_bytes, stream=stream
        )

    @cute.kernel
    def tma_kernel(m_out: cute.Tensor, m_a: cute.Tensor, m_b: cute.Tensor, m_map: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        q = lane & 3
        smem = cutlass.memory.SmemAllocator()
        s_b = smem.allocate(P.smem_bytes, byte_alignment=SWIZZLE_ATOM).toint()
        s_a = s_b + P.a_offset
        bar = s_a + ROWS * K
        if tid == 0:
            ptx.mbarrier_init(bar, 1)
            ptx.fence_mbarrier_init()
        cute.arch.sync_threads()
        if tid == 0:
            # A: a's four K blocks of its 16 rows, block-major, each row's 128 bytes swizzled
            ptx.mbarrier_arrive_expect_tx(bar, ROWS * K)
            ptx.cp_async_bulk_tensor_3d_g2s(
                s_a, Int64(m_map.iterator.toint()), Int32(0), Int32(0), Int32(0), bar
            )
        store_b(Int64(m_b.iterator.toint()), s_b, tid)
        cute.arch.sync_threads()
        ptx.mbarrier_wait(bar, Int32(0))
        acc = tuple(Float32(0.0) for _ in range(N // 2))
        ptx.wgmma_fence()
        for s in cutlass.range_constexpr(P.steps):
            a_desc = device_descriptor(s_a + s * STEP, swizzled_descriptor(0))
            b_desc = device_descriptor(s_b + s * 2 * CORE, core_matrix_descriptor(0, GB))
            acc = ptx.wgmma_k32_e4m3(a_desc, b_desc, acc, s > 0)
        ptx.wgmma_commit()
        ptx.wgmma_wait()
        store_d(m_out, acc, warp * 16 + g, q)

    @cute.jit
    def tma_launch(
        m_out: cute.Tensor, m_a: cute.Tensor, m_b: cute.Tensor, m_map: cute.Tensor, stream: Any
    ):
        tma_kernel(m_out, m_a, m_b, m_map).launch(
            grid=[1, 1, 1], block=[128, 1, 1], smem=P.smem_bytes, stream=stream
        )

    return tma_launch if P.a_from == "tma" else launch


def compile_cubin(params: ProbeParams, arch: str) -> KernelBinary:
    """Compile the probe for ``arch`` ("sm_90a") on any machine, GPU or not."""
    import cutlass
    import cutlass.cute as cute

    from mlpjit.kernels.cubin import compile_to_cubin, row_major_tensor

    m_out = row_major_tensor(cutlass.Float32, (ROWS * params.n,))
    m_a = row_major_tensor(cutlass.Uint8, (ROWS * params.k,))
    m_b = row_major_tensor(cutlass.Uint8, (params.n * params.k,))
    stream = cute.runtime.make_fake_stream()
    tensors = [m_out, m_a, m_b]
    if params.a_from == "tma":
        tensors.append(row_major_tensor(cutlass.Uint8, (MAP_BYTES,)))
    cubin, symbol = compile_to_cubin(_program(params), *tensors, stream, arch=arch)
    return KernelBinary(
        cubin=cubin,
        symbol=symbol,
        grid=(1, 1, 1),
        block=(128, 1, 1),
        smem_bytes=params.smem_bytes,
        pdl=False,
        params=params.params,
    )
