"""The local compile cache: the writable root and the read-only directories, as one chain.

``CacheStore`` walks its tiers in order (tiers.py: the WritableTier of MLPJIT_CACHE_DIR,
then a ReadOnlyTier per MLPJIT_CACHE_PATH directory, then one per installed cubin wheel,
installed.py) and writes only to the first. The
layout every tier has is cache_layout.py's, the rules that decide whether a directory or file is
trusted are trust.py's, and the check that makes bytes an entry is entry.verify_manifest.

A cubin is code that will run in the caller's process (trust rules: docs/SERVER.md,
Security model): every load re-verifies the key, the cubin's sha256 and the manifest's
launch_sha256, for every tier alike; a bad entry is quarantined in the writable root and
skipped (with one warning) in a read-only directory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from mlpjit.jit import cache_layout, config
from mlpjit.jit.binary import KernelBinary
from mlpjit.jit.cache_layout import check_key
from mlpjit.jit.directory_tier import DirectoryTier, ReadOnlyTier
from mlpjit.jit.entry import Entry
from mlpjit.jit.installed import InstalledCache, installed_caches
from mlpjit.jit.writable_tier import WritableTier

__all__ = ["CacheStore"]


class CacheStore:
    """The writable cache root plus read-only directories searched after it."""

    def __init__(
        self,
        root: Path | None = None,
        read_only: Sequence[Path] | None = None,
        installed: Sequence[InstalledCache] | None = None,
    ) -> None:
        """``root``: the writable root (None: MLPJIT_CACHE_DIR); ``read_only``: the
        read-only directories (None: MLPJIT_CACHE_PATH); ``installed``: the cubin wheels
        searched after them (None: those installed, unless MLPJIT_CACHE_WHEELS=0; () for
        none)."""
        # As configured (absolute), for display and for comparing configurations.
        self.configured_root = Path(root if root is not None else config.cache_dir()).absolute()
        self.installed = tuple(
            c
            for c in (installed if installed is not None else installed_caches())
            if c.path is not None
        )
        self.configured_read_only = tuple(
            Path(p).absolute()
            for p in (read_only if read_only is not None else config.cache_path())
        ) + tuple(c.path.absolute() for c in self.installed if c.path is not None)
        # Symlinks are resolved once, here: every check and every file operation uses these
        # paths, so re-pointing a symlink later cannot redirect the store to an unchecked dir.
        self.writable = WritableTier(Path(os.path.realpath(self.configured_root)))
        self.read_only_tiers = tuple(
            ReadOnlyTier(Path(os.path.realpath(p))) for p in self.configured_read_only
        )
        self.tiers: tuple[DirectoryTier, ...] = (self.writable, *self.read_only_tiers)

    @property
    def root(self) -> Path:
        """The writable root (resolved)."""
        return self.writable.path

    @property
    def read_only(self) -> tuple[Path, ...]:
        """The read-only directories (resolved), in search order."""
        return tuple(tier.path for tier in self.read_only_tiers)

    def wheel_of(self, path: Path | str) -> InstalledCache | None:
        """The installed cubin wheel whose tier is ``path`` (resolved, as an entry's
        origin), or None for the writable root and MLPJIT_CACHE_PATH dirs."""
        for cache in self.installed:
            assert cache.path is not None
            if os.path.realpath(cache.path) == os.path.realpath(path):
                return cache
        return None

    @property
    def quarantined(self) -> int:
        """Entries this store moved to quarantine."""
        return self.writable.quarantined

    def area(self, name: str) -> Path:
        """The writable root's v1/<name> directory (one of cache_layout.AREAS); not created or
        checked here."""
        return cache_layout.area(self.root, name)

    def lock_path(self, key: str) -> Path:
        """Path of the key's lock file in the writable root (its directory is created when
        possible)."""
        return self.writable.lock_path(key)

    def try_lock(self, key: str) -> contextlib.AbstractContextManager[bool]:
        """The key's compile lock taken without waiting (see WritableTier.try_lock)."""
        return self.writable.try_lock(key)

    def layout_problems(self) -> list[tuple[Path, str]]:
        """The writable root's refused directories (see WritableTier.layout_problems): what
        `mlpjit cache verify` reports and `mlpjit cache clear` repairs."""
        return self.writable.layout_problems()

    # ----------------------------------------------------------------- reading

    def lookup(self, key: str, *, use: bool = False) -> Entry | None:
        """The verified entry for ``key`` from the first tier that has one; else None.

        ``use``: the entry is loaded to be launched (the compile manager's loads), which sets
        its last_used; ``cache prune`` removes the least recently used first. Every other
        read (verify, export, push, import's check) leaves last_used alone, or reading the
        whole cache would make every entry look just used.
        """
        check_key(key)
        for tier in self.tiers:
            found = tier.get(key, use=use)
            if found.entry is not None:
                return found.entry
        return None

    def lookup_alias(self, spec: str, *, use: bool = False) -> Entry | None:
        """The entry an alias names for a toolchain-less spec key (for compiler-less hits);
        ``use`` as for lookup."""
        check_key(spec, "spec key")
        for tier in self.tiers:
            found = tier.get_alias(spec, use=use)
            if found.entry is not None:
                return found.entry
        return None

    def iter_manifests(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(key, manifest) for every committed entry, root first, each key once.

        Each manifest dict gets "origin" (the tier it is in), "last_used" from the
        manifest's mtime and "cubin_bytes" from the cubin file's size (0 if it is missing or
        not a regular file); "created" is clamped to a showable time. A manifest that cannot
        be read or parsed (not a regular file, too big, not a JSON object, nested too
        deeply) is yielded as {"error": reason, "origin": ...} so callers such as `mlpjit
        cache verify` can report it; the cubin is not read here (use lookup to verify).
        """
        seen: set[str] = set()
        for tier in self.tiers:
            for key, manifest in tier.manifests():
                if key not in seen:
                    seen.add(key)
                    yield key, manifest

    # ----------------------------------------------------------------- writing

    def publish(
        self,
        key: str,
        components: Mapping[str, Any],
        binary: KernelBinary,
        compile_seconds: float,
    ) -> Entry:
        """Publish into the writable root (see WritableTier.publish)."""
        return self.writable.publish(key, components, binary, compile_seconds)

    def quarantine(self, key: str, reason: str) -> None:
        """Move the root's entry for ``key`` (if any) to v1/quarantine/ with ``reason``."""
        self.writable.quarantine(key, reason)

    def remove(self, key: str) -> bool:
        """Delete the root's entry for ``key``; False if absent or being compiled right now
        (see WritableTier.remove)."""
        return self.writable.remove(key)
