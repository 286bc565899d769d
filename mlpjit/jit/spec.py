"""Kernel specs and requests: what the JIT library knows about a kernel, handed in by it.

The library (key, store, manager, launcher) knows no kernel by name. A kernel package builds
one :class:`KernelSpec` (its name, the module that compiles it, a frozen dataclass of its
compile parameters, the package whose source goes into the key, the archs it targets) and
hands it to :func:`register`; requests then name the kernel and carry plain-scalar
parameters, which the spec turns into its params dataclass (validated once, there).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KernelRequest",
    "KernelSpec",
    "check_arch",
    "get_spec",
    "register",
    "registered_names",
]

_SCALARS = (int, float, bool, str)
# "sm_90a", "sm_100a", "sm_80", "sm_100f": what CuTe DSL accepts as a target name.
_ARCH_RE = re.compile(r"^sm_[0-9]{2,3}[af]?$")


def check_arch(arch: str, what: str = "arch") -> str:
    """Return ``arch`` if it looks like a CUDA target name (sm_90a, sm_100a, ...), else raise.

    Which of them a kernel compiles for is its spec's ``archs``.
    """
    if not isinstance(arch, str) or not _ARCH_RE.match(arch):
        raise ValueError(
            f"{what} must be a CUDA target name like 'sm_90a' or 'sm_100a', got {arch!r}"
        )
    return arch


@dataclass(frozen=True)
class KernelSpec:
    """How to key and compile one kernel (no compiler is imported to build or use one)."""

    name: str
    # Module defining ``compile_cubin(params, arch) -> KernelBinary``; imported on a miss only.
    builder: str
    # Frozen dataclass of the compile parameters: fields without a default are required, a
    # field at its default is left out of the key; its __post_init__ validates.
    params: type
    # Package (or module) whose files, and the mlpjit modules they import, are hashed into
    # the key: an edit anywhere there invalidates the kernel's cache entries.
    sources: str
    archs: tuple[str, ...]  # targets it compiles for (checked before a compile starts)

    def __post_init__(self) -> None:
        if not dataclasses.is_dataclass(self.params) or not self.params.__dataclass_params__.frozen:
            raise TypeError(f"KernelSpec {self.name!r}: params must be a frozen dataclass")

    def field_names(self) -> tuple[str, ...]:
        """The compile parameter names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(self.params))

    def make_params(self, values: Mapping[str, Any] | Any) -> Any:
        """The params dataclass for plain-scalar ``values`` (or an instance, returned as is);
        ValueError naming an unknown, missing or non-scalar parameter."""
        if isinstance(values, self.params):
            return values
        if not isinstance(values, Mapping):
            raise ValueError(
                f"params must be a mapping of name -> scalar, got {type(values).__name__}"
            )
        names = self.field_names()
        for name, value in values.items():
            if name not in names:
                raise ValueError(
                    f"param {name!r} is not a parameter of kernel {self.name!r}; "
                    f"allowed: {', '.join(sorted(names))}"
                )
            if value is not None and type(value) not in _SCALARS:
                raise ValueError(
                    f"param {name!r} must be int, float, bool, str or None, "
                    f"got {type(value).__name__}"
                )
            if type(value) is float and not math.isfinite(value):
                raise ValueError(f"param {name!r} must be finite, got {value!r}")
        required = [
            f.name
            for f in dataclasses.fields(self.params)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in values]
        if missing:
            raise ValueError(
                f"{self.name} param(s) {', '.join(missing)} missing; required: {required}"
            )
        return self.params(**values)

    def key_params(self, params: Any) -> dict[str, Any]:
        """The parameters as they enter the key: sorted, defaults left out (a request that
        gives a default compiles what one that leaves it out does)."""
        out = {}
        for f in dataclasses.fields(params):
            value = getattr(params, f.name)
            at_default = f.default is not dataclasses.MISSING and (
                type(value) is type(f.default) and value == f.default
            )
            if not at_default:
                out[f.name] = value
        return dict(sorted(out.items()))


_REGISTRY: dict[str, KernelSpec] = {}
_MUTEX = threading.Lock()


def register(spec: KernelSpec) -> KernelSpec:
    """Make ``spec`` known by its name (idempotent for the same spec; ValueError for a
    different spec under a taken name)."""
    with _MUTEX:
        known = _REGISTRY.setdefault(spec.name, spec)
    if known != spec:
        raise ValueError(f"a different kernel spec is already registered as {spec.name!r}")
    return spec


def registered_names() -> tuple[str, ...]:
    """Names of the registered kernels, sorted."""
    with _MUTEX:
        return tuple(sorted(_REGISTRY))


def get_spec(name: str) -> KernelSpec:
    """The spec registered as ``name``; ValueError naming the registered kernels otherwise."""
    with _MUTEX:
        spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(
            f"kernel must be one of {', '.join(registered_names()) or '(none registered)'}, "
            f"got {name!r} (kernels register when their package is imported, e.g. "
            "`import mlpjit.kernels`)"
        )
    return spec


@dataclass(frozen=True)
class KernelRequest:
    """One kernel to get: registered name, compile parameters (plain scalars), target arch."""

    kernel: str
    params: Mapping[str, Any]
    arch: str

    def __post_init__(self) -> None:
        check_arch(self.arch)

    @property
    def spec(self) -> KernelSpec:
        """The registered spec of this request's kernel (ValueError if none)."""
        return get_spec(self.kernel)

    def to_json_line(self) -> str:
        """One JSON line: the form MLPJIT_RECORD appends and ``mlpjit warm --from`` reads."""
        item = {"kernel": self.kernel, "params": dict(self.params), "arch": self.arch}
        return json.dumps(item, sort_keys=True)

    @classmethod
    def from_json_line(cls, line: str) -> KernelRequest:
        """The request of a ``to_json_line`` line; ValueError if the line is not one."""
        try:
            item = json.loads(line)
            return cls(str(item["kernel"]), dict(item["params"]), str(item["arch"]))
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            raise ValueError(f"not a kernel request line ({err})") from None
