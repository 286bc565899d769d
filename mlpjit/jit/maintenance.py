"""Cache maintenance behind `mlpjit cache ...`: list, inspect, stats, verify, prune, clear.

Each function takes a CacheStore and returns plain JSON-able data (the CLI prints it as text
or JSON). Entries are only removed through CacheStore.remove, which takes the key's lock
without waiting: an entry some process is compiling or publishing right now is left alone
and reported as busy, never half-deleted.

Prune and clear also remove what killed processes leave behind (``remove_leftovers``): temp
files of publishes that never got renamed, cubins whose manifest never got written, aliases
naming an entry that is gone, and compile scratch dirs (mlpjit.jit.scratch). Each is removed
only when no live process can still be using it: see the rules in each helper.
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlpjit.jit import cache_layout
from mlpjit.jit.bounds import seconds
from mlpjit.jit.cache_layout import is_key
from mlpjit.jit.safe_fs import opened_dir, remove_at
from mlpjit.jit.scratch import pid_alive, remove_dead_scratch
from mlpjit.jit.store import CacheStore
from mlpjit.jit.trust import same_file, tier_problem
from mlpjit.jit.writable_tier import alias_file_key

if TYPE_CHECKING:
    from mlpjit.jit.remote import RemoteCache

__all__ = [
    "LIVE_TEMP_MAX_AGE",
    "ORPHAN_MIN_AGE",
    "cache_stats",
    "clear_cache",
    "entry_rows",
    "find_entry",
    "prune_cache",
    "remove_leftovers",
    "repair_layout",
    "verify_cache",
]

# A publish writes its temp file and renames it within milliseconds; a temp file of a live
# process that is older than this was abandoned (or its pid was reused), so it goes too.
LIVE_TEMP_MAX_AGE = 600.0
# A cubin is renamed into place a moment before its manifest. A publisher that timed out on
# the key lock publishes without holding it (CompileManager._claim_and_build), so the lock
# alone cannot prove that a cubin without a manifest is abandoned: it must also be older.
ORPHAN_MIN_AGE = 60.0


def _count(path: Path, pattern: str) -> int:
    try:
        return sum(1 for _ in path.glob(pattern))
    except OSError:
        return 0


def entry_rows(store: CacheStore) -> list[dict[str, Any]]:
    """One summary per committed entry (root first, then the read-only tiers), sorted by
    kernel and key."""
    rows = []
    for key, manifest in store.iter_manifests():
        components = manifest.get("components")
        components = components if isinstance(components, dict) else {}
        row = {
            "key": key,
            "kernel": components.get("kernel"),
            "params": components.get("params"),
            "arch": components.get("arch"),
            "cubin_bytes": manifest.get("cubin_bytes"),
            "created": manifest.get("created"),
            "last_used": manifest.get("last_used"),
            "origin": manifest.get("origin"),
        }
        if "error" in manifest:
            row["error"] = manifest["error"]
        rows.append(row)
    rows.sort(key=lambda r: (str(r["kernel"]), r["key"]))
    return rows


def find_entry(store: CacheStore, prefix: str) -> tuple[str, dict[str, Any]]:
    """The (key, manifest) whose key starts with ``prefix``; ValueError if none or several."""
    prefix = prefix.strip().lower()
    if not prefix or any(c not in "0123456789abcdef" for c in prefix):
        raise ValueError(f"KEY must be a hex key or key prefix, got {prefix!r}")
    found = [(k, m) for k, m in store.iter_manifests() if k.startswith(prefix)]
    if not found:
        raise ValueError(f"no cache entry has a key starting with {prefix!r}")
    if len(found) > 1:
        keys = ", ".join(k[:16] for k, _ in found[:5])
        raise ValueError(f"key prefix {prefix!r} matches {len(found)} entries ({keys}...)")
    return found[0]


def cache_stats(store: CacheStore, remote: RemoteCache | None = None) -> dict[str, Any]:
    """Entries and bytes (total, per kernel, per origin), quarantined entries, lock files;
    "layers" lists the read-only dirs (the key users know), "wheels" the cubin wheels among
    them (path -> "name version");
    with ``remote`` also "remote": the fleet cache's report (remote.remote_report: entries,
    the fleet-wide hits, rejected and uploads, reachable, error)."""
    kernels: dict[str, dict[str, int]] = {}
    origins: dict[str, dict[str, int]] = {}
    entries = total = unreadable = 0
    for row in entry_rows(store):
        size = row["cubin_bytes"] if type(row["cubin_bytes"]) is int else 0
        entries += 1
        total += size
        unreadable += "error" in row
        for table, name in ((kernels, str(row["kernel"])), (origins, str(row["origin"]))):
            slot = table.setdefault(name, {"entries": 0, "bytes": 0})
            slot["entries"] += 1
            slot["bytes"] += size
    data = {
        "root": str(store.root),
        "layers": [str(p) for p in store.read_only],
        # Which layers are installed cubin wheels: path -> "name version".
        "wheels": {str(p): w.label() for p in store.read_only if (w := store.wheel_of(p))},
        "entries": entries,
        "bytes": total,
        "unreadable_manifests": unreadable,
        "kernels": dict(sorted(kernels.items())),
        "origins": origins,
        "quarantined": _count(store.area("quarantine"), "*"),
        "lock_files": _count(store.area("locks"), f"*{cache_layout.LOCK_SUFFIX}"),
        "temp_files": _count(store.area("tmp"), "*"),
    }
    if remote is not None:
        from mlpjit.jit.remote import remote_report

        data["remote"] = remote_report(remote)
    return data


def verify_cache(store: CacheStore) -> dict[str, Any]:
    """Re-verify every entry (sha256, size, key); quarantine bad ones in the writable root.

    A bad entry in a read-only tier cannot be moved: it is reported (and skipped by every
    lookup). Verification goes through CacheStore.lookup, the same check every load does.
    Directories every access refuses (the root's layout, CacheStore.layout_problems, and
    read-only tiers failing the tier rule) are reported too, each as {"path", "action",
    "reason"}.
    """
    checked, bad = 0, []
    for path, reason in store.layout_problems():
        action = "refused by every access (`mlpjit cache clear` repairs it)"
        bad.append({"key": "", "path": str(path), "action": action, "reason": reason})
    for path in store.read_only:
        problem = tier_problem(path)
        if problem not in (None, "missing"):
            action = "skipped (read-only layer)"
            bad.append({"key": "", "path": str(path), "action": action, "reason": problem})
    dirs = len(bad)
    for key, manifest in list(store.iter_manifests()):
        checked += 1
        origin = manifest.get("origin")
        before = store.quarantined
        entry = store.lookup(key)
        if entry is not None and store.quarantined == before:
            continue
        writable = origin == str(store.root)
        bad.append(
            {
                "key": key,
                "origin": origin,
                "action": "quarantined" if writable else "skipped (read-only layer)",
                "reason": manifest.get("error", "failed verification (sha256, size or key)"),
            }
        )
    return {"checked": checked, "ok": checked - (len(bad) - dirs), "bad": bad}


def _root_entries(store: CacheStore) -> Iterator[tuple[str, float, int]]:
    """(key, last_used, cubin_bytes) of the writable root's entries."""
    root = str(store.root)
    for key, manifest in store.iter_manifests():
        if manifest.get("origin") != root:
            continue
        size = manifest.get("cubin_bytes")
        used = manifest.get("last_used")
        yield (
            key,
            float(used) if isinstance(used, (int, float)) else 0.0,
            (size if type(size) is int else 0),
        )


