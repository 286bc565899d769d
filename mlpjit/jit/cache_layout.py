"""The on-disk layout of a cache tier: every path and file name, in one place.

Under a tier (the writable MLPJIT_CACHE_DIR, or a read-only MLPJIT_CACHE_PATH directory):

    v1/entries/<key[:2]>/<key>.cubin   the code
    v1/entries/<key[:2]>/<key>.json    the manifest; written last, so its presence commits
    v1/aliases/<spec_key>              full key of the latest entry for a toolchain-less spec
    v1/locks/<key>.lock                per-key compile locks (see locks.py)
    v1/quarantine/<key>.<ns>.<pid>/    entries that failed verification, with reason.txt
    v1/tmp/<pid>.<random>              temp files of in-progress publishes

Keys become file names, so only full keys (64 lowercase hex) ever reach a path here. The
store, maintenance, doctor and archive import build paths through these functions only.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

__all__ = [
    "AREAS",
    "LOCK_SUFFIX",
    "MAX_ALIAS_BYTES",
    "MAX_CUBIN_BYTES",
    "MAX_MANIFEST_BYTES",
    "QUARANTINE_REASON",
    "VERSION_DIR",
    "alias_path",
    "area",
    "check_key",
    "entry_paths",
    "is_key",
    "is_shard",
    "key_of_lock_file",
    "lock_path",
    "quarantine_dir",
    "temp_pid",
    "temp_prefix",
    "version_dir",
]

VERSION_DIR = "v1"  # the layout's version: a new layout gets a new directory beside it
AREAS = ("entries", "aliases", "locks", "quarantine", "tmp")
QUARANTINE_REASON = "reason.txt"
LOCK_SUFFIX = ".lock"

# Read caps: a bigger file is a corrupt entry (real cubins are ~10 KB-1 MB, manifests ~2 KB,
# an alias is one key and a newline).
MAX_CUBIN_BYTES = 256 << 20
MAX_MANIFEST_BYTES = 1 << 20
MAX_ALIAS_BYTES = 4096

_KEY_RE = re.compile(r"[0-9a-f]{64}")
_SHARD_RE = re.compile(r"[0-9a-f]{2}")
# Temp file names start with the writer's pid and a dot ("<pid>.<random>"), so maintenance
# can tell a live publish's file from a killed one's.
_TEMP_PID_RE = re.compile(r"^(\d{1,10})\.")


def is_key(text: object) -> bool:
    """Whether ``text`` is a full cache key: exactly 64 lowercase hex (fullmatch: "$" would
    let a trailing newline through, and keys become file names)."""
    return isinstance(text, str) and _KEY_RE.fullmatch(text) is not None


def check_key(key: str, what: str = "key") -> str:
    """Return ``key`` if it is a full cache key (64 lowercase hex); ValueError otherwise.

    Keys become file names, so this also keeps paths inside the cache dir.
    """
    if not is_key(key):
        raise ValueError(f"{what} must be 64 lowercase hex characters, got {key!r}")
    return key


def is_shard(name: str) -> bool:
    """Whether ``name`` is an entry shard directory's name (a key's first two hex digits)."""
    return _SHARD_RE.fullmatch(name) is not None


def version_dir(tier: Path) -> Path:
    """The tier's v1 directory."""
    return tier / VERSION_DIR


def area(tier: Path, name: str) -> Path:
    """The tier's v1/<name> directory (one of AREAS); ValueError for another name."""
    if name not in AREAS:
        raise ValueError(f"cache area must be one of {', '.join(AREAS)}, got {name!r}")
    return version_dir(tier) / name


def entry_paths(tier: Path, key: str) -> tuple[Path, Path]:
    """(manifest, cubin) paths of ``key``'s entry under ``tier``."""
    shard = area(tier, "entries") / key[:2]
    return shard / f"{key}.json", shard / f"{key}.cubin"


def alias_path(tier: Path, spec_key: str) -> Path:
    """The alias file of a toolchain-less spec key under ``tier``."""
    return area(tier, "aliases") / spec_key


def lock_path(tier: Path, key: str) -> Path:
    """The compile lock file of ``key`` under ``tier``."""
    return area(tier, "locks") / f"{key}{LOCK_SUFFIX}"


def key_of_lock_file(name: str) -> str | None:
    """The key a lock file's name is for, or None if the name is no key's lock file."""
    key = name.removesuffix(LOCK_SUFFIX)
    return key if name.endswith(LOCK_SUFFIX) and is_key(key) else None


def quarantine_dir(tier: Path, key: str) -> Path:
    """A fresh directory name in v1/quarantine for a bad entry of ``key`` (time and pid:
    two processes quarantining one key never collide)."""
    return area(tier, "quarantine") / f"{key}.{time.time_ns()}.{os.getpid()}"


def temp_prefix() -> str:
    """The start of this process's temp file names in v1/tmp."""
    return f"{os.getpid()}."


def temp_pid(name: str) -> int | None:
    """The pid a v1/tmp file name starts with, or None if it carries none."""
    match = _TEMP_PID_RE.match(name)
    return None if match is None else int(match.group(1))
