"""Cache maintenance behind `mlpjit cache ...`: list, inspect, stats, verify, prune, clear.

Each function takes a CacheStore and returns plain JSON-able data (the CLI prints it as text
or JSON). Removal only ever goes through CacheStore.remove, which takes the key's lock
without waiting: an entry some process is compiling or publishing right now is left alone
and reported as busy, never half-deleted.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlpjit.jit.store import CacheStore

__all__ = [
    "cache_stats",
    "clear_cache",
    "entry_rows",
    "find_entry",
    "prune_cache",
    "verify_cache",
]


def _v1(base: Path) -> Path:
    return base / "v1"


def _count(path: Path, pattern: str) -> int:
    try:
        return sum(1 for _ in path.glob(pattern))
    except OSError:
        return 0


def entry_rows(store: CacheStore) -> list[dict[str, Any]]:
    """One summary per committed entry (root first, then layers), sorted by kernel and key."""
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


def cache_stats(store: CacheStore) -> dict[str, Any]:
    """Entries and bytes (total, per kernel, per origin), quarantined entries, lock files."""
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
    v1 = _v1(store.root)
    return {
        "root": str(store.root),
        "layers": [str(p) for p in store.layers],
        "entries": entries,
        "bytes": total,
        "unreadable_manifests": unreadable,
        "kernels": dict(sorted(kernels.items())),
        "origins": origins,
        "quarantined": _count(v1 / "quarantine", "*"),
        "lock_files": _count(v1 / "locks", "*.lock"),
        "temp_files": _count(v1 / "tmp", "*"),
    }


def verify_cache(store: CacheStore) -> dict[str, Any]:
    """Re-verify every entry (sha256, size, key); quarantine bad ones in the writable root.

    A bad entry in a read-only layer cannot be moved: it is reported (and skipped by every
    lookup). Verification goes through CacheStore.lookup, the same check every load does.
    """
    checked, bad = 0, []
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
    return {"checked": checked, "ok": checked - len(bad), "bad": bad}


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
) -> dict[str, Any]:
    """Remove root entries unused for ``older_than`` seconds, then least recently used ones
    until the root holds at most ``max_bytes`` of cubins. Layers are never touched."""
    if max_bytes is None and older_than is None:
        raise ValueError("prune needs max_bytes and/or older_than")
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    if older_than is not None and older_than < 0:
        raise ValueError(f"older_than must be >= 0 seconds, got {older_than}")
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
    }


def clear_cache(store: CacheStore) -> dict[str, Any]:
    """Remove every root entry (busy ones are left and reported) and the quarantine."""
    removed, busy = [], []
    for key, _used, _size in list(_root_entries(store)):
        (removed if store.remove(key) else busy).append(key)
    quarantine = _v1(store.root) / "quarantine"
    dropped = 0
    try:
        held = list(quarantine.iterdir())
    except OSError:
        held = []
    for item in held:  # keep the directory itself: the store checked it once already
        shutil.rmtree(item, ignore_errors=True)
        dropped += not item.exists()
    return {"removed": removed, "busy": busy, "quarantine_removed": dropped}
