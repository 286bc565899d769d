"""Portable cache archives: `mlpjit cache export FILE` / `mlpjit cache import FILE`.

Format (version 1): an uncompressed POSIX tar of regular files only, written
deterministically (sorted, mtime 0, uid/gid 0, mode 0644), so the same cache exports to the
same bytes:

    mlpjit-archive.json        {"format": "mlpjit-archive", "version": 1, "entries": [
                                 {"key", "kernel", "cubin_sha256", "cubin_bytes",
                                  "manifest_sha256", "manifest_bytes"}, ...]}
    entries/<key>.cubin        the code
    entries/<key>.json         the entry's manifest (canonical JSON, without "last_used")

Import never extracts: members are read into memory and every entry is published through
CacheStore.publish (temp file, fsync, rename, manifest last) under the key's lock. An
archive with anything but the members above (links, devices, directories, absolute or ".."
paths, unknown names, duplicates) is rejected as a whole before anything is written; an
entry whose bytes do not match the archive manifest, or whose components do not hash to
its key, is rejected alone.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlpjit.jit.key import cache_key, canonical_json, short_key
from mlpjit.jit.locks import KeyLock
from mlpjit.jit.store import CacheStore, Entry

__all__ = ["ARCHIVE_VERSION", "ExportReport", "ImportReport", "export_archive", "import_archive"]

ARCHIVE_FORMAT = "mlpjit-archive"
ARCHIVE_VERSION = 1
INDEX_NAME = "mlpjit-archive.json"
# Bounds that keep a hostile archive from exhausting memory (real cubins are ~10 KB-1 MB).
MAX_CUBIN_BYTES = 256 << 20
MAX_JSON_BYTES = 16 << 20

_MEMBER_RE = re.compile(r"^entries/([0-9a-f]{64})\.(cubin|json)$")
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
# Per-machine facts that do not travel: the importing store sets its own.
_LOCAL_FIELDS = ("last_used", "origin")


@dataclass
class ExportReport:
    """What export_archive wrote."""

    path: str
    entries: int = 0
    bytes: int = 0  # size of the archive file
    skipped: list[dict[str, str]] = field(default_factory=list)  # unreadable/corrupt entries


@dataclass
class ImportReport:
    """What import_archive did, entry by entry."""

    path: str
    imported: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # present or being compiled
    rejected: list[dict[str, str]] = field(default_factory=list)  # failed verification


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _portable_manifest(entry: Entry) -> bytes:
    manifest = {k: v for k, v in entry.manifest.items() if k not in _LOCAL_FIELDS}
    return canonical_json(manifest).encode()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    tar.addfile(info, io.BytesIO(data))


def export_archive(
    store: CacheStore, path: Path, keys: Iterable[str] | None = None
) -> ExportReport:
    """Write every verified entry of ``store`` (root and layers), or only ``keys``, to ``path``.

    The archive is written to a temp file next to ``path`` and renamed into place, so a
    failed export leaves no half archive behind. Entries that fail verification are
    skipped and listed in the report.
    """
    path = Path(path)
    wanted = None if keys is None else set(keys)
    report = ExportReport(str(path))
    index: list[dict[str, Any]] = []
    members: list[tuple[str, bytes]] = []
    for key in sorted({k for k, _ in store.iter_manifests()}):
        if wanted is not None and key not in wanted:
            continue
        entry = store.lookup(key)
        if entry is None:
            report.skipped.append({"key": key, "reason": "failed verification"})
            continue
        manifest = _portable_manifest(entry)
        index.append(
            {
                "key": key,
                "kernel": str(entry.manifest.get("components", {}).get("kernel", "")),
                "cubin_sha256": _sha256(entry.cubin),
                "cubin_bytes": len(entry.cubin),
                "manifest_sha256": _sha256(manifest),
                "manifest_bytes": len(manifest),
            }
        )
        members.append((f"entries/{key}.cubin", entry.cubin))
        members.append((f"entries/{key}.json", manifest))
    if wanted is not None:
        missing = sorted(wanted - {e["key"] for e in index})
        if missing:
            raise ValueError(f"keys not in the cache: {', '.join(short_key(k) for k in missing)}")
    header = {"format": ARCHIVE_FORMAT, "version": ARCHIVE_VERSION, "entries": index}
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, INDEX_NAME, json.dumps(header, sort_keys=True, indent=1).encode())
            for name, data in members:
                _add(tar, name, data)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    report.entries = len(index)
    report.bytes = path.stat().st_size
    return report


def _check_member(member: tarfile.TarInfo) -> str:
    """Why ``member`` may not be in an archive ('' if it is acceptable)."""
    name = member.name
    if not member.isreg():
        return f"{name!r} is not a regular file (links, devices and directories are refused)"
    if name.startswith("/") or "\\" in name or ":" in name:
        return f"{name!r} is an absolute or non-portable path"
    if ".." in name.split("/"):
        return f"{name!r} escapes the archive with '..'"
    if name != INDEX_NAME and not _MEMBER_RE.match(name):
        return f"{name!r} is not a member of an mlpjit archive"
    limit = MAX_JSON_BYTES if name.endswith(".json") else MAX_CUBIN_BYTES
    if member.size > limit:
        return f"{name!r} is {member.size} bytes, over the {limit} byte limit"
    return ""


def _read_index(raw: bytes) -> list[dict[str, Any]]:
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"archive index {INDEX_NAME} is not valid JSON ({err})") from None
    if not isinstance(header, dict) or header.get("format") != ARCHIVE_FORMAT:
        raise ValueError(f"not an mlpjit archive ({INDEX_NAME} has the wrong format field)")
    if header.get("version") != ARCHIVE_VERSION:
        raise ValueError(
            f"archive version {header.get('version')!r} is not supported "
            f"(this mlpjit reads version {ARCHIVE_VERSION})"
        )
    entries = header.get("entries")
    if not isinstance(entries, list):
        raise ValueError(f"archive index {INDEX_NAME} has no entries list")
    seen: set[str] = set()
    for item in entries:
        ok = (
            isinstance(item, dict)
            and isinstance(item.get("key"), str)
            and _KEY_RE.match(item["key"])
            and all(
                isinstance(item.get(f), str) and _SHA_RE.match(item[f])
                for f in ("cubin_sha256", "manifest_sha256")
            )
            and all(type(item.get(f)) is int for f in ("cubin_bytes", "manifest_bytes"))
        )
        if not ok:
            raise ValueError(f"archive index entry {item!r} is malformed")
        if item["key"] in seen:
            raise ValueError(f"archive index lists key {short_key(item['key'])} twice")
        seen.add(item["key"])
    return entries


def _check_members(tar: tarfile.TarFile, path: Path) -> dict[str, tarfile.TarInfo]:
    """Check every member's type and name before any content is read; name -> member."""
    members: dict[str, tarfile.TarInfo] = {}
    for member in tar.getmembers():
        problem = _check_member(member)
        if problem:
            raise ValueError(f"archive {path} rejected: {problem}")
        if member.name in members:
            raise ValueError(f"archive {path} rejected: {member.name!r} appears twice")
        members[member.name] = member
    return members


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    if handle is None:  # only for non-regular members, which _check_member refused
        raise ValueError(f"cannot read archive member {member.name!r}")
    return handle.read()


