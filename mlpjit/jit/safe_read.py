"""Reading untrusted cache files: regular files only, bounded, and JSON that cannot crash us.

Cache entries, aliases and archives may come from a read-only cache dir, another machine or a
damaged disk. Opening a FIFO blocks forever, a symlink to /dev/zero never ends and grows
memory without limit, and ``json.loads(b"[" * 100000)`` raises RecursionError; each of
these must be an error about that one file, never a hang or a crashed command.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

__all__ = ["loads_json", "open_regular", "read_regular"]

_CHUNK = 1 << 20


def open_regular(path: Path, follow_symlinks: bool = False) -> tuple[int, os.stat_result]:
    """Open ``path`` read-only and return (fd, fstat) if it is a regular file.

    O_NONBLOCK makes opening a FIFO return at once (fstat then refuses it) instead of
    waiting for a writer; O_NOFOLLOW (unless ``follow_symlinks``) refuses a symlink as the
    last component. ValueError if it is not a regular file; OSError if it cannot be opened.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_symlinks:
            raise ValueError(f"{path} is a symbolic link (refused)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file (mode {stat.filemode(st.st_mode)})")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_at_most(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd`` (fewer at end of file)."""
    chunks = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, min(remaining, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_regular(path: Path, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``path`` (not a symlink) and its fstat.

    ValueError if it is not a regular file or holds more than ``max_bytes`` bytes (at most
    max_bytes + 1 are ever read, so a file that grows while we read cannot exhaust memory);
    OSError if it cannot be opened or read.
    """
    fd, st = open_regular(path)
    try:
        if st.st_size > max_bytes:
            raise ValueError(f"{path} is {st.st_size} bytes, over the {max_bytes} byte limit")
        data = _read_at_most(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ValueError(f"{path} grew past the {max_bytes} byte limit while being read")
    return data, st


def loads_json(raw: bytes) -> Any:
    """``json.loads(raw)``, with every way it can fail on hostile input as one ValueError.

    That covers invalid UTF-8, invalid JSON, integers too long to convert and nesting deep
    enough to raise RecursionError.
    """
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON is nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise ValueError(f"not valid JSON ({err})") from None
