"""Cache keys: what makes two compiles interchangeable, computed without tracing or cutlass.

components = {"format", "kernel", "source", "params", "arch", "toolchain"}; the key is the
sha256 of their canonical JSON. Anything that changes the generated code is a component;
nothing that does not (absolute paths, hostnames, cwd, unrelated env vars) is, so a cache
warmed on one machine serves another with the same toolchain.

"source" hashes the files of the spec's source package and, transitively, every mlpjit
module they import (found by reading their import lines, not by importing them): no list
of files to keep up to date, and no edit that changes a kernel can keep serving its cubins.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlpjit.jit.spec import KernelRequest, KernelSpec, check_arch

__all__ = [
    "FORMAT_VERSION",
    "cache_key",
    "canonical_json",
    "key_components",
    "request_key",
    "short_key",
    "source_files",
    "source_hash",
    "spec_key",
    "toolchain",
]

FORMAT_VERSION = 1
TOOLCHAIN_PREFIX = "nvidia-cutlass-dsl"
_TOP = "mlpjit"  # imports of this package are followed; others (cutlass, torch) are not
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_IMPORT_RE = re.compile(r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)", re.M)
_FROM_RE = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)", re.M)


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, no NaN/inf."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _package_files(module: str) -> list[tuple[str, Path]]:
    """(relative name, path) of every .py file of ``module`` (a package), or of its one file.

    Found with importlib's finder, which does not import the module itself (a source
    package outside mlpjit, e.g. a test kernel, is found along sys.path).
    """
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        raise FileNotFoundError(f"source module {module!r} is not importable")
    base = module.replace(".", "/")
    if found.submodule_search_locations:
        root = Path(found.origin).parent
        return [(f"{base}/{p.relative_to(root).as_posix()}", p) for p in sorted(root.rglob("*.py"))]
    return [(f"{base}.py", Path(found.origin))]


def _mlpjit_file(module: str) -> tuple[str, Path] | None:
    """(relative name, path) of an mlpjit module's file (a package's __init__.py), or None
    if there is no such module (e.g. a name imported from a module, not a submodule)."""
    parts = module.split(".")
    if parts[0] != _TOP:
        return None
    base, rel = _PACKAGE_DIR.joinpath(*parts[1:]), "/".join(parts)
    if len(parts) > 1 and base.with_suffix(".py").is_file():
        return f"{rel}.py", base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return f"{rel}/__init__.py", base / "__init__.py"
    return None


def _imports(text: str, package: str) -> set[str]:
    """The mlpjit modules a source text imports; ``package`` resolves relative imports.

    ``from pkg import a, b`` counts the submodules a and b, and pkg itself only when it also
    hands out a name that is not a submodule.
    """
    found: set[str] = set()
    for match in _IMPORT_RE.finditer(text):
        found.update(name.split(" as ")[0].strip() for name in match.group(1).split(","))
    for match in _FROM_RE.finditer(text):
        origin, names = match.group(1), match.group(2).strip("() \t")
        if origin.startswith("."):
            dots = len(origin) - len(origin.lstrip("."))
            parent = package.rsplit(".", dots - 1)[0] if dots > 1 else package
            origin = ".".join(p for p in (parent, origin.lstrip(".")) if p)
        if not (origin == _TOP or origin.startswith(_TOP + ".")):
            continue
        plain_names = False
        for item in names.split(","):
            name = item.split()[0] if item.split() else ""  # "binary as b" -> "binary"
            if not name.isidentifier():
                continue
            if _mlpjit_file(f"{origin}.{name}") is not None:
                found.add(f"{origin}.{name}")
            else:
                plain_names = True
        if plain_names:
            found.add(origin)
    return {m for m in found if m.startswith(_TOP + ".")}


def source_files(sources: str) -> list[tuple[str, Path]]:
    """Every file whose bytes go into the source hash of ``sources`` (a package or module):
    all of its own files, then the mlpjit modules they import, transitively, sorted."""
    files = dict(_package_files(sources))
    pending = list(files.items())
    while pending:
        rel, path = pending.pop()
        package = rel.rsplit("/", 1)[0].replace("/", ".")
        for module in _imports(path.read_text(encoding="utf-8"), package):
            found = _mlpjit_file(module)
            if found is not None and found[0] not in files:
                files[found[0]] = found[1]
                pending.append(found)
    return sorted(files.items())


@functools.cache
def source_hash(sources: str) -> str:
    """sha256 over :func:`source_files` of ``sources`` (relative names + bytes).

    Cached per process: the module that compiles is the one imported at first use, so the
    hash of the files as first seen is the one that describes it.
    """
    h = hashlib.sha256()
    for rel, path in source_files(sources):
        # Length-prefix each part so moving bytes between files changes the hash.
        for part in (rel.encode(), path.read_bytes()):
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


def key_components(spec: KernelSpec, params: Mapping[str, Any] | Any, arch: str) -> dict[str, Any]:
    """The canonical, plain-JSON components of a compile's cache key.

    ``params`` (plain scalars, or the spec's params dataclass) are validated by the spec;
    parameters at their defaults are left out.
    """
    if not isinstance(spec, KernelSpec):
        raise ValueError(f"spec must be a KernelSpec, got {type(spec).__name__}")
    return {
        "format": FORMAT_VERSION,
        "kernel": spec.name,
        "source": source_hash(spec.sources),
        "params": spec.key_params(spec.make_params(params)),
        "arch": check_arch(arch),
        "toolchain": toolchain(),
    }


def request_key(request: KernelRequest) -> str:
    """The cache key of a request (its kernel's registered spec, params and arch)."""
    return cache_key(key_components(request.spec, request.params, request.arch))


def cache_key(components: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical JSON of ``components`` (64 lowercase hex chars)."""
    return hashlib.sha256(canonical_json(dict(components)).encode()).hexdigest()


def spec_key(components: Mapping[str, Any]) -> str:
    """Key of the components without "toolchain": finds entries when no compiler is installed."""
    return cache_key({k: v for k, v in components.items() if k != "toolchain"})


def short_key(key: str) -> str:
    """The first 12 hex chars of a key, for logs and messages."""
    return key[:12]
