"""The kernels mlpjit compiles; importing this package registers each one's spec with the
JIT library (cheap: no kernel module, no cutlass is imported)."""

from mlpjit.kernels import fp8_gemv, fp8_layer, fp8_stream

__all__ = ["fp8_gemv", "fp8_layer", "fp8_stream"]
