"""Cache keys: what makes two compiles interchangeable, computed without tracing or cutlass.

components = {"format", "kernel", "source", "params", "arch", "toolchain"}; the key is the
sha256 of their canonical JSON. Anything that changes the generated code is a component;
nothing that does not (absolute paths, hostnames, cwd, unrelated env vars) is, so a cache
warmed on one machine serves another with the same toolchain.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlpjit.jit.config import check_arch
from mlpjit.kernels.registry import KernelDef, kernel_def

__all__ = [
    "FORMAT_VERSION",
    "cache_key",
    "canonical_json",
    "key_components",
    "short_key",
    "source_hash",
    "spec_key",
    "toolchain",
]

FORMAT_VERSION = 1
_NO_DEFAULT = object()
TOOLCHAIN_PREFIX = "nvidia-cutlass-dsl"
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, no NaN/inf."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


@functools.cache
def source_hash(kernel: str, package_dir: Path | None = None) -> str:
    """sha256 over the kernel's registered source files (relative names + bytes).

    Cached per process: the module that compiles is the one imported at first use, so the
    hash of the files as first seen is the one that describes it.
    """
    kdef: KernelDef = kernel_def(kernel)
    root = _PACKAGE_DIR if package_dir is None else package_dir
    h = hashlib.sha256()
    for rel in kdef.source_files:
        try:
            data = (root / rel).read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"kernel {kernel!r} source file {rel!r} is missing under {root}"
            ) from None
        # Length-prefix each part so moving bytes between files changes the hash.
        for part in (rel.encode(), data):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
    return h.hexdigest()


def _dist_info(path: Path) -> tuple[str, str] | None:
    """(normalized name, version) from a .dist-info dir's METADATA headers, or None."""
    name = version = None
    try:
        with open(path / "METADATA", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # end of the headers
                if line.startswith("Name:"):
                    name = line[5:].strip().lower().replace("_", "-")
                elif line.startswith("Version:"):
                    version = line[8:].strip()
    except OSError:
        return None
    return (name, version) if name and version else None


@functools.cache
def toolchain() -> dict[str, str]:
    """Versions of every installed nvidia-cutlass-dsl* distribution (without importing it).

    Scans the sys.path directories for nvidia_cutlass_dsl*.dist-info like importlib.metadata
    does, but only for this prefix: a full importlib.metadata scan costs ~100+ ms per process,
    more than a warm start of all kernels.
    """
    found: dict[str, str] = {}
    prefix = TOOLCHAIN_PREFIX.replace("-", "_")
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in sorted(names):
            if not (name.lower().startswith(prefix) and name.endswith(".dist-info")):
                continue
            info = _dist_info(Path(entry or ".") / name)
            # First one wins, like importlib's own resolution along sys.path.
            if info and info[0].startswith(TOOLCHAIN_PREFIX) and info[0] not in found:
                found[info[0]] = info[1]
    return dict(sorted(found.items()))


def _check_params(kdef: KernelDef, params: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a mapping of name -> scalar, got {type(params).__name__}")
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name not in kdef.param_names:
            raise ValueError(
                f"param {name!r} is not a parameter of kernel {kdef.name!r}; "
                f"allowed: {', '.join(sorted(kdef.param_names))}"
            )
        if value is not None and type(value) not in (int, float, bool, str):
            raise ValueError(
                f"param {name!r} must be int, float, bool, str or None, got {type(value).__name__}"
            )
        if type(value) is float and not math.isfinite(value):
            raise ValueError(f"param {name!r} must be finite, got {value!r}")
        default = kdef.param_defaults.get(name, _NO_DEFAULT)
        if type(value) is type(default) and value == default:
            continue  # the kernel's default: the same compile as leaving it out
        out[name] = value
    return dict(sorted(out.items()))


def key_components(kernel: str, params: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The canonical, plain-JSON components of a compile's cache key."""
    kdef = kernel_def(kernel)
    return {
        "format": FORMAT_VERSION,
        "kernel": kdef.name,
        "source": source_hash(kdef.name),
        "params": _check_params(kdef, params),
        "arch": check_arch(arch),
        "toolchain": toolchain(),
    }


def cache_key(components: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical JSON of ``components`` (64 lowercase hex chars)."""
    return hashlib.sha256(canonical_json(dict(components)).encode()).hexdigest()


def spec_key(components: Mapping[str, Any]) -> str:
    """Key of the components without "toolchain": finds entries when no compiler is installed."""
    return cache_key({k: v for k, v in components.items() if k != "toolchain"})


def short_key(key: str) -> str:
    """The first 12 hex chars of a key, for logs and messages."""
    return key[:12]
