"""Open, create, replace and delete through directory fds, never following a link.

A path is looked up again at every use, so a directory that turned into a symlink between
a check and a delete (``v1/quarantine -> /``) would send ``shutil.rmtree`` anywhere, and
``open()`` on a FIFO blocks forever. Here every step below a checked directory is taken
relative to an open fd of that directory, with O_NOFOLLOW (a link is itself the thing
removed or refused, never what it points to) and O_NONBLOCK (a FIFO or device is
recognised by fstat instead of blocking), so a swap can only make an operation fail.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "create_exclusive_at",
    "lstat_at",
    "open_append",
    "open_dir",
    "open_dir_at",
    "opened_dir",
    "remove_at",
    "replace_at",
    "write_replacing",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_UNSAFE_BITS = stat.S_IWGRP | stat.S_IWOTH


def open_dir(path: Path, follow_symlinks: bool = False) -> int:
    """An fd of the directory ``path``; OSError if it is missing, not a directory, or (unless
    ``follow_symlinks``: a path an operator named) a symlink."""
    flags = _DIR_FLAGS if not follow_symlinks else _DIR_FLAGS & ~os.O_NOFOLLOW
    return os.open(path, flags)


def open_dir_at(dir_fd: int, name: str) -> int:
    """An fd of the directory ``name`` inside ``dir_fd``; OSError if it is a symlink or not a
    directory (never follows a link)."""
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


@contextlib.contextmanager
def opened_dir(path: Path, *names: str) -> Iterator[int]:
    """The fd of ``path``/``names``..., each step opened without following a link; closed on
    exit. OSError if a step is missing, a symlink or not a directory."""
    fd = open_dir(path)
    try:
        for name in names:
            child = open_dir_at(fd, name)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """The lstat of ``name`` inside ``dir_fd``, or None if there is nothing there."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove_tree_at(dir_fd: int, name: str, st: os.stat_result) -> None:
    """Remove the directory ``name`` (lstat ``st``) and everything below it, through fds."""
    fd = open_dir_at(dir_fd, name)
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise OSError(errno.EAGAIN, f"{name} was replaced while being removed")
        for child in os.listdir(fd):
            remove_at(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def remove_at(dir_fd: int, name: str) -> bool:
    """Remove whatever ``name`` inside ``dir_fd`` is: a file, FIFO, device, symlink (the link
    itself) or a whole directory tree, never following a link or opening a non-directory.

    Returns True if something was removed, False if nothing was there; OSError if it could
    not be removed.
    """
    st = lstat_at(dir_fd, name)
    if st is None:
        return False
    if stat.S_ISDIR(st.st_mode):
        _remove_tree_at(dir_fd, name, st)
    else:
        os.unlink(name, dir_fd=dir_fd)
    return True


def create_exclusive_at(dir_fd: int, prefix: str, suffix: str = "", mode: int = 0o600):
    """(fd, name) of a new empty file with a random name inside ``dir_fd``, opened for writing.

    O_CREAT | O_EXCL | O_NOFOLLOW: an existing file or a planted symlink of the same name is
    never opened. The mode is set with fchmod, so the umask does not change it.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        name = f"{prefix}{secrets.token_hex(8)}{suffix}"
        try:
            fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            os.unlink(name, dir_fd=dir_fd)
            raise
        return fd, name
    raise FileExistsError(errno.EEXIST, "no unused temp file name found")


def replace_at(dir_fd: int, src: str, dst: str) -> None:
    """Rename ``src`` over ``dst``, both inside ``dir_fd`` (a symlink at ``dst`` is replaced
    itself, its target is untouched)."""
    os.replace(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def open_append(path: Path, mode: int = 0o600) -> int:
    """An fd appending to ``path``, created with ``mode`` if missing; never through a symlink.

    O_NOFOLLOW refuses a link at ``path`` (another user's link to a file only we may write);
    O_NONBLOCK keeps a FIFO without a reader from blocking. OSError unless it is a regular
    file owned by us and not writable by group/other (a file we did not create would let
    others feed lines to whoever reads it).
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(err.errno, f"{path} is a symbolic link (refused)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file (refused)")
        if st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"{path} is owned by uid {st.st_uid}, not by us (refused)")
        if st.st_mode & _UNSAFE_BITS:
            raise OSError(errno.EPERM, f"{path} is writable by group or other users (refused)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_replacing(path: Path, mode: int, write: Callable[[BinaryIO], None], what: str) -> int:
    """Write a file at ``path`` atomically with ``write(file)``, mode ``mode`` whatever the
    umask; returns its size.

    Everything happens through an fd of the destination's directory: a destination that
    exists and is not a regular file (a symlink, device, FIFO, socket or directory:
    `/dev/null` as root) is refused with a one-line ValueError naming it as ``what``, since
    whoever made it may expect the file to land elsewhere; the temp file is created
    exclusively with a random name (never through a planted file or symlink), fsync-ed, then
    renamed over ``path`` (a link that appears there meanwhile is replaced itself, never its
    target written). On any failure the temp file is removed: nothing is left half written.
    """
    dir_fd = open_dir(path.parent if str(path.parent) else Path("."), follow_symlinks=True)
    try:
        st = lstat_at(dir_fd, path.name)
        if st is not None and not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise ValueError(
                f"{what} {path} is {kind} ({stat.filemode(st.st_mode)}); "
                f"name a new file or an existing regular file"
            )
        fd, tmp = create_exclusive_at(dir_fd, f".{path.name}.", ".tmp", mode)
        try:
            with os.fdopen(fd, "wb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
                size = out.tell()
            replace_at(dir_fd, tmp, path.name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return size
