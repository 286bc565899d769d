"""fp8_stream's kernel spec, handed to the JIT library when this package is imported."""

from __future__ import annotations

from mlpjit.jit.spec import KernelSpec, register
from mlpjit.kernels.fp8_stream.params import StreamParams

__all__ = ["SPEC"]

SPEC = register(
    KernelSpec(
        name="fp8_stream",
        builder="mlpjit.kernels.fp8_stream.kernel",
        params=StreamParams,
        sources="mlpjit.kernels.fp8_stream",
        archs=("sm_90a",),
    )
)
