"""fp8_gemv's kernel spec, handed to the JIT library when this package is imported."""

from __future__ import annotations

from mlpjit.jit.spec import KernelSpec, register
from mlpjit.kernels.fp8_gemv.params import GemvParams

__all__ = ["SPEC"]

SPEC = register(
    KernelSpec(
        name="fp8_gemv",
        builder="mlpjit.kernels.fp8_gemv.kernel",
        params=GemvParams,
        sources="mlpjit.kernels.fp8_gemv",
        # Written and planned for Hopper (the shared-memory, register and SM budgets of
        # kernels/hopper.py); other GPUs run DenseMlp's stock path.
        archs=("sm_90a",),
    )
)