def prune_cache(
    store: CacheStore,
    max_bytes: int | None = None,
    older_than: float | None = None,
    now: float | None = None,
    scratch_base: Path | None = None,
) -> dict[str, Any]:
    """Remove root entries unused for ``older_than`` seconds, then least recently used ones
    until the root holds at most ``max_bytes`` of cubins, then the leftovers of killed
    processes (see remove_leftovers). Read-only tiers are never touched."""
    if max_bytes is None and older_than is None:
        raise ValueError("prune needs max_bytes and/or older_than")
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    if older_than is not None:
        older_than = seconds(older_than, "older_than", (0.0, math.inf))
    now = time.time() if now is None else now
    entries = sorted(_root_entries(store), key=lambda e: (e[1], e[0]))  # LRU first
    total = sum(size for _, _, size in entries)
    removed, busy, freed = [], [], 0
    for key, used, size in entries:
        too_old = older_than is not None and now - used > older_than
        too_big = max_bytes is not None and total > max_bytes
        if not (too_old or too_big):
            continue
        if store.remove(key):
            removed.append(key)
            freed += size
            total -= size
        else:
            busy.append(key)
    return {
        "removed": removed,
        "busy": busy,
        "freed_bytes": freed,
        "remaining_entries": len(entries) - len(removed),
        "remaining_bytes": total,
        "leftovers": remove_leftovers(store, now, scratch_base),
    }


