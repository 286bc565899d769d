"""What the CLI and `mlpjit doctor` do with the fleet cache, as plain data: push, pull and a
report on the server.

``push`` uploads verified local entries (signed, with a fleet secret); ``pull`` verifies
remote entries (and their signatures, with a fleet secret) and publishes them through
archive import's path (under the key lock, skipping keys being compiled or
already present). Both take key prefixes (a full key is its own prefix) and report every
key in one list: what moved, what was already there, what was refused and why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from mlpjit.jit.archive import ImportReport, portable_manifest, publish_entry
from mlpjit.jit.binary import binary_from_fields
from mlpjit.jit.cache_layout import is_key
from mlpjit.jit.remote.client import RemoteCache
from mlpjit.jit.store import CacheStore

__all__ = ["REPORT_SCAN_CAP", "check_prefixes", "pull", "push", "remote_report"]

REPORT_SCAN_CAP = 100_000  # entries remote_report counts at most
_PREFIX_RE = re.compile(r"[0-9a-f]{1,64}")


def check_prefixes(prefixes: Iterable[str]) -> list[str]:
    """The key prefixes, lowercased and deduplicated in order; ValueError for one that is
    not 1-64 hex characters."""
    checked: list[str] = []
    for prefix in prefixes:
        text = str(prefix).strip().lower()
        if not _PREFIX_RE.fullmatch(text):
            raise ValueError(f"KEY_PREFIX must be 1 to 64 hex characters, got {prefix!r}")
        if text not in checked:
            checked.append(text)
    return checked


def _select(keys: Iterable[str], prefixes: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(the sorted keys that start with one of ``prefixes`` (all with None), the prefixes
    that match none of them)."""
    keys = sorted(set(keys))
    if prefixes is None:
        return keys, []
    chosen = [k for k in keys if any(k.startswith(p) for p in prefixes)]
    unmatched = [p for p in prefixes if not any(k.startswith(p) for k in keys)]
    return chosen, unmatched


def push(
    store: CacheStore, remote: RemoteCache, prefixes: Iterable[str] | None = None
) -> dict[str, Any]:
    """Upload verified local entries (every local tier; all, or those whose key starts with
    one of ``prefixes``) for `mlpjit cache push`.

    A key whose remote entry already verifies is left as it is ("present"); a bad remote
    entry (with a fleet secret: also an unsigned or wrongly signed one) is rejected and
    replaced by a signed upload. Returns plain lists: pushed, present, failed (Redis did
    not take it), missing (prefixes that match no local entry, and entries that failed
    local verification); available (False if Redis failed meanwhile).
    """
    wanted = None if prefixes is None else check_prefixes(prefixes)
    keys, missing = _select((k for k, _ in store.iter_manifests()), wanted)
    report: dict[str, Any] = {"remote": remote.url, "pushed": [], "present": [], "failed": []}
    for key in keys:
        entry = store.lookup(key)
        if entry is None:
            missing.append(key)
        elif remote.verified(key, served=False).found is not None:
            report["present"].append(key)
        elif remote.upload(key, portable_manifest(entry), entry.cubin):
            report["pushed"].append(key)
        else:
            report["failed"].append(key)
    report["missing"] = missing
    report["available"] = remote.available
    return report


def _pull_keys(
    remote: RemoteCache, prefixes: list[str] | None
) -> tuple[list[str], list[str]] | None:
    """(remote keys to pull, prefixes matching none); None if Redis could not be listed.
    Full keys are fetched as they are, without listing Redis."""
    if prefixes is not None and all(is_key(p) for p in prefixes):
        return sorted(prefixes), []
    listed = remote.entry_keys()
    return None if listed is None else _select(listed, prefixes)


def _in_root(store: CacheStore, key: str) -> bool:
    """Whether the writable root already holds a verified entry for ``key``."""
    entry = store.lookup(key)
    return entry is not None and entry.origin == store.root


def pull(
    store: CacheStore, remote: RemoteCache, prefixes: Iterable[str] | None = None
) -> dict[str, Any]:
    """Verify remote entries (all under the prefix, or those whose key starts with one of
    ``prefixes``) and publish them locally, for `mlpjit cache pull`.

    Returns plain lists: pulled, skipped and rejected ({"key", "reason"} each), missing
    (keys not in Redis, prefixes matching none); available; error (None, or why Redis
    could not be listed or failed meanwhile).
    """
    wanted = None if prefixes is None else check_prefixes(prefixes)
    selected = _pull_keys(remote, wanted)
    keys, missing = selected if selected is not None else ([], [])
    report = ImportReport(remote.url)
    for key in keys:
        if _in_root(store, key):  # not fetched at all: no bytes moved, no hit counted
            report.skipped.append({"key": key, "reason": "already in the cache"})
            continue
        fetched = remote.verified(key)
        if fetched.found is not None:
            manifest, cubin = fetched.found.manifest, fetched.found.cubin
            publish_entry(store, key, manifest, binary_from_fields(manifest, cubin), report)
        elif fetched.rejected is not None:
            report.rejected.append({"key": key, "reason": fetched.rejected})
        else:
            missing.append(key)
    error = None
    if selected is None or not remote.available:
        error = f"the remote compile cache {remote.url} is unavailable"
    return {
        "remote": remote.url,
        "pulled": report.imported,
        "skipped": report.skipped,
        "rejected": report.rejected,
        "missing": missing,
        "available": remote.available,
        "error": error,
    }


def remote_report(remote: RemoteCache) -> dict[str, Any]:
    """For `mlpjit doctor` and `mlpjit cache stats`: the settings (url without password,
    prefix, ttl_seconds, signed: whether a fleet secret authenticates entries), a fresh
    probe (reachable, auth_ok, server_version, entries up to REPORT_SCAN_CAP, the
    fleet-wide counters, error) and this process's stats."""
    return {
        "url": remote.url,
        "prefix": remote.prefix,
        "ttl_seconds": None if remote.ttl_ms is None else remote.ttl_ms / 1000,
        **remote.report(REPORT_SCAN_CAP),
        "stats": asdict(remote.stats),
    }
