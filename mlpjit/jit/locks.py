"""The lock protocol of every cache tier (TierLock), and the file lock of the local one.

A tier's lock guards "re-check, compile, publish" of one cache key. ``TierLock`` is what
the compile manager holds, whichever tier the lock is in: KeyLock here (a per-key file lock
of the writable root) and remote.lock.RemoteLock (the Redis tier's) both implement it.

KeyLock: per-key inter-process locks (filelock) with non-blocking try and bounded waits.

The lock guards "re-check, compile, publish" of one cache key so W processes compile each
key once. It is an OS file lock (flock), so a holder that dies (even kill -9) frees it. If
the lock file cannot be created at all (read-only or missing cache dir), the lock degrades to
a no-op: there is then no shared cache to protect, and each process compiles for itself.

Lock files are removed with their entries (``cache prune``, ``cache clear``: see
``remove_lock_file``), only by a process that holds the lock. A process that was waiting on
the removed file may then get the lock on it, unlinked; a newcomer meanwhile locks a fresh
file of the same name. So every acquire checks that the file it locked is still the one at
the path, and takes the lock again on the new file when it is not: two holders never
coexist.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path
from types import TracebackType
from typing import Protocol

import filelock

from mlpjit.jit.bounds import check_wait

__all__ = ["KeyLock", "TierLock", "remove_lock_file"]

log = logging.getLogger(__name__)

# Times an acquire takes the lock again after finding its file unlinked (each time another
# process removed the file just as this one locked it: more in a row means a loop).
_RELOCK_TRIES = 8


class TierLock(Protocol):
    """An exclusive lock on one cache key in one tier; one instance per acquiring thread.

    A tier that cannot lock (no usable lock file, Redis unavailable) hands out a stand-in
    that always succeeds without excluding anyone: ``shared`` is then False, since there is
    nothing shared to protect.
    """

    @property
    def held(self) -> bool:
        """Whether this instance holds the lock (or its stand-in)."""
        ...

    shared: bool

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; never waits."""
        ...

    def acquire(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds (checked by check_wait) for the lock."""
        ...

    def release(self) -> None:
        """Release the lock if held (a no-op otherwise)."""
        ...


class KeyLock:
    """An exclusive lock on one cache key; one instance per acquiring thread.

    ``path=None`` (or a lock file that cannot be opened) gives a lock that always succeeds
    without excluding anyone; ``shared`` tells which of the two it is.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.shared = path is not None
        self._held = False
        # preserve_lock_file: filelock never unlinks the file on release; removal is
        # remove_lock_file's, under the lock, and _locked_file_current guards waiters.
        self._lock = (
            None
            if path is None
            else filelock.FileLock(
                os.fspath(path), thread_local=False, preserve_lock_file=True, poll_interval=0.02
            )
        )

    @property
    def held(self) -> bool:
        """Whether this instance currently holds the lock (or its no-op stand-in)."""
        return self._held

    def _attempt(self, timeout: float) -> bool:
        if self._lock is None:
            self._held = True
            return True
        deadline = time.monotonic() + timeout
        for _ in range(_RELOCK_TRIES):
            try:
                self._lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
            except filelock.Timeout:
                return False
            except OSError as err:
                # No usable lock file (read-only dir, missing parent): nothing shared to guard.
                log.debug("mlpjit: cannot lock %s (%s); continuing unlocked", self.path, err)
                self._lock = None
                self.shared = False
                self._held = True
                return True
            if self._locked_file_current():
                self._held = True
                return True
            self._lock.release()  # locked a file removed meanwhile: lock the path's file
        return False

    def _locked_file_current(self) -> bool:
        """Whether the file this instance has just locked is still the one at its path (see
        the module docstring); True when filelock does not say which file it locked."""
        fd = getattr(getattr(self._lock, "_context", None), "lock_file_fd", None)
        if not isinstance(fd, int):
            return True
        try:
            held = os.fstat(fd)
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; never blocks."""
        return self._attempt(0)

    def acquire(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the lock; True if taken."""
        return self._attempt(check_wait(timeout))

    def release(self) -> None:
        """Release the lock if held (a no-op otherwise)."""
        if self._held and self._lock is not None:
            self._lock.release()
        self._held = False

    def __enter__(self) -> KeyLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def remove_lock_file(lock: KeyLock) -> bool:
    """Unlink the lock file of ``lock``, which the caller holds (so no other process holds
    it: a waiter that then locks the unlinked file notices and locks the new one). Only a
    regular file is removed, through its directory's fd without following links; True if
    it was removed. Never raises for a file that is gone or cannot be removed."""
    from mlpjit.jit.safe_fs import lstat_at, opened_dir

    if not lock.held or not lock.shared or lock.path is None:
        return False
    try:
        with opened_dir(lock.path.parent) as dir_fd:
            st = lstat_at(dir_fd, lock.path.name)
            if st is None or not stat.S_ISREG(st.st_mode):
                return False
            os.unlink(lock.path.name, dir_fd=dir_fd)
    except OSError:
        return False
    return True