def clear_cache(store: CacheStore, scratch_base: Path | None = None) -> dict[str, Any]:
    """Repair the root's layout (repair_layout), then remove every root entry (busy ones
    are left and reported), the quarantine and the leftovers of killed processes (see
    remove_leftovers)."""
    repaired = repair_layout(store)
    removed, busy = [], []
    for key, _used, _size in list(_root_entries(store)):
        (removed if store.remove(key) else busy).append(key)
    return {
        "repaired": repaired,
        "removed": removed,
        "busy": busy,
        "quarantine_removed": _empty_quarantine(store),
        "leftovers": remove_leftovers(store, scratch_base=scratch_base),
    }


def _under_root(store: CacheStore, path: Path) -> tuple[str, ...]:
    return path.relative_to(store.root).parts


def repair_layout(store: CacheStore) -> list[str]:
    """Remove each directory of the root's layout that every access refuses (a symlink is
    unlinked itself, never followed; a directory of another owner or open to group/other
    writes goes with its contents), so the store recreates it safely; returns their paths.

    The parents are opened without following links, so nothing outside the root is touched.
    """
    repaired = []
    for path, _reason in store.layout_problems():
        try:
            with opened_dir(store.root, *_under_root(store, path.parent)) as parent:
                remove_at(parent, path.name)
        except OSError:
            continue
        repaired.append(str(path))
    return repaired


def _empty_quarantine(store: CacheStore) -> int:
    """Remove everything in v1/quarantine (kept itself) through dir fds; the count removed.

    No link in it is followed and no FIFO or device is opened.
    """
    dropped = 0
    try:
        with opened_dir(store.root, cache_layout.VERSION_DIR, "quarantine") as quarantine:
            for name in os.listdir(quarantine):
                try:
                    dropped += remove_at(quarantine, name)
                except OSError:
                    continue
    except OSError:
        return 0
    return dropped


# --------------------------------------------------------------------- leftovers


def remove_leftovers(
    store: CacheStore, now: float | None = None, scratch_base: Path | None = None
) -> dict[str, dict[str, int]]:
    """Remove what killed processes left in the writable root and the temp dir.

    Returns {kind: {"removed": n, "kept": n}} for "temp_files", "orphan_cubins",
    "stale_aliases", "stale_locks" and "scratch_dirs"; "kept" counts the ones a live
    process may still be using. ``scratch_base``: where compile scratch dirs are (default:
    the temp dir).
    """
    now = time.time() if now is None else now
    return {
        "temp_files": _remove_temp_files(store, now),
        "orphan_cubins": _remove_orphan_cubins(store, now),
        "stale_aliases": _remove_stale_aliases(store),
        "stale_locks": _remove_stale_locks(store),
        "scratch_dirs": remove_dead_scratch(scratch_base, now),
    }


def _listdir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def _unlink_if_same(path: Path, before: os.stat_result) -> bool:
    """Unlink ``path`` if it is still the file ``before`` described; True if removed."""
    if not same_file(path, before):
        return False
    try:
        path.unlink()
    except OSError:
        return False
    return True


def _temp_in_use(name: str, st: os.stat_result, now: float) -> bool:
    """Whether a v1/tmp file may belong to a publish in flight: young, and its pid (when
    the name carries one) alive on this host."""
    if now - st.st_mtime >= LIVE_TEMP_MAX_AGE:
        return False
    pid = cache_layout.temp_pid(name)
    return pid is None or pid_alive(pid)


