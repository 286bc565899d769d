"""fp8_layer's kernel spec, handed to the JIT library when this package is imported."""

from __future__ import annotations

from mlpjit.jit.spec import KernelSpec, register
from mlpjit.kernels.fp8_layer.params import LayerParams

__all__ = ["SPEC"]

SPEC = register(
    KernelSpec(
        name="fp8_layer",
        builder="mlpjit.kernels.fp8_layer.kernel",
        params=LayerParams,
        sources="mlpjit.kernels.fp8_layer",  # and fp8_stream, which it imports
        archs=("sm_90a",),
    )
)
