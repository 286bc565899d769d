"""RemoteLock: the cluster-wide compile lock of one key, in Redis.

A server-side script (lua.ACQUIRE) takes it with a random token and an expiry, taking over
a value no live holder wrote; a daemon thread renews the expiry while it is held
(a holder that dies just lets it expire); only a holder that still sees its own token
deletes it (a Lua script), so a lock that expired and was taken by another node is never
released by the first one.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from mlpjit.jit.bounds import check_wait
from mlpjit.jit.cache_layout import check_key
from mlpjit.jit.key import short_key

if TYPE_CHECKING:
    from mlpjit.jit.remote.client import RemoteCache

__all__ = ["RemoteLock", "poll_delay"]

log = logging.getLogger("mlpjit.jit.remote")

_POLL_FIRST, _POLL_MAX = 0.02, 0.25  # seconds between a waiter's polls (before jitter)


def poll_delay(attempt: int) -> float:
    """Seconds before a waiter's next poll: growing to _POLL_MAX, jittered so that many
    waiters on one key do not poll Redis in lockstep."""
    return min(_POLL_FIRST * 1.5**attempt, _POLL_MAX) * random.uniform(0.5, 1.0)


class RemoteLock:
    """A cluster-wide exclusive lock on one key; one instance per acquiring thread.

    A locks.TierLock, like locks.KeyLock: if Redis is unavailable the lock "succeeds"
    without excluding anyone (``shared`` is then False), since there is no fleet cache to
    protect. While held, a daemon thread extends the expiry every lock_ttl/3; if the lock
    was lost meanwhile (expired while Redis was unreachable, or deleted by someone),
    ``lost`` becomes True.
    """

    def __init__(self, remote: RemoteCache, key: str) -> None:
        self.remote = remote
        self.key = check_key(key)
        self.name = remote.lock_name(key)
        self.token = secrets.token_hex(16)
        self.shared = True
        self.lost = False
        self._held = False
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def held(self) -> bool:
        """Whether this instance holds the lock (or its stand-in when Redis is down)."""
        return self._held

    def try_acquire(self) -> bool:
        """Take the lock if it is free (or Redis is unavailable); never waits."""
        if self._held:
            return True
        reachable, taken = self.remote.set_lock(self.name, self.token)
        if not reachable:
            self.shared = False
            self._held = True
            return True
        if taken:
            self._held, self.shared, self.lost = True, True, False
            self._start_renewal()
        return taken

    def acquire(self, timeout: float, stop: Callable[[], bool] | None = None) -> bool:
        """Wait at most ``timeout`` seconds for the lock; True if taken.

        ``stop()`` is polled between attempts: when it returns True (e.g. the entry has
        appeared) the wait ends early with False.
        """
        deadline = time.monotonic() + check_wait(timeout)
        if self.try_acquire():
            return True
        self.remote.count_lock_wait()
        attempt = 0
        while True:
            if stop is not None and stop():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(poll_delay(attempt), remaining))
            attempt += 1
            if self.try_acquire():
                return True

    def _start_renewal(self) -> None:
        self._stop = threading.Event()
        self._renewer = threading.Thread(
            target=self._renew_until_stopped,
            args=(self._stop,),
            name=f"mlpjit-remote-lock-{short_key(self.key)}",
            daemon=True,  # a process that exits while holding: the lock just expires
        )
        self._renewer.start()

    def _renew_until_stopped(self, stop: threading.Event) -> None:
        interval = self.remote.lock_ttl_ms / 3000
        while not stop.wait(interval):
            reachable, ours = self.remote.renew_lock(self.name, self.token)
            if not reachable:
                return  # it lapses after lock_ttl; the compile goes on regardless
            if not ours:
                self.lost = True
                log.warning(
                    "mlpjit: lost the remote compile lock of %s (it expired or was deleted); "
                    "another node may compile it too",
                    short_key(self.key),
                )
                return

    def release(self) -> None:
        """Release the lock if held; a lock that is not ours (any more) is left alone."""
        if not self._held:
            return
        self._held = False
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=self.remote.timeout + 1)
            self._renewer = None
        if self.shared:
            self.remote.release_lock(self.name, self.token)

    def __enter__(self) -> RemoteLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
