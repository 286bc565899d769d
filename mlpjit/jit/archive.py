"""Portable cache archives: `mlpjit cache export FILE` / `mlpjit cache import FILE`.

Format (version 1): a POSIX tar of regular files only, written deterministically (sorted,
mtime 0, uid/gid 0, mode 0644), so the same cache exports to the same bytes; compressed with
gzip, xz or bzip2 when the destination's name asks for it (.tar.gz / .tgz, .tar.xz,
.tar.bz2: compression.py), deterministically too:

    mlpjit-archive.json        {"format": "mlpjit-archive", "version": 1, "entries": [
                                 {"key", "kernel", "cubin_sha256", "cubin_bytes",
                                  "manifest_sha256", "manifest_bytes"}, ...]}
    entries/<key>.cubin        the code
    entries/<key>.json         the entry's manifest (canonical JSON, without "last_used")

Export refuses a destination that exists and is not a regular file (a symlink, device,
FIFO or directory), writes a temp file made exclusively with a random name next to the
destination (never through a planted symlink), gives it mode 0644 whatever the umask, and
renames it into place.

Import never extracts: members are read into memory and every entry is published through
CacheStore.publish (temp file, fsync, rename, manifest last) under the key's lock. Only a
regular file is read, with caps on its size, on each member and on the bytes read in all.
A compressed one (found by its magic bytes, whatever its name) is first decompressed into
an anonymous temp file, at most MAX_ARCHIVE_BYTES of output, and that plain tar is read
under the same caps, so a decompression bomb is refused once the cap is reached. An
archive with anything but the members above (links, devices, directories, sparse files,
absolute or ".." paths, unknown names, duplicates) is rejected as a whole before anything
is written; an entry
whose bytes do not match the archive index, or that fails the store's own manifest check
(components that hash to its key, cubin sha256, launch_sha256), is rejected alone. An
archive is checked for integrity, not authenticity: whoever imports it trusts its source.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from mlpjit.errors import CorruptEntryError
from mlpjit.jit.cache_layout import MAX_CUBIN_BYTES, MAX_MANIFEST_BYTES, is_key
from mlpjit.jit.compression import (
    compressed_writer,
    compression_for_name,
    compression_of,
    decompress_capped,
)
from mlpjit.jit.entry import Entry, compile_seconds_of, verify_manifest
from mlpjit.jit.key import canonical_json, short_key
from mlpjit.jit.messages import one_line
from mlpjit.jit.safe_fs import write_replacing
from mlpjit.jit.safe_read import loads_json, open_regular
from mlpjit.jit.store import CacheStore

__all__ = [
    "ARCHIVE_VERSION",
    "MAX_ENTRIES",
    "MAX_HEADER_BYTES",
    "MAX_MEMBERS",
    "ExportReport",
    "ImportReport",
    "collect_entries",
    "export_archive",
    "import_archive",
    "portable_manifest",
    "publish_entry",
]

ARCHIVE_FORMAT = "mlpjit-archive"
ARCHIVE_VERSION = 1
INDEX_NAME = "mlpjit-archive.json"
ARCHIVE_MODE = 0o644  # of an exported archive, whatever the umask
# Bounds that keep a hostile archive from exhausting memory or time (real cubins are
# ~10 KB-1 MB): per member (cubins: MAX_CUBIN_BYTES, manifests: MAX_MANIFEST_BYTES), the
# index, and the bytes read from the whole archive.
MAX_JSON_BYTES = 16 << 20
MAX_ARCHIVE_BYTES = 4 << 30
# Far above any real cache (hundreds of kernels per model), and small enough that reading
# the headers of a hostile archive stays a matter of seconds.
MAX_ENTRIES = 8192
MAX_MEMBERS = 2 * MAX_ENTRIES + 1  # a cubin and a manifest per entry, and the index
# Extended headers (PAX, GNU long names) an archive may hold: export writes none (its names
# fit a plain header), a real one needs a path of ~80 bytes and a few fields.
MAX_HEADER_BYTES = 4096
_EXTENDED_TYPES = {
    tarfile.XHDTYPE: "PAX",
    tarfile.XGLTYPE: "PAX global",
    tarfile.SOLARIS_XHDTYPE: "Solaris extended",
    tarfile.GNUTYPE_LONGNAME: "GNU long name",
    tarfile.GNUTYPE_LONGLINK: "GNU long link",
}
_BLOCK = tarfile.BLOCKSIZE
_EXPORT_HINT = (
    "an mlpjit archive is a tar (plain, or gzip, xz or bzip2 compressed) written by "
    "`mlpjit cache export`"
)

_MEMBER_RE = re.compile(r"entries/([0-9a-f]{64})\.(cubin|json)")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
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


def portable_manifest(entry: Entry) -> bytes:
    """``entry``'s manifest as canonical JSON bytes, without the per-machine fields
    (last_used, origin): what an archive, or the fleet cache, carries to other machines."""
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


def collect_entries(
    store: CacheStore, keys: Iterable[str] | None = None
) -> tuple[list[Entry], list[dict[str, str]]]:
    """The verified entries of ``store`` (every local tier), or only those of ``keys``, in
    key order, and the skipped ones ({"key", "reason"}: failed verification).

    What an archive or a cubin wheel holds. ValueError (one line) when a key of ``keys`` is
    not in the cache, or for more than MAX_ENTRIES entries.
    """
    wanted = None if keys is None else set(keys)
    entries: list[Entry] = []
    skipped: list[dict[str, str]] = []
    for key in sorted({k for k, _ in store.iter_manifests()}):
        if wanted is not None and key not in wanted:
            continue
        entry = store.lookup(key)
        if entry is None:
            skipped.append({"key": key, "reason": "failed verification"})
            continue
        entries.append(entry)
    if wanted is not None:
        missing = sorted(wanted - {e.key for e in entries})
        if missing:
            raise ValueError(f"keys not in the cache: {', '.join(short_key(k) for k in missing)}")
    if len(entries) > MAX_ENTRIES:
        raise ValueError(
            f"the cache holds {len(entries)} entries, more than an archive may hold "
            f"({MAX_ENTRIES}); prune it first"
        )
    return entries, skipped


def export_archive(
    store: CacheStore, path: Path, keys: Iterable[str] | None = None
) -> ExportReport:
    """Write every verified entry of ``store`` (every local tier), or only ``keys``, to ``path``.

    Compressed as the name asks (compression.compression_for_name: .tar.gz, .tar.xz,
    .tar.bz2; ValueError before anything is read for one mlpjit does not write). The
    archive is written to a temp file next to ``path`` and renamed into place, so a failed
    export leaves no half archive behind; the file gets mode 0644. Entries that fail
    verification are skipped and listed in the report.
    """
    path = Path(path)
    compression = compression_for_name(path.name)
    report = ExportReport(str(path))
    index: list[dict[str, Any]] = []
    members: list[tuple[str, bytes]] = []
    entries, report.skipped = collect_entries(store, keys)
    for entry in entries:
        key = entry.key
        manifest = portable_manifest(entry)
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
    header = {"format": ARCHIVE_FORMAT, "version": ARCHIVE_VERSION, "entries": index}
    members.insert(0, (INDEX_NAME, json.dumps(header, sort_keys=True, indent=1).encode()))
    report.entries = len(index)
    report.bytes = _write_archive(path, members, compression)
    return report


def _write_archive(path: Path, members: list[tuple[str, bytes]], compression: str | None) -> int:
    """Write ``members`` as a tar at ``path`` atomically (through ``compression``, None: a
    plain tar), mode 0644, never through a link (safe_fs.write_replacing); returns the
    file's size."""

    def write(out: BinaryIO) -> None:
        with (
            compressed_writer(out, compression) as stream,
            tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for member, data in members:
                _add(tar, member, data)

    return write_replacing(path, ARCHIVE_MODE, write, "export destination")


def _member_limit(name: str) -> int:
    """The most bytes the member ``name`` may hold."""
    if name == INDEX_NAME:
        return MAX_JSON_BYTES
    return MAX_MANIFEST_BYTES if name.endswith(".json") else MAX_CUBIN_BYTES


def _check_member(member: tarfile.TarInfo) -> str:
    """Why ``member`` may not be in an archive ('' if it is acceptable)."""
    name = member.name
    if not member.isreg() or member.issparse():
        return (
            f"{name!r} is not a plain regular file (links, devices, directories and sparse "
            f"files are refused)"
        )
    if name.startswith("/") or "\\" in name or ":" in name:
        return f"{name!r} is an absolute or non-portable path"
    if ".." in name.split("/"):
        return f"{name!r} escapes the archive with '..'"
    if name != INDEX_NAME and not _MEMBER_RE.fullmatch(name):
        return f"{name!r} is not a member of an mlpjit archive"
    limit = _member_limit(name)
    if member.size > limit:
        return f"{name!r} is {member.size} bytes, over the {limit} byte limit"
    return ""


def _read_index(raw: bytes) -> list[dict[str, Any]]:
    try:
        header = loads_json(raw)
    except ValueError as err:
        raise ValueError(f"archive index {INDEX_NAME} is unparsable: {err}") from None
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
            and is_key(item["key"])
            and all(
                isinstance(item.get(f), str) and _SHA_RE.fullmatch(item[f])
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
    """The entry's manifest if its bytes match the index and it passes the store's check.

    That check (entry.verify_manifest, the one every load does) covers the components'
    hash, the cubin's sha256 and the launch fields' launch_sha256.
    """
    key = item["key"]
    if len(cubin) != item["cubin_bytes"] or _sha256(cubin) != item["cubin_sha256"]:
        raise ValueError("cubin sha256 or size does not match the archive index")
    if (
        len(raw_manifest) != item["manifest_bytes"]
        or _sha256(raw_manifest) != item["manifest_sha256"]
    ):
        raise ValueError("manifest sha256 or size does not match the archive index")
    try:
        return verify_manifest(key, raw_manifest, cubin)
    except CorruptEntryError as err:
        raise ValueError(str(err)) from None


def import_archive(store: CacheStore, path: Path) -> ImportReport:
    """Verify ``path`` and publish its entries into ``store``'s writable root.

    Raises a one-line ValueError (nothing written) when the archive itself is malformed,
    corrupt, too big (compressed, or once decompressed) or unsafe; otherwise returns a
    report: imported, skipped (already present or being compiled now), rejected (entry
    failed verification, or could not be written).
    """
    path = Path(path)
    with _open_archive(path) as raw:
        _scan_headers(raw, path)
        raw.seek(0)
        try:
            with tarfile.open(fileobj=raw, mode="r:") as tar:
                return _import(store, tar, path)
        except tarfile.TarError as err:
            raise ValueError(
                f"{path} is not a readable tar archive ({one_line(err)}); {_EXPORT_HINT}"
            ) from None


def _scan_headers(raw: io.RawIOBase, path: Path) -> None:
    """Check every tar header's size field before tarfile reads anything behind it.

    tarfile reads an extended header (PAX, GNU long name) into memory whole and parses each
    member's header before anything can be checked, so a 1 GiB PAX header or 300,000 empty
    members would cost gigabytes or minutes. This walk reads only the 512-byte headers:
    ValueError (one line) for an extended header over MAX_HEADER_BYTES, a member over the
    largest member cap, or more than MAX_MEMBERS members. A header it cannot parse ends the
    walk: tarfile then reports the damage itself.
    """
    offset = members = 0
    while True:
        raw.seek(offset)
        block = raw.read(_BLOCK)
        if block is None or len(block) < _BLOCK or block == bytes(_BLOCK):
            return
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            return
        if info.size < 0:
            raise ValueError(f"archive {path} rejected: a header has a negative size")
        kind = _EXTENDED_TYPES.get(info.type)
        if kind is not None and info.size > MAX_HEADER_BYTES:
            raise ValueError(
                f"archive {path} rejected: a {kind} header of {info.size} bytes, over the "
                f"{MAX_HEADER_BYTES} byte limit"
            )
        if kind is None:
            members += 1
            if members > MAX_MEMBERS:
                raise ValueError(
                    f"archive {path} rejected: more than {MAX_MEMBERS} members (an archive holds "
                    f"at most {MAX_ENTRIES} entries)"
                )
            if info.size > MAX_CUBIN_BYTES:
                raise ValueError(
                    f"archive {path} rejected: member {info.name!r} is {info.size} bytes, over "
                    f"the {MAX_CUBIN_BYTES} byte limit"
                )
        offset += _BLOCK + -(-info.size // _BLOCK) * _BLOCK


class _CappedReader(io.RawIOBase):
    """A seekable read-only file that fails once more than ``cap`` bytes were read from it.

    The archive was checked to be a regular file under the cap when opened; this also
    bounds a file that keeps growing while it is read.
    """

    def __init__(self, raw: io.FileIO, cap: int, path: Path) -> None:
        super().__init__()
        self._raw, self._cap, self._path, self._total = raw, cap, path, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._raw.readinto(buffer) or 0
        self._total += count
        if self._total > self._cap:
            raise ValueError(
                f"archive {self._path} rejected: more than {self._cap} bytes read from it"
            )
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        self._raw.close()
        super().close()


def _open_archive(path: Path) -> _CappedReader:
    """The plain tar in ``path`` opened for reading, if it is a regular file.

    A compressed file (by its magic bytes) is decompressed into an anonymous temp file
    first, which is what is returned. ValueError (one line) for a FIFO, device or directory
    (without blocking on a FIFO), a file over MAX_ARCHIVE_BYTES, a compressed stream that is
    corrupt, truncated or decompresses to more than MAX_ARCHIVE_BYTES, or one in a format
    mlpjit does not read (zstd); OSError if it cannot be opened.
    """
    try:
        fd, st = open_regular(path, follow_symlinks=True)  # the operator named this path
    except ValueError as err:
        raise ValueError(f"archive rejected: {one_line(err)}; {_EXPORT_HINT}") from None
    raw = io.FileIO(fd, "rb")
    try:
        if st.st_size > MAX_ARCHIVE_BYTES:
            raise ValueError(
                f"archive {path} rejected: {st.st_size} bytes, over the {MAX_ARCHIVE_BYTES} "
                f"byte limit"
            )
        compression = compression_of(os.pread(fd, 8, 0))
        if compression is None:
            return _CappedReader(raw, MAX_ARCHIVE_BYTES, path)
        source = io.BufferedReader(_CappedReader(raw, MAX_ARCHIVE_BYTES, path))
        with source:  # closes raw too
            try:
                plain = decompress_capped(source, compression, MAX_ARCHIVE_BYTES)
            except ValueError as err:
                if str(err).startswith("archive "):  # the capped reader's own message
                    raise
                raise ValueError(f"archive {path} rejected: {err}") from None
    except BaseException:
        raw.close()
        raise
    return _CappedReader(plain, MAX_ARCHIVE_BYTES, path)


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
        publish_entry(store, key, manifest, binary, report)
    return report


def publish_entry(
    store: CacheStore, key: str, manifest: dict[str, Any], binary: Any, report: ImportReport
) -> None:
    """Publish one verified entry under its key lock (skip it if present or in flight).

    The outcome goes into ``report`` (imported, skipped or rejected); archive import and the
    fleet cache's pull share it.
    """
    with store.try_lock(key) as held:
        if not held:
            report.skipped.append({"key": key, "reason": "being compiled by another process"})
            return
        existing = store.lookup(key)
        if existing is not None and existing.origin == store.root:
            report.skipped.append({"key": key, "reason": "already in the cache"})
            return
        entry = store.publish(key, manifest["components"], binary, compile_seconds_of(manifest))
    if entry.persisted:
        report.imported.append(key)
    else:
        report.rejected.append({"key": key, "reason": f"could not write to {store.root}"})
