"""RemoteTier: the Redis tier, a RemoteCache composed with the local CacheStore.

It is a tiers.SharedTier: ``get`` / ``get_alias`` fetch an entry, verify it and publish it
into the local writable root (so one code path verifies and publishes, as in Triton's
RemoteCacheManager); ``put`` uploads a fresh compile; ``lock`` is the key's cluster-wide
compile lock. On a local miss (the caller holds the local key lock, which orders one
node's workers) the compile manager asks this tier; ``single_flight``
takes the key's cluster-wide lock, so that one process in the fleet compiles the key while
the others wait for its upload (polling the entry and the lock, bounded by a timeout after
which they compile for themselves). The compile itself stays with the caller.

A tier over a cache without a fleet secret works, integrity-checked only; the first such
tier of a process logs one WARNING saying what that allows (docs/SERVER.md, Security model).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from mlpjit.jit.archive import portable_manifest
from mlpjit.jit.binary import binary_from_fields
from mlpjit.jit.config import DEFAULT_LOCK_TIMEOUT
from mlpjit.jit.entry import Entry
from mlpjit.jit.key import short_key
from mlpjit.jit.remote.client import Fetched, RemoteCache, RemoteStats
from mlpjit.jit.remote.lock import RemoteLock, poll_delay
from mlpjit.jit.store import CacheStore
from mlpjit.jit.tiers import MISS, Flight, Lookup

__all__ = ["DEFAULT_WAIT", "RemoteTier", "WaitBudget"]

log = logging.getLogger("mlpjit.jit.remote")

DEFAULT_WAIT = DEFAULT_LOCK_TIMEOUT  # seconds a waiter waits for another node


class WaitBudget:
    """The seconds this process has spent waiting for other nodes' compiles, all kernels
    together, so that the waits of a whole warm add up to one per-kernel wait at most.

    A holder that never uploads (a node stuck in a compile, or a lock planted by anyone who
    can write Redis, renewed by hand) would otherwise cost every kernel the full wait in
    turn: hours for a warm of 32 kernels at the default MLPJIT_LOCK_TIMEOUT. Once spent,
    the process compiles the rest itself, which costs no more than waiting would.
    """

    def __init__(self) -> None:
        self._spent = 0.0
        self._warned = False
        self._mutex = threading.Lock()

    def take(self, wait: float) -> float:
        """Reserve up to ``wait`` seconds (what is left of a budget of ``wait``: a process
        whose waits add up to ``wait`` waits no more); the seconds granted, 0 when spent."""
        with self._mutex:
            granted = max(min(wait, wait - self._spent), 0.0)
            self._spent += granted
            warn = granted <= 0 < wait and not self._warned
            self._warned = self._warned or warn
        if warn:
            log.warning(
                "mlpjit: this process has waited %.1f s in all for other nodes' compiles "
                "(MLPJIT_LOCK_TIMEOUT); compiling the rest here without waiting",
                wait,
            )
        return granted

    def give_back(self, seconds: float) -> None:
        """Return the unused part of a reservation."""
        with self._mutex:
            self._spent = max(self._spent - max(seconds, 0.0), 0.0)


_WAIT_BUDGET = WaitBudget()  # one per process: see WaitBudget
_UNSIGNED_WARNED = False  # this process was told that its fleet cache is not authenticated
_UNSIGNED_MUTEX = threading.Lock()


def _warn_unsigned(remote: RemoteCache) -> None:
    """Log once per process that ``remote`` is not authenticated, and what that allows: an
    operator who never read the docs still learns that the Redis is trusted with code."""
    global _UNSIGNED_WARNED
    with _UNSIGNED_MUTEX:
        if _UNSIGNED_WARNED or remote.signed:
            return
        _UNSIGNED_WARNED = True
    log.warning(
        "mlpjit: remote compile cache %s is not authenticated (MLPJIT_REMOTE_KEY_FILE is "
        "unset): its entries are checked for integrity only, so anyone who can write the "
        "keys %s* can make this node run their code; set MLPJIT_REMOTE_KEY_FILE on every node "
        "(docs/SERVER.md, Security model)",
        remote.url,
        remote.prefix,
    )


class RemoteTier:
    """The Redis tier: a RemoteCache composed with the local CacheStore it publishes into."""

    def __init__(self, store: CacheStore, remote: RemoteCache) -> None:
        """Compose ``remote`` with ``store``; warns once per process if ``remote`` is not
        signed (no fleet secret)."""
        self.store = store
        self.remote = remote
        _warn_unsigned(remote)

    def __repr__(self) -> str:
        return f"RemoteTier({self.store.root}, {self.remote!r})"

    def _published(self, key: str, fetched: Fetched) -> Lookup:
        """A checked remote entry published into the local root (persisted=False if the
        disk refused it, like a compile's), or why it was rejected."""
        if fetched.found is None:
            return MISS if fetched.rejected is None else Lookup(rejected=fetched.rejected)
        manifest, cubin = fetched.found.manifest, fetched.found.cubin
        binary = binary_from_fields(manifest, cubin)
        entry = self.store.publish(key, manifest["components"], binary, manifest["compile_seconds"])
        return Lookup(entry)

    def get(self, key: str, *, use: bool = False) -> Lookup:
        """The remote entry for ``key``, verified and published into the local root, or
        why it was rejected. The caller holds the local key lock (the compile manager does);
        ``use`` changes nothing here (the local copy records uses)."""
        return self._published(key, self.remote.verified(key))

    def get_alias(self, spec_key: str, *, use: bool = False) -> Lookup:
        """The latest upload of a toolchain-less spec, for a node without the compiler.

        Such a node cannot compute a full key (it holds the toolchain's version), so it
        follows Redis' alias; the entry it names must verify and be a build of ``spec_key``.
        Publishing it also writes the local alias, so the next lookup is a local hit.
        """
        key = self.remote.alias_target(spec_key)
        if key is None:
            return MISS
        return self._published(key, self.remote.verified(key, spec_key=spec_key))

    def put(self, entry: Entry) -> bool:
        """Upload a freshly compiled local entry; True if Redis took it."""
        return self.remote.upload(entry.key, portable_manifest(entry), entry.cubin)

    def lock(self, key: str) -> RemoteLock:
        """A new (unheld) cluster-wide compile lock on ``key``."""
        return self.remote.lock(key)

    @property
    def stats(self) -> RemoteStats:
        """This process's counters of the Redis tier (hits, rejected, uploads, ...)."""
        return self.remote.stats

    @contextlib.contextmanager
    def single_flight(self, key: str, wait: float = DEFAULT_WAIT) -> Iterator[Flight]:
        """Fetch ``key``, else take its cluster-wide lock for one compile (see Flight).

        ``wait``: seconds to wait for another node's compile (polling the entry and the
        lock); 0: do not wait (Flight.busy if another node holds the lock). The waits of all
        calls in a process add up to ``wait`` at most (WaitBudget); after that a key whose
        lock another node holds is compiled here at once. The lock is released on leaving
        the block, so the upload must happen inside it.
        """
        found = self.get(key)
        if found.entry is not None:
            yield Flight(entry=found.entry)
            return
        lock = self.lock(key)
        try:
            yield self._contend(lock, key, wait, rejected=found.rejected is not None)
        finally:
            lock.release()

    def _contend(self, lock: RemoteLock, key: str, wait: float, rejected: bool) -> Flight:
        """Take ``lock`` (or wait for the entry); the Flight single_flight yields.

        ``rejected``: Redis holds a bad entry for ``key``. It stays there until the lock's
        holder uploads a good one, so it is neither fetched again right after taking the
        lock nor polled while waiting (each poll would be one more rejection): the wait is
        for the lock alone, then the entry is checked once.
        """
        if lock.try_acquire():
            # Another node may have uploaded between our fetch and taking the lock.
            return Flight(entry=None if rejected else self.get(key).entry)
        if wait <= 0:
            return Flight(busy=True)
        budget = _WAIT_BUDGET
        granted = budget.take(wait)
        if granted <= 0:
            return Flight()  # the process has waited enough: compile here
        t0 = time.monotonic()
        try:
            return self._wait(lock, key, granted, rejected)
        finally:
            budget.give_back(granted - (time.monotonic() - t0))

    def _wait(self, lock: RemoteLock, key: str, wait: float, rejected: bool) -> Flight:
        """Wait at most ``wait`` seconds for ``lock`` or for the entry (see _contend)."""
        deadline = time.monotonic() + wait
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            stop = None if rejected else (lambda: self.remote.exists(key))
            got = remaining > 0 and lock.acquire(remaining, stop=stop)
            found = self.get(key)
            if found.entry is not None:
                return Flight(entry=found.entry)
            if got:
                return Flight()
            if time.monotonic() >= deadline:
                log.warning(
                    "mlpjit: waited %.1f s for another node compiling %s; compiling it here",
                    wait,
                    short_key(key),
                )
                return Flight()
            # The entry that ended the wait was rejected (or gone again): wait for the lock.
            rejected = rejected or found.rejected is not None
            time.sleep(min(poll_delay(attempt), max(deadline - time.monotonic(), 0)))
            attempt += 1
