"""The trust rules of a cache tier: who may own its directories and files, and how.

A cubin is code that will run in the caller's process (docs/SERVER.md, Security model), so
one rule holds for every local tier (the writable root and each read-only directory):

- the tier and every directory from it down to an entry is a real directory (no symlink)
  owned by this user or root and not writable by group/other;
- no directory above the tier lets another user rename it away (each is owned by this
  user or root and is not group/other writable unless sticky, like /tmp);
- entry files are read only if they are regular files (no symlink, FIFO or device) under
  a size cap, owned by this user or root and not writable by group/other.

Every function here only looks (lstat, fstat, a bounded read); none creates anything.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mlpjit.errors import CacheDirError, CorruptEntryError
from mlpjit.jit.safe_read import read_regular

__all__ = [
    "UNSAFE_BITS",
    "ancestor_problem",
    "dir_problem",
    "file_problem",
    "is_real_dir",
    "read_trusted",
    "refuse_root_dir",
    "refuse_root_parents",
    "regular_size",
    "same_file",
    "tier_problem",
    "trusted_owners",
    "unsafe_dir_reason",
]

UNSAFE_BITS = stat.S_IWGRP | stat.S_IWOTH


def trusted_owners() -> frozenset[int]:
    """Who may own a cache directory or file: this user and root."""
    return frozenset({os.geteuid(), 0})


def dir_problem(st: os.stat_result) -> str:
    """Why a directory with this lstat may not hold cache entries ('' if it may)."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory (symlinks are refused)"
    if st.st_mode & UNSAFE_BITS:
        return "writable by group or other users"
    if st.st_uid not in trusted_owners():
        return f"owned by uid {st.st_uid}, not by a trusted user"
    return ""


def file_problem(st: os.stat_result) -> str:
    """Why an entry file with this fstat may not be used ('' if it may)."""
    if st.st_mode & UNSAFE_BITS:
        return "writable by group or other users"
    if st.st_uid not in trusted_owners():
        return f"owned by uid {st.st_uid}, not by a trusted user"
    return ""


def unsafe_dir_reason(path: Path) -> str | None:
    """Why ``path`` may not be a directory of a cache tier (for tools such as `mlpjit
    doctor`), or None if it may."""
    try:
        st = os.lstat(path)
    except OSError as err:
        return f"{path} cannot be read ({err})"
    problem = dir_problem(st)
    return f"{path} is {problem}" if problem else None


def ancestor_problem(path: Path) -> tuple[Path, str] | None:
    """Why a directory above the tier ``path`` (resolved) lets another user swap the tier
    (None if none does): it became a symlink, is owned by someone else, or is writable by
    group/other without being sticky and ours or root's (like /tmp)."""
    owners = trusted_owners()
    for parent in path.parents:
        try:
            st = os.lstat(parent)
        except OSError:
            continue  # not there yet: the writable root creates it
        if stat.S_ISLNK(st.st_mode):
            return parent, "became a symlink after the path was resolved"
        if not stat.S_ISDIR(st.st_mode):
            continue  # nothing can be created below it: the tier is missing
        if st.st_uid not in owners:
            return parent, f"is owned by uid {st.st_uid}, who could rename what is inside"
        if st.st_mode & UNSAFE_BITS and not st.st_mode & stat.S_ISVTX:
            mode = stat.filemode(st.st_mode)
            return (
                parent,
                f"is writable by group or other users (mode {mode}) without the sticky bit",
            )
    return None


def tier_problem(path: Path) -> str | None:
    """Why the cache tier at ``path`` (resolved; the writable root or a read-only
    directory) is not trusted, None if it is; "missing" if there is nothing there."""
    try:
        st = os.lstat(path)
    except OSError:
        return "missing"
    problem = dir_problem(st)
    if problem:
        return f"{path} is {problem}"
    above = ancestor_problem(path)
    return None if above is None else f"{above[0]} (above {path}) {above[1]}"


def refuse_root_dir(path: Path, st: os.stat_result, is_root: bool) -> None:
    """Raise CacheDirError (one line, with the fix) if the writable root's directory
    ``path`` with lstat ``st`` breaks the rule; return if it keeps it."""
    repair = "" if is_root else "; `mlpjit cache clear` repairs it"
    if not stat.S_ISDIR(st.st_mode):
        raise CacheDirError(
            f"mlpjit cache path {path} is not a directory (a symlink is refused too: it "
            f"could point the cache anywhere){repair}"
        )
    if st.st_mode & UNSAFE_BITS:
        raise CacheDirError(
            f"mlpjit cache dir {path} is writable by group or other users; a cached cubin "
            f"is code, so it is refused. Fix: chmod go-w {path} (or chmod 700 {path}), or "
            f"set MLPJIT_CACHE_DIR to a private directory"
        )
    if st.st_uid not in trusted_owners():
        raise CacheDirError(
            f"mlpjit cache dir {path} is owned by uid {st.st_uid}, not by this user "
            f"(uid {os.geteuid()}) or root; refusing to run code from it. Fix: set "
            f"MLPJIT_CACHE_DIR to a directory you own"
        )


def refuse_root_parents(root: Path) -> None:
    """Raise CacheDirError if a directory above the writable root lets another user rename
    the root away and replace it with their own (see ancestor_problem)."""
    above = ancestor_problem(root)
    if above:
        parent, problem = above
        raise CacheDirError(
            f"mlpjit cache dir {root} is inside {parent}, which {problem}: another user "
            f"could rename the cache away and plant their own cubins. Fix: chmod go-w "
            f"{parent} (or chmod +t {parent}, if it is yours or root's), or set "
            f"MLPJIT_CACHE_DIR to a private directory"
        )


def read_trusted(path: Path, max_bytes: int) -> bytes:
    """The bytes of entry file ``path`` if it is regular, capped and trusted.

    CorruptEntryError if it is not (a symlink, FIFO, device, too big, another user's or
    writable by others); OSError if it cannot be read (e.g. missing).
    """
    try:
        data, st = read_regular(path, max_bytes)
    except ValueError as err:
        raise CorruptEntryError(str(err)) from None
    problem = file_problem(st)
    if problem:
        raise CorruptEntryError(f"{path.name} is {problem}")
    return data


def regular_size(path: Path) -> int:
    """The size of ``path`` if it is a regular file (not a symlink), else 0."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def is_real_dir(path: Path) -> bool:
    """True if ``path`` is a directory and not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def same_file(path: Path, st: os.stat_result) -> bool:
    """True if ``path`` is still the file ``st`` (an lstat) describes: not replaced or
    removed meanwhile."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return (now.st_ino, now.st_dev, now.st_mtime_ns, now.st_size) == (
        st.st_ino,
        st.st_dev,
        st.st_mtime_ns,
        st.st_size,
    )
