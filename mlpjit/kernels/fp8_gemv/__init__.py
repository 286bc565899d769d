"""fp8_gemv: the FP8 block-scaled GEMV (+ fused SwiGLU) that runs both kernels of DenseMlp.

    params.py   GemvParams (the one compile contract: validation, geometry), GemvConfig
    tuning.py   which shapes it takes and the knobs per shape (H200 table, heuristics)
    plan.py     compile requests for one launch or a dense-MLP shard
    spec.py     the KernelSpec handed to the JIT library (registered on import)
    kernel.py   the CuTe DSL kernel and compile_cubin (imports cutlass; loaded on a miss only)

Importing this package registers the spec and imports no cutlass.
"""

from mlpjit.kernels.fp8_gemv.spec import SPEC

__all__ = ["SPEC"]
