"""Cubin wheels: verified cache entries as a pip-installable wheel (`mlpjit cache export --wheel`).

The wheel is pure Python (py3-none-any) and holds one package, ``mlpjit_cubins_<tag>``: its
``cache/`` directory is a read-only cache tier (cache_layout.py: v1/entries/<key[:2]>/<key>
.cubin and .json, and v1/aliases/<spec_key> so a machine without the compiler finds them),
and its ``cache_dir()`` returns that directory. The ``mlpjit.cache_dirs`` entry point names
that function, so once the wheel is installed mlpjit finds it (installed.py) with no
environment variable, as one more read-only tier with the same trust rules and the same
verification on every load as any other.

The file follows the binary distribution format (PEP 427 and its successor on
packaging.python.org): ``{name}-{version}.dist-info`` with METADATA, WHEEL,
entry_points.txt and RECORD (each file's urlsafe-base64 sha256 without padding and its
size; RECORD's own row has neither), written with the standard library only,
deterministically (sorted, fixed times and modes): the same entries, name and version give
the same bytes. It is written to a temp file next to its destination and renamed into
place, so a failed export leaves no half wheel behind.
"""

from __future__ import annotations

import base64
import hashlib
import re
import stat
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from mlpjit.jit import cache_layout
from mlpjit.jit.archive import collect_entries, portable_manifest
from mlpjit.jit.entry import Entry, timestamp
from mlpjit.jit.installed import ENTRY_POINT_GROUP
from mlpjit.jit.safe_fs import write_replacing
from mlpjit.jit.store import CacheStore

__all__ = [
    "DIST_PREFIX",
    "WheelReport",
    "check_name",
    "check_version",
    "default_name",
    "default_version",
    "wheel_file_name",
    "write_wheel",
]

DIST_PREFIX = "mlpjit-cubins"
CACHE_DIR = "cache"  # the tier inside the package
MAX_NAME_CHARS = 100
WHEEL_MODE = 0o644  # of the written wheel, whatever the umask
_TAG = "py3-none-any"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip holds: reproducible bytes
_NAME_RE = re.compile(r"[a-z0-9]+(?:[-_.][a-z0-9]+)*", re.IGNORECASE)  # a PEP 508 name
# Versions in their normalized PEP 440 form only, so the file name, the dist-info directory
# and what pip shows are the same string.
_N = r"(?:0|[1-9][0-9]*)"
_VERSION_RE = re.compile(
    rf"(?:[1-9][0-9]*!)?{_N}(?:\.{_N})*(?:(?:a|b|rc){_N})?(?:\.post{_N})?(?:\.dev{_N})?"
    r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?"
)
_INIT = '''"""Prebuilt mlpjit kernels ({summary}).

mlpjit finds them through the mlpjit.cache_dirs entry point, as a read-only cache tier
(MLPJIT_CACHE_WHEELS=0 turns that off); every entry is verified on load.
"""

import os


def cache_dir() -> str:
    """The read-only mlpjit cache directory this package carries."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "{cache_dir}")
'''


@dataclass
class WheelReport:
    """What write_wheel wrote."""

    path: str
    name: str  # the distribution name (normalized)
    version: str
    entries: int = 0
    bytes: int = 0  # size of the wheel file
    skipped: list[dict[str, str]] = field(default_factory=list)  # entries failing verification


def check_name(name: str) -> str:
    """``name`` normalized (lowercase, runs of "-", "_", "." as one "-") if it is a valid
    distribution name starting with "mlpjit-cubins"; ValueError (one line) otherwise.

    The prefix keeps the wheel's package (``mlpjit_cubins_...``) from ever replacing another
    installed package: a wheel named "torch" would overwrite torch's files.
    """
    if len(name) > MAX_NAME_CHARS or not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"--name must be letters, digits and single '-', '_' or '.' between them, at most "
            f"{MAX_NAME_CHARS} characters, e.g. {DIST_PREFIX}-glm5-tp8; got {name[:120]!r}"
        )
    normalized = re.sub(r"[-_.]+", "-", name).lower()
    if normalized != DIST_PREFIX and not normalized.startswith(DIST_PREFIX + "-"):
        raise ValueError(
            f"--name must start with {DIST_PREFIX!r} (its package then never shadows another "
            f"one), e.g. {DIST_PREFIX}-glm5-tp8; got {name!r}"
        )
    return normalized


def check_version(version: str) -> str:
    """``version`` if it is a PEP 440 version in normalized form (e.g. 1.0, 2026.1.2,
    1.0.post1, 1.0+g3f2a); ValueError (one line) otherwise."""
    if len(version) > MAX_NAME_CHARS or not _VERSION_RE.fullmatch(version):
        raise ValueError(
            f"--version must be a normalized PEP 440 version such as 1.0, 2026.1.2, 1.0.post1 "
            f"or 1.0+local (no leading zeros, no 'v'), got {version[:120]!r}"
        )
    return version


def _arch_tag(arch: object) -> str:
    return re.sub(r"[^a-z0-9]+", "", str(arch).lower()) or "any"


