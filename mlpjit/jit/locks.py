"""Per-key inter-process locks (filelock) with non-blocking try and bounded waits.

The lock guards "re-check, compile, publish" of one cache key so W processes compile each
key once. It is an OS file lock (flock), so a holder that dies (even kill -9) frees it. If
the lock file cannot be created at all (read-only or missing cache dir), the lock degrades to
a no-op: there is then no shared cache to protect, and each process compiles for itself.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import TracebackType

import filelock

__all__ = ["KeyLock"]

log = logging.getLogger(__name__)


class KeyLock:
    """An exclusive lock on one cache key; one instance per acquiring thread.

    ``path=None`` (or a lock file that cannot be opened) gives a lock that always succeeds
    without excluding anyone; ``shared`` tells which of the two it is.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.shared = path is not None
        self._held = False
        # preserve_lock_file: never unlink lock files, so no waiter can end up holding a lock
        # on an unlinked inode while a newcomer locks a fresh file of the same name.
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
        try:
            self._lock.acquire(timeout=timeout)
        except filelock.Timeout:
            return False
        except OSError as err:
            # No usable lock file (read-only dir, missing parent): nothing shared to guard.
            log.debug("mlpjit: cannot lock %s (%s); continuing unlocked", self.path, err)
            self._lock = None
            self.shared = False
            self._held = True
            return True
        self._held = True
        return True

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; never blocks."""
        return self._attempt(0)

    def acquire(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the lock; True if taken."""
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        return self._attempt(timeout)

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
