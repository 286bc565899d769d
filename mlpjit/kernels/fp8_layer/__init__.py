"""fp8_layer: a whole dense MLP layer (gate_up + SwiGLU, then down) in one kernel.

    params.py   LayerParams (the compile contract: the two fp8_stream phases, shared
                memory and workspace layout)
    plan.py     the knobs per shape and the compile request
    spec.py     the KernelSpec handed to the JIT library (registered on import)
    kernel.py   the CuTe DSL kernel and compile_cubin (imports cutlass; loaded on a miss only)

Importing this package registers the spec and imports no cutlass.
"""

from mlpjit.kernels.fp8_layer.spec import SPEC

__all__ = ["SPEC"]
