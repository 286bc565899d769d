"""A tiny CuTe DSL kernel, out[i] = x[i] * scale over n float32 values.

It exists to test the compile cache end to end (real CuTe DSL compiles for sm_90a on a
CPU-only machine, real cubins, a launch on the GPU) without the cost of the FP8 kernels.
Compile parameters: ``n`` (vector length), ``scale`` (a float baked into the code) and
``block`` (threads per CTA). Kernel parameters: ``out`` and ``x``, float32 [n], contiguous,
16-byte aligned. It waits on the previous grid (griddepcontrol) so a PDL launch is exercised.
"""

# No `from __future__ import annotations`: CuTe DSL evaluates the kernel's annotations, and
# string annotations would name `cute`/`cutlass`, which are imported inside program only.
import functools
import math
from dataclasses import dataclass
from typing import Any

from mlpjit.jit.binary import KernelBinary, KernelParam
from mlpjit.jit.spec import KernelSpec, register
from mlpjit.kernels.cubin import compile_to_cubin

__all__ = ["PARAMS", "SPEC", "SmokeParams", "compile_cubin", "program"]

PARAMS = (KernelParam("out", "ptr"), KernelParam("x", "ptr"))
MAX_N = 1 << 26


@dataclass(frozen=True)
class SmokeParams:
    """n (vector length), scale (a float baked into the code), block (threads per CTA).
    scale keeps its Python type: 2 and 2.0 are different keys (and constants to the DSL)."""

    n: int
    scale: float
    block: int

    def __post_init__(self) -> None:
        n, scale, block = self.n, self.scale, self.block
        if type(n) is not int or not 1 <= n <= MAX_N:
            raise ValueError(f"smoke param n must be an int in [1, {MAX_N}], got {n!r}")
        if type(scale) not in (int, float) or not math.isfinite(scale):
            raise ValueError(f"smoke param scale must be a finite float, got {scale!r}")
        if type(block) is not int or block % 32 or not 32 <= block <= 1024:
            raise ValueError(
                f"smoke param block must be a multiple of 32 in [32, 1024], got {block!r}"
            )


SPEC = register(
    KernelSpec(
        name="smoke",
        builder="mlpjit.testing.smoke",
        params=SmokeParams,
        sources="mlpjit.testing.smoke",
        # Needs griddepcontrol (sm_90+); the CuTe DSL 4.8.1 targets it was compiled for
        # (sm_110a gives no cubin; sm_8x fail in ptxas).
        archs=("sm_90", "sm_90a", "sm_100", "sm_100a", "sm_100f", "sm_103a", "sm_120a", "sm_121a"),
    )
)


@functools.cache
def program() -> Any:
    """Build the @cute.jit launcher once per process (imports CuTe DSL); the compile-cache
    benchmark's baseline compiles it with cute.compile itself."""
    import cutlass
    import cutlass.cute as cute

    @cute.kernel
    def scale_kernel(
        gOut: cute.Tensor, gX: cute.Tensor, scale: cutlass.Constexpr, n: cutlass.Constexpr
    ) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        bdim, _, _ = cute.arch.block_dim()
        # x may be written by the previous kernel of a PDL chain: wait for it first.
        cute.arch.griddepcontrol_wait()
        i = bidx * bdim + tidx
        if i < n:
            gOut[i] = gX[i] * cutlass.Float32(scale)

    @cute.jit
    def launch(
        mOut: cute.Tensor,
        mX: cute.Tensor,
        stream: Any,
        scale: cutlass.Constexpr,
        n: cutlass.Constexpr,
        block: cutlass.Constexpr,
    ) -> None:
        scale_kernel(mOut, mX, scale, n).launch(
            grid=[(n + block - 1) // block, 1, 1], block=[block, 1, 1], stream=stream
        )

    return launch


def compile_cubin(params: SmokeParams, arch: str) -> KernelBinary:
    """Compile the smoke kernel for ``arch`` (e.g. "sm_90a") with fake tensors; no GPU needed."""
    n, scale, block = params.n, float(params.scale), params.block
    import cutlass
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    launch = program()
    # Static shapes: the compiled kernel takes plain device pointers (see PARAMS).
    out = make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16)
    x = make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16)
    cubin, symbol = compile_to_cubin(launch, out, x, make_fake_stream(), scale, n, block, arch=arch)
    return KernelBinary(
        cubin=cubin,
        symbol=symbol,
        grid=((n + block - 1) // block, 1, 1),
        block=(block, 1, 1),
        smem_bytes=0,
        pdl=True,
        params=PARAMS,
    )