def _remove_temp_files(store: CacheStore, now: float) -> dict[str, int]:
    """Remove v1/tmp files no publish in flight can own (see _temp_in_use)."""
    removed = kept = 0
    if not store.writable.usable("tmp"):
        return {"removed": 0, "kept": 0}
    for path in _listdir(store.area("tmp")):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue  # the store never makes dirs here: not ours to guess about
        if _temp_in_use(path.name, st, now):
            kept += 1
        else:
            removed += _unlink_if_same(path, st)
    return {"removed": removed, "kept": kept}


def _shards(store: CacheStore) -> Iterator[Path]:
    """The root's checked v1/entries/<xx> dirs."""
    if not store.writable.usable("entries"):
        return
    for shard in _listdir(store.area("entries")):
        if store.writable.usable("entries", shard.name):
            yield shard


def _remove_orphan(store: CacheStore, key: str, cubin: Path, st: os.stat_result) -> bool:
    """Remove the manifest-less ``cubin`` under its key lock; False if busy or committed."""
    with store.try_lock(key) as held:
        if not held:
            return False  # being compiled or published right now
        if os.path.lexists(cubin.with_suffix(".json")):
            return False  # committed meanwhile: an entry now, not an orphan
        return _unlink_if_same(cubin, st)


def _remove_orphan_cubins(store: CacheStore, now: float) -> dict[str, int]:
    """Remove cubins without a manifest: older than ORPHAN_MIN_AGE, key lock free."""
    removed = kept = 0
    for shard in _shards(store):
        for cubin in sorted(shard.glob("*.cubin")):
            key = cubin.stem
            if not is_key(key) or key[:2] != shard.name:
                continue
            if os.path.lexists(cubin.with_suffix(".json")):
                continue  # a committed entry
            try:
                st = os.lstat(cubin)
            except OSError:
                continue
            if now - st.st_mtime >= ORPHAN_MIN_AGE and _remove_orphan(store, key, cubin, st):
                removed += 1
            else:
                kept += 1
    return {"removed": removed, "kept": kept}


def _has_entry(store: CacheStore, key: str) -> bool:
    return os.path.lexists(cache_layout.entry_paths(store.root, key)[0])


def _remove_alias(store: CacheStore, path: Path, key: str, st: os.stat_result) -> bool:
    """Remove the alias ``path`` naming ``key`` (no entry) under the key's lock."""
    with store.try_lock(key) as held:
        if not held:
            return False  # the key is being (re)published: its manifest may be back any moment
        if _has_entry(store, key):
            return False
        return _unlink_if_same(path, st)


def _remove_stale_aliases(store: CacheStore) -> dict[str, int]:
    """Remove root aliases that name no root entry (or nothing usable at all).

    A re-publish un-commits the manifest for a moment, so an alias of a key whose lock is
    held is kept; an alias replaced since it was read is kept too (_unlink_if_same).
    """
    removed = kept = 0
    if not store.writable.usable("aliases"):
        return {"removed": 0, "kept": 0}
    for path in _listdir(store.area("aliases")):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        key = alias_file_key(path) if is_key(path.name) else None
        if key is not None and _has_entry(store, key):
            continue  # a live alias
        if key is None:
            removed += _unlink_if_same(path, st)  # lookup_alias can never use it
        elif _remove_alias(store, path, key, st):
            removed += 1
        else:
            kept += 1
    return {"removed": removed, "kept": kept}


def _remove_stale_locks(store: CacheStore) -> dict[str, int]:
    """Remove the lock files of keys without a root entry (a failed compile's, or an entry
    removed by an older mlpjit), each only while holding it (locks.remove_lock_file): a lock
    somebody holds is kept, since that key is being compiled right now."""
    from mlpjit.jit.locks import remove_lock_file

    removed = kept = 0
    if not store.writable.usable("locks"):
        return {"removed": 0, "kept": 0}
    for path in _listdir(store.area("locks")):
        key = cache_layout.key_of_lock_file(path.name)
        if key is None or _has_entry(store, key):
            continue
        lock = store.writable.lock(key)
        if not lock.try_acquire():
            kept += 1
            continue
        try:
            if not _has_entry(store, key):  # published while we looked: a live lock
                removed += remove_lock_file(lock)
        finally:
            lock.release()
    return {"removed": removed, "kept": kept}
