"""Cache tiers behind one interface: the writable root, each read-only directory, Redis.

A tier holds verified entries by key. ``CacheTier`` is what the compile manager walks, in
the manner of Triton's CacheManager / RemoteCacheBackend: ``get`` and ``get_alias``
answer with a ``Lookup`` (an entry, nothing, or the reason a bad one was refused) and
``lock`` hands out the key's compile lock in that tier (a locks.TierLock). A tier shared
by a fleet (``SharedTier``: the Redis tier, remote/tier.py) also takes ``put`` (a fresh
compile is offered to it after it is published locally) and runs one compile per key
across machines (``single_flight``, which answers with a ``Flight``).

The implementations: directory_tier.py (DirectoryTier, the reading both local tiers share,
and ReadOnlyTier, each MLPJIT_CACHE_PATH directory), writable_tier.py (WritableTier,
MLPJIT_CACHE_DIR) and remote/tier.py (RemoteTier, MLPJIT_REMOTE_CACHE).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mlpjit.jit.entry import Entry

if TYPE_CHECKING:
    from mlpjit.jit.locks import TierLock

__all__ = ["MISS", "CacheTier", "Flight", "Lookup", "SharedTier"]


@dataclass(frozen=True)
class Lookup:
    """What one tier holds for a key: a verified ``entry``, or nothing (``rejected`` says
    why when the tier held a bad one, which was quarantined, skipped or discarded)."""

    entry: Entry | None = None
    rejected: str | None = None


MISS = Lookup()


class CacheTier(Protocol):
    """One tier of the cache: verified lookups by key and by toolchain-less spec key, and
    the key's compile lock in this tier."""

    def get(self, key: str, *, use: bool = False) -> Lookup:
        """The verified entry for ``key`` (``use``: the load is for a launch)."""
        ...

    def get_alias(self, spec_key: str, *, use: bool = False) -> Lookup:
        """The verified entry this tier's alias of ``spec_key`` names (compiler-less hits)."""
        ...

    def lock(self, key: str) -> TierLock:
        """A new, unheld compile lock of ``key`` in this tier."""
        ...


@dataclass(frozen=True)
class Flight:
    """What SharedTier.single_flight found; exactly one of three cases.

    entry set: another machine's entry, verified and published locally: use it.
    busy: the wait was 0 and another machine holds the key's lock: come back later.
    neither: compile, publish, and put the entry before leaving the with block (this
    process holds the tier's lock, the tier is unavailable, or the wait timed out or was
    skipped).
    """

    entry: Entry | None = None
    busy: bool = False


class SharedTier(CacheTier, Protocol):
    """A tier other machines read too: fresh compiles are offered to it, and one compile
    per key runs across all of them."""

    def put(self, entry: Entry) -> bool:
        """Store a verified local ``entry`` in this tier; True if it took it."""
        ...

    def single_flight(self, key: str, wait: float) -> contextlib.AbstractContextManager[Flight]:
        """Fetch ``key``, else hold its lock in this tier for one compile, waiting at most
        ``wait`` seconds (0: do not wait) for another machine's (see Flight)."""
        ...

    @property
    def stats(self) -> Any:
        """Counters with hits, rejected and uploads (for CacheStats)."""
        ...
