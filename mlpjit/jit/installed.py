"""Cubin wheels: installed Python distributions that carry a read-only cache dir.

A wheel written by `mlpjit cache export --wheel` (wheel.py) declares an entry point in the
group ``mlpjit.cache_dirs`` whose function returns the directory of its entries, laid out
as any cache tier. ``installed_caches()`` finds them through importlib.metadata, so a
`pip install` is all it takes, with no environment variable; MLPJIT_CACHE_WHEELS=0 turns
it off. The store adds each as one more ReadOnlyTier after MLPJIT_CACHE_PATH's, with the
same trust rules (trust.py): the directory and every one above it owned by this user or
root and not writable by other users, entry files likewise, every entry verified on load.

Looked up lazily when a store is built, never at `import mlpjit`, and once per process
and sys.path (a scan of every installed distribution's metadata costs milliseconds).
Loading an entry point imports its module, code an installed distribution provides like
any other; one that fails, or returns anything but an absolute path, is skipped with one
warning and reported by `mlpjit doctor`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from mlpjit.jit import config
from mlpjit.jit.messages import one_line

__all__ = ["ENTRY_POINT_GROUP", "InstalledCache", "installed_cache_dirs", "installed_caches"]

ENTRY_POINT_GROUP = "mlpjit.cache_dirs"
# A cubin wheel's dist-info dir: its distribution name normalized (mlpjit-cubins-... ->
# mlpjit_cubins_...).
_DIST_INFO_PREFIX = "mlpjit_cubins"

log = logging.getLogger("mlpjit.jit.store")
_MUTEX = threading.Lock()
_FOUND: dict[tuple[str, ...], tuple[InstalledCache, ...]] = {}


@dataclass(frozen=True)
class InstalledCache:
    """One ``mlpjit.cache_dirs`` entry point of an installed distribution."""

    name: str  # the entry point's name
    dist: str  # the distribution that declares it ("" if unknown)
    version: str
    path: Path | None  # the cache dir it names (absolute); None when it could not be used
    problem: str = ""  # why it is not used ('' if it is)

    def label(self) -> str:
        """'mlpjit-cubins-glm5-tp8-sm90a 2026.1.2+3f2a...' (or the entry point's name)."""
        return f"{self.dist} {self.version}".strip() if self.dist else self.name


def installed_caches() -> tuple[InstalledCache, ...]:
    """Every ``mlpjit.cache_dirs`` entry point, sorted by name; () when MLPJIT_CACHE_WHEELS is
    off. Found once per sys.path: a wheel installed while a process runs counts from its
    next start."""
    if not config.cache_wheels():
        return ()
    key = tuple(os.fspath(p) for p in sys.path)
    with _MUTEX:
        found = _FOUND.get(key)
    if found is None:
        found = _scan()
        with _MUTEX:
            _FOUND[key] = found
    return found


def installed_cache_dirs() -> tuple[Path, ...]:
    """The usable cache dirs of installed_caches(), in order."""
    return tuple(c.path for c in installed_caches() if c.path is not None)


def _scan() -> tuple[InstalledCache, ...]:
    found: dict[str, InstalledCache] = {}
    for dist in _cubin_distributions():
        for point in dist.entry_points.select(group=ENTRY_POINT_GROUP):
            if point.name in found:  # a distribution shadowed on sys.path: the first counts
                continue
            found[point.name] = _resolve(point, dist.metadata["Name"] or "", dist.version or "")
    return tuple(found[name] for name in sorted(found))


def _cubin_distributions():
    """The installed cubin wheels' distributions, in sys.path order. Only dist-info dirs
    named like a cubin wheel (``mlpjit_cubins*``, which `cache export --wheel` enforces) are
    read: importlib.metadata.entry_points() would parse every installed distribution's
    metadata, tens of milliseconds of a server's start-up."""
    try:
        from importlib.metadata import PathDistribution
    except ImportError as err:  # a process that can no longer read the stdlib (dropped uid)
        log.warning("mlpjit: not looking for cubin wheels: %s", one_line(err))
        return
    for entry in sys.path:
        try:
            with os.scandir(entry or ".") as names:
                infos = sorted(
                    n.path for n in names
                    if n.name.startswith(_DIST_INFO_PREFIX) and n.name.endswith(".dist-info")
                )  # fmt: skip
        except OSError:  # not a directory (a zip, a missing entry): no wheel there
            continue
        for info in infos:
            yield PathDistribution(Path(info))


def _resolve(point, dist: str, version: str) -> InstalledCache:
    """The cache dir ``point`` names, or why it names none (warned once)."""
    path: Path | None = None
    try:
        value = point.load()()
        if not isinstance(value, (str, os.PathLike)) or not os.path.isabs(value):
            raise ValueError(f"it returned {value!r}, not an absolute path")
        path = Path(value)
        problem = ""
    except Exception as err:  # noqa: BLE001 (another distribution's code: report, go on)
        problem = f"entry point {point.value} failed: {one_line(err)}"
        log.warning(
            "mlpjit: skipping cubin wheel %s: %s (fix: reinstall it, or set MLPJIT_CACHE_WHEELS=0)",
            dist or point.name,
            problem,
        )
    return InstalledCache(point.name, dist, version, path, problem)