def default_name(entries: Sequence[Entry], tags: Iterable[str] = ()) -> str:
    """ "mlpjit-cubins-<tags>-<archs>": e.g. mlpjit-cubins-glm5-tp8-sm90a for
    ``tags=("glm5", "tp8")`` and entries built for sm_90a."""
    archs = sorted({_arch_tag(e.manifest["components"].get("arch")) for e in entries})
    parts = [DIST_PREFIX, *(re.sub(r"[^a-z0-9]+", "-", t.lower()).strip("-") for t in tags)]
    return check_name("-".join(p for p in [*parts, *archs] if p))


def default_version(entries: Sequence[Entry]) -> str:
    """ "<Y>.<M>.<D>+g<hash>": the UTC date of the newest entry, and 12 hex digits of the keys'
    sha256 as a local label, so different contents never share a version. (A package index
    such as PyPI refuses local labels: give --version for one.)"""
    newest = max((timestamp(e.manifest.get("created")) for e in entries), default=0.0)
    day = time.gmtime(newest)
    digest = hashlib.sha256("\n".join(sorted(e.key for e in entries)).encode()).hexdigest()
    return check_version(f"{day.tm_year}.{day.tm_mon}.{day.tm_mday}+g{digest[:12]}")


def wheel_file_name(name: str, version: str) -> str:
    """The wheel's file name: ``{name with _}-{version}-py3-none-any.whl``."""
    return f"{name.replace('-', '_')}-{version}-{_TAG}.whl"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def _aliases(entries: Sequence[Entry]) -> dict[str, str]:
    """spec_key -> the key of its newest entry (what the writable tier's alias would name)."""
    newest: dict[str, Entry] = {}
    for entry in entries:
        spec = entry.manifest["spec_key"]
        best = newest.get(spec)
        when = (timestamp(entry.manifest.get("created")), entry.key)
        if best is None or when > (timestamp(best.manifest.get("created")), best.key):
            newest[spec] = entry
    return {spec: entry.key for spec, entry in newest.items()}


def _files(entries: Sequence[Entry], name: str, version: str) -> list[tuple[str, bytes]]:
    """Every file of the wheel but RECORD, in the order written."""
    package = name.replace("-", "_")
    root = f"{package}/{CACHE_DIR}"
    archs = ", ".join(sorted({str(e.manifest["components"].get("arch")) for e in entries}))
    summary = f"{len(entries)} cache entries for {archs}"
    files = [(f"{package}/__init__.py", _INIT.format(summary=summary, cache_dir=CACHE_DIR))]
    for entry in entries:
        mpath, cpath = cache_layout.entry_paths(Path(root), entry.key)
        files.append((cpath.as_posix(), entry.cubin))
        files.append((mpath.as_posix(), portable_manifest(entry)))
    for spec, key in sorted(_aliases(entries).items()):
        files.append((cache_layout.alias_path(Path(root), spec).as_posix(), f"{key}\n"))
    info = f"{package}-{version}.dist-info"
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {name}\n"
        f"Version: {version}\n"
        f"Summary: Prebuilt mlpjit kernels: {summary}\n"
    )
    wheel = f"Wheel-Version: 1.0\nGenerator: mlpjit\nRoot-Is-Purelib: true\nTag: {_TAG}\n"
    points = f"[{ENTRY_POINT_GROUP}]\n{name} = {package}:cache_dir\n"
    files += [
        (f"{info}/METADATA", metadata),
        (f"{info}/WHEEL", wheel),
        (f"{info}/entry_points.txt", points),
    ]
    return [(path, data.encode() if isinstance(data, str) else data) for path, data in files]


def _write_zip(out: BinaryIO, files: list[tuple[str, bytes]], record_name: str) -> None:
    rows = [f"{path},{_record_hash(data)},{len(data)}" for path, data in files]
    rows.append(f"{record_name},,")
    with zipfile.ZipFile(out, "w") as wheel:
        for path, data in [*files, (record_name, ("\n".join(rows) + "\n").encode())]:
            info = zipfile.ZipInfo(path, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            wheel.writestr(info, data)


def write_wheel(
    store: CacheStore,
    directory: Path,
    keys: Iterable[str] | None = None,
    *,
    name: str | None = None,
    version: str | None = None,
    tags: Iterable[str] = (),
) -> WheelReport:
    """Write every verified entry of ``store`` (or only ``keys``) as a cubin wheel in
    ``directory`` (created if missing); returns what was written.

    ``name`` / ``version``: checked (check_name, check_version); None for default_name
    (with ``tags``) and default_version. ValueError (one line, nothing written) when no
    entry is selected, a key is not in the cache, or ``directory`` is not a directory.
    Entries that fail verification are skipped and listed in the report.
    """
    entries, skipped = collect_entries(store, keys)
    if not entries:
        raise ValueError(
            "no verified entries to put in a wheel (warm the cache, or widen the filters)"
        )
    name = check_name(name) if name is not None else default_name(entries, tags)
    version = check_version(version) if version is not None else default_version(entries)
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"--wheel {directory} is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / wheel_file_name(name, version)
    files = _files(entries, name, version)
    record = f"{name.replace('-', '_')}-{version}.dist-info/RECORD"
    size = write_replacing(
        path, WHEEL_MODE, lambda out: _write_zip(out, files, record), "wheel destination"
    )
    return WheelReport(str(path), name, version, len(entries), size, skipped)
