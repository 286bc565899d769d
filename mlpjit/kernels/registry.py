"""The kernels mlpjit can compile: name -> module, hashed source files, allowed parameters.

Nothing here imports a kernel module (that pulls in CuTe DSL); the compile manager imports
``KernelDef.module`` only on a cache miss, and the key hashes ``source_files`` so an edit to
a kernel invalidates its cache entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mlpjit.kernels.plan import SMS  # plan imports nothing heavy (no cutlass, no torch)

__all__ = ["KernelDef", "kernel_def", "kernel_names"]


@dataclass(frozen=True)
class KernelDef:
    """How to find, key and compile one kernel."""

    name: str
    module: str  # imported only on a miss; defines compile_cubin(params, arch)
    source_files: tuple[str, ...]  # relative to the mlpjit package directory
    param_names: frozenset[str]
    # Optional parameters and their defaults: a request giving the default keys (and so
    # compiles) like one that leaves the parameter out.
    param_defaults: Mapping[str, Any] = field(default_factory=dict)


_KERNELS: dict[str, KernelDef] = {
    k.name: k
    for k in (
        KernelDef(
            name="fp8_gemv",
            module="mlpjit.kernels.fp8_gemv",
            # plan.py: the grid, persistence and register budget are compiled in.
            source_files=("kernels/fp8_gemv.py", "kernels/ptx.py", "kernels/plan.py"),
            param_names=frozenset(
                {
                    "rows",
                    "k",
                    "tokens",
                    "tiles",
                    "in_regs",
                    "ctas_per_sm",
                    "swiglu",
                    "limit",
                    "ue8m0",
                    "early_launch",
                    "slices_per_warp",
                    "cluster",
                    "sms",
                }
            ),
            param_defaults=MappingProxyType(
                {
                    "early_launch": False,
                    "slices_per_warp": 1,
                    "cluster": 1,
                    "sms": SMS,
                }
            ),
        ),
        KernelDef(
            name="smoke",
            module="mlpjit.kernels.smoke",
            source_files=("kernels/smoke.py",),
            param_names=frozenset({"n", "scale", "block"}),
        ),
    )
}


def kernel_names() -> tuple[str, ...]:
    """Names of all registered kernels, sorted."""
    return tuple(sorted(_KERNELS))


def kernel_def(name: str) -> KernelDef:
    """The KernelDef registered as ``name``; ValueError naming the allowed names otherwise."""
    try:
        return _KERNELS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"kernel must be one of {', '.join(kernel_names())}, got {name!r}"
        ) from None