def _verify_entry(item: dict[str, Any], cubin: bytes, raw_manifest: bytes) -> dict[str, Any]:
    """The entry's manifest if its bytes match the index and it describes its key."""
    key = item["key"]
    if len(cubin) != item["cubin_bytes"] or _sha256(cubin) != item["cubin_sha256"]:
        raise ValueError("cubin sha256 or size does not match the archive index")
    if (
        len(raw_manifest) != item["manifest_bytes"]
        or _sha256(raw_manifest) != item["manifest_sha256"]
    ):
        raise ValueError("manifest sha256 or size does not match the archive index")
    try:
        manifest = json.loads(raw_manifest)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"manifest is not valid JSON ({err})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("components"), dict):
        raise ValueError("manifest has no components object")
    if manifest.get("key") != key or cache_key(manifest["components"]) != key:
        raise ValueError("manifest components do not hash to the entry's key")
    if manifest.get("cubin_sha256") != item["cubin_sha256"]:
        raise ValueError("manifest's cubin_sha256 differs from the archive index")
    return manifest


def import_archive(store: CacheStore, path: Path) -> ImportReport:
    """Verify ``path`` and publish its entries into ``store``'s writable root.

    Raises ValueError (nothing written) when the archive itself is malformed or unsafe;
    otherwise returns a report: imported, skipped (already present or being compiled now),
    rejected (entry failed verification, or could not be written).
    """
    path = Path(path)
    try:
        with tarfile.open(path, "r:*") as tar:
            return _import(store, tar, path)
    except tarfile.TarError as err:
        raise ValueError(f"{path} is not a readable tar archive ({err})") from None


def _import(store: CacheStore, tar: tarfile.TarFile, path: Path) -> ImportReport:
    report = ImportReport(str(path))
    members = _check_members(tar, path)
    if INDEX_NAME not in members:
        raise ValueError(f"archive {path} rejected: it has no {INDEX_NAME}")
    index = _read_index(_read(tar, members[INDEX_NAME]))
    expected = {INDEX_NAME}
    for item in index:
        expected.update(f"entries/{item['key']}.{ext}" for ext in ("cubin", "json"))
    unknown = sorted(set(members) - expected)
    if unknown:
        raise ValueError(f"archive {path} rejected: members not in its index: {unknown[:5]}")
    missing = sorted(expected - set(members))
    if missing:
        raise ValueError(f"archive {path} rejected: index lists missing members {missing[:5]}")
    for item in index:
        key = item["key"]
        cubin = _read(tar, members[f"entries/{key}.cubin"])
        try:
            manifest = _verify_entry(item, cubin, _read(tar, members[f"entries/{key}.json"]))
            binary = Entry(key, manifest, cubin, path).binary()
        except ValueError as err:
            report.rejected.append({"key": key, "reason": str(err)})
            continue
        _publish(store, key, manifest, binary, report)
    return report


def _publish(
    store: CacheStore, key: str, manifest: dict[str, Any], binary: Any, report: ImportReport
) -> None:
    """Publish one verified entry under its key lock (skip it if present or in flight)."""
    lock = KeyLock(store.lock_path(key))
    if not lock.try_acquire():
        report.skipped.append({"key": key, "reason": "being compiled by another process"})
        return
    try:
        existing = store.lookup(key)
        if existing is not None and existing.origin == store.root:
            report.skipped.append({"key": key, "reason": "already in the cache"})
            return
        seconds = manifest.get("compile_seconds")
        seconds = float(seconds) if isinstance(seconds, (int, float)) else 0.0
        entry = store.publish(key, manifest["components"], binary, seconds)
    finally:
        lock.release()
    if entry.persisted:
        report.imported.append(key)
    else:
        report.rejected.append({"key": key, "reason": f"could not write to {store.root}"})
