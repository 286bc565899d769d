"""mlpjit: fused FP8 decode kernels for dense MLP layers, with a multi-process compile cache.

Importing the package is cheap: nothing here imports cutlass, cuda-python or does work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["DenseMlp", "__version__"]

if TYPE_CHECKING:
    from mlpjit.dense_mlp import DenseMlp


def __getattr__(name: str) -> Any:
    if name == "DenseMlp":
        from mlpjit.dense_mlp import DenseMlp

        return DenseMlp
    raise AttributeError(f"module 'mlpjit' has no attribute {name!r}")
