"""The local tiers' reading, and the read-only tier.

``DirectoryTier`` reads a cache directory by the layout (cache_layout.py) and the trust
rules (trust.py): verified entries, aliases, the manifests of a listing. Subclasses say
which directories may be read (``dirs_ok``) and what happens to a bad entry:

- ``ReadOnlyTier`` (each MLPJIT_CACHE_PATH directory): judged once; an unsafe or missing
  one, an unsafe directory inside it or a bad entry is skipped with one warning;
- writable_tier.WritableTier (MLPJIT_CACHE_DIR): quarantines it.

Anything unparsable, including JSON nested deep enough to raise RecursionError, is a
corrupt entry, never a crash.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlpjit.errors import CorruptEntryError
from mlpjit.jit import cache_layout, trust
from mlpjit.jit.cache_layout import MAX_ALIAS_BYTES, MAX_CUBIN_BYTES, MAX_MANIFEST_BYTES, is_key
from mlpjit.jit.entry import Entry, timestamp, verify_manifest
from mlpjit.jit.key import short_key, spec_key
from mlpjit.jit.safe_read import loads_json, read_regular
from mlpjit.jit.tiers import MISS, Lookup

if TYPE_CHECKING:
    from mlpjit.jit.locks import TierLock

__all__ = ["DirectoryTier", "ReadOnlyTier", "spec_key_of"]

log = logging.getLogger("mlpjit.jit.store")


class DirectoryTier:
    """A cache directory read by the layout and the trust rules: what both local tiers
    share. Subclasses say which directories may be read (``dirs_ok``) and what happens to
    a bad entry (``_refuse``)."""

    def __init__(self, path: Path) -> None:
        """``path``: the tier's directory, resolved (symlinks are resolved once, by the
        store: every check and file operation uses this path)."""
        self.path = path
        self._mutex = threading.Lock()
        self._warned: set[object] = set()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path})"

    def dirs_ok(self, *parts: str) -> bool:
        """Whether the tier, its v1 and v1/<parts...> are there and may be read."""
        raise NotImplementedError

    def _listable(self, *parts: str) -> bool:
        """Whether v1/<parts...> may be listed for iter_manifests."""
        return self.dirs_ok(*parts)

    def _refuse(self, key: str, reason: str, mstat: os.stat_result) -> None:
        """Deal with ``key``'s bad entry (its manifest had lstat ``mstat``)."""
        raise NotImplementedError

    def _record_use(self, key: str, mpath: Path) -> None:
        """A load for a launch: the writable tier records it (see WritableTier)."""

    def _warn_once(self, token: object, message: str, *args: object) -> None:
        """Log a WARNING the first time ``token`` is seen by this tier (debug afterwards)."""
        with self._mutex:
            first = token not in self._warned
            self._warned.add(token)
        log.log(logging.WARNING if first else logging.DEBUG, message, *args)

    # ----------------------------------------------------------------- reading

    def get(self, key: str, *, use: bool = False) -> Lookup:
        """The verified entry for ``key`` in this tier (a bad one is refused: _refuse)."""
        if not self.dirs_ok("entries", key[:2]):
            return MISS
        mpath, cpath = cache_layout.entry_paths(self.path, key)
        for _ in range(3):
            try:
                mstat = os.lstat(mpath)
            except OSError:
                return MISS  # no manifest: not committed (or removed)
            try:
                raw = trust.read_trusted(mpath, MAX_MANIFEST_BYTES)
                cubin = trust.read_trusted(cpath, MAX_CUBIN_BYTES)
                manifest = verify_manifest(key, raw, cubin)
            except (OSError, CorruptEntryError) as err:
                if not trust.same_file(mpath, mstat):
                    continue  # replaced or removed while we read it: look again
                reason = str(err) if isinstance(err, CorruptEntryError) else f"unreadable: {err}"
                self._refuse(key, reason, mstat)
                return Lookup(rejected=reason)
            if use:
                self._record_use(key, mpath)
            manifest = dict(manifest)
            manifest["last_used"] = max(timestamp(manifest.get("last_used")), mstat.st_mtime)
            return Lookup(Entry(key=key, manifest=manifest, cubin=cubin, origin=self.path))
        return MISS

    def alias_target(self, spec: str) -> str | None:
        """The full key this tier's alias file for ``spec`` names, or None."""
        if not self.dirs_ok("aliases"):
            return None
        path = cache_layout.alias_path(self.path, spec)
        try:
            raw = trust.read_trusted(path, MAX_ALIAS_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, CorruptEntryError) as err:
            self._warn_once(("alias", path), "mlpjit: ignoring cache alias %s: %s", path, err)
            return None
        key = raw.decode("ascii", errors="replace").strip()
        return key if is_key(key) else None

    def get_alias(self, spec_key: str, *, use: bool = False) -> Lookup:
        """The entry this tier's alias names for a toolchain-less spec key, if it is a
        build of that spec; ``use`` as for get."""
        key = self.alias_target(spec_key)
        if key is None:
            return MISS
        found = self.get(key, use=use)
        if found.entry is not None and spec_key_of(found.entry) != spec_key:
            return MISS
        return found

    def shards(self) -> list[Path]:
        """The shard directories of this tier's entries that may be read: real directories
        named like a key's first two digits."""
        if not self._listable("entries"):
            return []
        entries = cache_layout.area(self.path, "entries")
        try:
            shards = sorted(
                p
                for p in entries.iterdir()
                if cache_layout.is_shard(p.name) and trust.is_real_dir(p)
            )
        except OSError:
            return []
        return [s for s in shards if self._listable("entries", s.name)]

    def manifests(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(key, manifest) for every committed entry of this tier (see CacheStore.
        iter_manifests); the cubin is not read."""
        for shard in self.shards():
            for mpath in sorted(shard.glob("*.json")):
                key = mpath.stem
                if not is_key(key) or key[:2] != shard.name:
                    continue
                try:
                    raw, st = read_regular(mpath, MAX_MANIFEST_BYTES)
                    manifest = loads_json(raw)
                    if not isinstance(manifest, dict):
                        raise ValueError("not a JSON object")
                except (OSError, ValueError) as err:
                    yield key, {"error": f"unreadable manifest: {err}", "origin": str(self.path)}
                    continue
                manifest["origin"] = str(self.path)
                # Not under the checksum: sizes come from the file, times are clamped.
                manifest["cubin_bytes"] = trust.regular_size(mpath.with_suffix(".cubin"))
                manifest["created"] = timestamp(manifest.get("created"))
                manifest["last_used"] = max(timestamp(manifest.get("last_used")), st.st_mtime)
                yield key, manifest


def spec_key_of(entry: Entry) -> str:
    """The toolchain-less spec key of a verified entry."""
    return spec_key(entry.manifest["components"])


class ReadOnlyTier(DirectoryTier):
    """A read-only cache directory (MLPJIT_CACHE_PATH), searched after the writable root.

    Judged once by the tier rule (trust.tier_problem): one missing at construction stays
    skipped even if someone creates it later (whoever did is not trusted by this process).
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._verdict: bool | None = False if not os.path.lexists(path) else None
        self._safe_dirs: set[Path] = set()

    def usable(self) -> bool:
        """Whether the tier passes the tier rule, judged once; an unsafe one is skipped
        with one warning."""
        with self._mutex:
            verdict = self._verdict
        if verdict is not None:
            return verdict
        problem = trust.tier_problem(self.path)
        if problem and problem != "missing":
            self._warn_once(
                "tier",
                "mlpjit: skipping read-only cache dir %s: %s (it must be owned by you or root, "
                "with no directory from / down to it writable by other users)",
                self.path,
                problem,
            )
        with self._mutex:
            self._verdict = problem is None
        return problem is None

    def dirs_ok(self, *parts: str) -> bool:
        """The tier and v1/<parts...>, each checked once; an unsafe directory (not a real
        one, writable by group/other, another user's) is skipped with one warning: someone
        else could have put any cubin there."""
        if not self.usable():
            return False
        dirs = [cache_layout.version_dir(self.path)]
        for part in parts:
            dirs.append(dirs[-1] / part)
        for path in dirs:
            if path in self._safe_dirs:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                return False
            problem = trust.dir_problem(st)
            if problem:
                self._warn_once(
                    ("dir", path),
                    "mlpjit: skipping %s in read-only cache dir %s: it is %s (fix: chmod "
                    "go-w, or chown it to the dir's owner)",
                    path,
                    self.path,
                    problem,
                )
                return False
            self._safe_dirs.add(path)
        return True

    def _refuse(self, key: str, reason: str, mstat: os.stat_result) -> None:
        self._warn_once(
            ("entry", key, reason),
            "mlpjit: skipping bad entry %s in read-only cache dir %s: %s",
            short_key(key),
            self.path,
            reason,
        )

    def lock(self, key: str) -> TierLock:
        """A stand-in lock: nothing is ever written here, so there is nothing to guard."""
        from mlpjit.jit.locks import KeyLock

        return KeyLock(None)
