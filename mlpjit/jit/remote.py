"""A fleet-wide compile cache on Redis, behind the local store (issue 16, phase 1).

Layout under a key prefix (default "mlpjit:"):

    <prefix>entry:<key>   a hash {manifest: canonical JSON, cubin: bytes}, optional TTL
    <prefix>lock:<key>    the cluster-wide compile lock of <key>: a random token, PX expiry

Remote bytes are never trusted: every fetched entry goes through store.verify_manifest, the
check of every local load (components that hash to the key, cubin size and sha256,
launch_sha256 over every launch field), under the store's size caps. A rejected entry is
counted, deleted from Redis if it still holds the very bytes that were rejected, and never
published. Anyone who can write the Redis keys can get entries rejected (and recompiled),
not make a node run other code, as long as that check holds; authenticity of what a node
compiled itself is the operator's.

Single flight across nodes: the local per-key file lock orders one node's workers; its
holder then takes the remote lock (SET NX PX with a random token, renewed by a daemon thread
while held, deleted only by its owner), re-checks Redis, compiles and uploads before it
releases. Waiters poll the entry and the lock with short jittered sleeps, bounded by a
timeout after which they compile for themselves.

Redis down, slow or refusing (unreachable, auth, TLS, wrong db) never reaches the caller:
every call has a socket timeout, the first failure logs one WARNING naming the URL (without
its password) and the error, and the remote is then skipped for ``retry_after`` seconds
(calls return None or do nothing at once), as if the layer were not configured.

redis-py is an optional dependency (``pip install 'mlpjit[redis]'``), imported only when a
RemoteCache is built. Redis Cluster (MOVED replies) is not supported.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import random
import re
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from mlpjit.errors import CorruptEntryError
from mlpjit.jit.archive import ImportReport, _portable_manifest, _publish
from mlpjit.jit.binary import KernelBinary, binary_from_fields
from mlpjit.jit.config import DEFAULT_LOCK_TIMEOUT
from mlpjit.jit.key import short_key
from mlpjit.jit.locks import KeyLock
from mlpjit.jit.store import (
    MAX_CUBIN_BYTES,
    MAX_MANIFEST_BYTES,
    CacheStore,
    Entry,
    check_key,
    verify_manifest,
)

__all__ = [
    "DEFAULT_LOCK_TTL",
    "DEFAULT_PREFIX",
    "DEFAULT_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "DEFAULT_WAIT",
    "Flight",
    "RemoteCache",
    "RemoteLayer",
    "RemoteLock",
    "RemoteStats",
    "get_with_remote",
    "pull",
    "push",
    "redact_url",
    "remote_from_env",
    "remote_report",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PREFIX = "mlpjit:"
DEFAULT_TIMEOUT = 2.0  # seconds, for connecting and for every reply
DEFAULT_LOCK_TTL = 30.0  # seconds a dead holder's lock outlives it; renewed every third
DEFAULT_RETRY_AFTER = 30.0  # seconds the remote is skipped after a failure
DEFAULT_WAIT = DEFAULT_LOCK_TIMEOUT  # seconds a waiter waits for another node
REPORT_SCAN_CAP = 100_000  # entries remote_report counts at most

_SCHEMES = ("redis", "rediss")
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_POLL_FIRST, _POLL_MAX = 0.02, 0.25  # seconds between a waiter's polls (before jitter)

# Reads both fields atomically, refusing a wrong type, a missing field or one over its cap
# on the server, so an oversized value never crosses the network.
_FETCH_LUA = """
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'none' then return false end
if t ~= 'hash' then return {'bad', 'the key holds a ' .. t .. ', not a hash'} end
local m = redis.call('HSTRLEN', KEYS[1], 'manifest')
local c = redis.call('HSTRLEN', KEYS[1], 'cubin')
if m == 0 or c == 0 then return {'bad', 'the manifest or cubin field is missing'} end
if m > tonumber(ARGV[1]) or c > tonumber(ARGV[2]) then
  return {'bad', 'manifest ' .. m .. ' or cubin ' .. c .. ' bytes is over the size cap'}
end
local v = redis.call('HMGET', KEYS[1], 'manifest', 'cubin')
return {'ok', v[1], v[2]}
"""
# Deletes an entry only if it still holds the bytes (sha1 of each field) that were rejected.
_DISCARD_LUA = """
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local v = redis.call('HMGET', KEYS[1], 'manifest', 'cubin')
if v[1] and v[2] and redis.sha1hex(v[1]) == ARGV[1] and redis.sha1hex(v[2]) == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def redact_url(url: str) -> str:
    """``url`` with its password (in the userinfo or a query option) replaced by ***."""
    try:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        query = [(k, "***" if "pass" in k.lower() else v) for k, v in query]
        return urllib.parse.urlunsplit(
            (parts.scheme, netloc, parts.path, urllib.parse.urlencode(query), "")
        )
    except ValueError:
        return "<unparsable URL>"


def _check_url(url: str) -> None:
    """ValueError unless ``url`` is redis:// or rediss:// with a numeric database, if any.

    redis-py silently uses database 0 for a path like "/cache"; a typo must not make
    two fleets share a database.
    """
    if not isinstance(url, str):
        raise ValueError(f"remote cache URL must be a str, got {type(url).__name__}")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError as err:
        raise ValueError(f"remote cache URL {redact_url(url)!r} is malformed ({err})") from None
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise ValueError(
            f"remote cache URL must be redis://[user:pass@]host:port/db or rediss://..., "
            f"got {redact_url(url)!r}"
        )
    if not re.fullmatch(r"/?|/[0-9]+/?", parts.path):
        raise ValueError(
            f"remote cache URL {redact_url(url)!r}: the database must be a number, e.g. "
            f"redis://host:6379/0"
        )


def _milliseconds(seconds: float, what: str) -> int:
    """``seconds`` as a positive whole number of milliseconds; ValueError naming ``what``."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"{what} must be a number of seconds, got {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0.001:
        raise ValueError(f"{what} must be a positive number of seconds, got {seconds!r}")
    return int(seconds * 1000)


def _poll_delay(attempt: int) -> float:
    """Seconds before a waiter's next poll: growing to _POLL_MAX, jittered so that many
    waiters on one key do not poll Redis in lockstep."""
    return min(_POLL_FIRST * 1.5**attempt, _POLL_MAX) * random.uniform(0.5, 1.0)


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()


@dataclass
class RemoteStats:
    """Counters of one RemoteCache (snapshot via RemoteCache.stats).

    hits: verified entries served; misses: keys Redis did not have; uploads: entries
    written; rejected: entries refused (caps, type or verification); errors: failed Redis
    calls; lock_waits: lock acquisitions that had to wait for another holder.
    """

    hits: int = 0
    misses: int = 0
    uploads: int = 0
    rejected: int = 0
    errors: int = 0
    lock_waits: int = 0


class RemoteCache:
    """Entries and locks in one Redis database; every method fails open (see the module doc)."""

    def __init__(
        self,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        ttl: float | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        lock_ttl: float = DEFAULT_LOCK_TTL,
        retry_after: float = DEFAULT_RETRY_AFTER,
    ) -> None:
        """``url``: redis://[user:pass@]host:port/db or rediss:// (TLS; CA and client
        certificates as redis-py query options, e.g. ?ssl_ca_certs=/path/ca.pem). ``ttl``:
        seconds an uploaded entry lives (None: no expiry). ``timeout``: seconds for a
        connect and for each reply. ValueError for a malformed URL or setting; ImportError
        (naming the extra) without redis-py. Nothing is connected here."""
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as err:
            raise ImportError(
                "the remote compile cache needs redis-py: pip install 'mlpjit[redis]'"
            ) from err

        _check_url(url)
        if not isinstance(prefix, str):
            raise ValueError(f"remote cache prefix must be a str, got {prefix!r}")
        self.url = redact_url(url)
        self.prefix = prefix
        self.ttl_ms = None if ttl is None else _milliseconds(ttl, "remote cache TTL")
        self.timeout = _milliseconds(timeout, "remote cache timeout") / 1000
        self.lock_ttl_ms = _milliseconds(lock_ttl, "remote lock TTL")
        self.retry_after = _milliseconds(retry_after, "remote retry_after") / 1000
        # No client-side retries: one failure is one timeout at most, then the layer is off.
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._auth_errors = (redis.AuthenticationError, redis.AuthenticationWrongNumberOfArgsError)
        self._fetch_script = self._client.register_script(_FETCH_LUA)
        self._discard_script = self._client.register_script(_DISCARD_LUA)
        self._renew_script = self._client.register_script(_RENEW_LUA)
        self._release_script = self._client.register_script(_RELEASE_LUA)
        self._mutex = threading.Lock()
        self._stats = RemoteStats()
        self._down_until = 0.0
        self._failed_before = False  # a warning was logged: later failures log at DEBUG
        self._down = False  # failed since the last successful call
        self._rejected_seen: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        return f"RemoteCache({self.url!r}, prefix={self.prefix!r})"

    # ----------------------------------------------------------------- names and state

    def entry_name(self, key: str) -> str:
        """The Redis key of ``key``'s entry hash."""
        return f"{self.prefix}entry:{check_key(key)}"

    def lock_name(self, key: str) -> str:
        """The Redis key of ``key``'s compile lock."""
        return f"{self.prefix}lock:{check_key(key)}"

    @property
    def stats(self) -> RemoteStats:
        """A snapshot of the counters."""
        with self._mutex:
            return RemoteStats(**asdict(self._stats))

    @property
    def available(self) -> bool:
        """False while the remote is skipped after a failure (for retry_after seconds)."""
        return time.monotonic() >= self._down_until

    def _count(self, **deltas: int) -> None:
        with self._mutex:
            for name, delta in deltas.items():
                setattr(self._stats, name, getattr(self._stats, name) + delta)

    def _run(self, what: str, call: Callable[[], T]) -> tuple[bool, T | None]:
        """(True, call()) or, if the remote is off or the call fails, (False, None)."""
        if not self.available:
            return False, None
        try:
            value = call()
        except self._errors as err:
            self._failed(what, err)
            return False, None
        if self._down:
            self._down = False
            log.info("mlpjit: remote compile cache %s is reachable again", self.url)
        return True, value

    def _failed(self, what: str, err: BaseException) -> None:
        """Turn the remote off for retry_after seconds; one WARNING per process."""
        with self._mutex:
            self._stats.errors += 1
            self._down_until = time.monotonic() + self.retry_after
            self._down = True
            first = not self._failed_before
            self._failed_before = True
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "mlpjit: remote compile cache %s failed (%s: %s: %s)%s; continuing with the local "
            "cache only, next try in %.0f s",
            self.url,
            what,
            type(err).__name__,
            " ".join(str(err).split()),
            self._hint(err),
            self.retry_after,
        )

    def _hint(self, err: BaseException) -> str:
        """What to check for the failures whose message does not say it."""
        if isinstance(err, self._auth_errors):
            return "; check the user and password in MLPJIT_REMOTE_CACHE"
        if "CERTIFICATE_VERIFY_FAILED" in str(err):
            return "; for a private CA add ?ssl_ca_certs=/path/to/ca.pem to the URL"
        return ""

    def _reject(self, key: str, reason: str) -> None:
        """Count a refused entry; one WARNING per key and reason."""
        with self._mutex:
            self._stats.rejected += 1
            first = (key, reason) not in self._rejected_seen
            self._rejected_seen.add((key, reason))
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "mlpjit: rejected remote cache entry %s from %s: %s; it is not used",
            short_key(key),
            self.url,
            reason,
        )

    # ----------------------------------------------------------------- entries

    def _fetch_reply(self, key: str) -> tuple[bytes, bytes] | str | None:
        """The entry's (manifest, cubin), the reason it is refused, or None (absent/off)."""
        name = self.entry_name(key)
        caps = [MAX_MANIFEST_BYTES, MAX_CUBIN_BYTES]
        ok, reply = self._run("fetch", lambda: self._fetch_script(keys=[name], args=caps))
        if not ok or reply is None:
            if ok:
                self._count(misses=1)
            return None
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == b"bad":
            return bytes(reply[1]).decode("utf-8", "replace")
        if (
            isinstance(reply, list)
            and len(reply) == 3
            and reply[0] == b"ok"
            and all(isinstance(v, bytes) for v in reply[1:])
        ):
            manifest, cubin = reply[1], reply[2]
            if len(manifest) <= MAX_MANIFEST_BYTES and len(cubin) <= MAX_CUBIN_BYTES:
                return manifest, cubin
            return "over the size cap"
        return "malformed reply"

    def fetch(self, key: str) -> tuple[bytes, bytes] | None:
        """The raw (manifest bytes, cubin) stored for ``key``, unverified; None if absent,
        refused by the size caps, or the remote is unavailable. Use fetch_verified."""
        reply = self._fetch_reply(key)
        if isinstance(reply, str):
            self._reject(key, reply)
            return None
        return reply

    def _verified(self, key: str) -> tuple[dict[str, Any], bytes] | str | None:
        """(manifest, cubin) if the remote entry passes the store's check, the reason it
        was rejected (counted, and the entry discarded), or None (absent, or remote off)."""
        reply = self._fetch_reply(key)
        if isinstance(reply, str):
            self._reject(key, reply)
            return reply
        if reply is None:
            return None
        raw, cubin = reply
        try:
            manifest = verify_manifest(key, raw, cubin)
        except CorruptEntryError as err:
            self._reject(key, str(err))
            self.discard(key, raw, cubin)
            return str(err)
        self._count(hits=1)
        return manifest, cubin

    def fetch_verified(self, key: str) -> tuple[dict[str, Any], bytes] | None:
        """(manifest, cubin) of ``key``'s remote entry if it verifies exactly like a local
        load (store.verify_manifest); None otherwise. A rejected entry is counted in
        stats.rejected and deleted from Redis if it still holds the same bytes."""
        result = self._verified(key)
        return result if isinstance(result, tuple) else None

    def exists(self, key: str) -> bool:
        """Whether Redis holds an entry for ``key`` (False if the remote is unavailable)."""
        name = self.entry_name(key)
        ok, count = self._run("exists", lambda: self._client.exists(name))
        return bool(ok and count)

    def upload(self, key: str, manifest: bytes, cubin: bytes) -> bool:
        """Store ``key``'s entry (replacing any), with the TTL; True if Redis took it.

        The entry is verified first, so a bad local entry is never spread to the fleet.
        """
        try:
            verify_manifest(key, manifest, cubin)
        except CorruptEntryError as err:
            log.warning("mlpjit: not uploading cache entry %s: %s", short_key(key), err)
            return False
        name = self.entry_name(key)

        def write() -> None:
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(name)  # a hostile value of another type would make HSET fail
            pipe.hset(name, mapping={"manifest": manifest, "cubin": cubin})
            if self.ttl_ms is not None:
                pipe.pexpire(name, self.ttl_ms)
            pipe.execute()

        ok, _ = self._run("upload", write)
        if ok:
            self._count(uploads=1)
        return ok

    def discard(self, key: str, manifest: bytes, cubin: bytes) -> bool:
        """Delete ``key``'s entry if it still holds exactly these bytes; True if deleted.

        A good entry uploaded since the bad one was read is left alone.
        """
        name = self.entry_name(key)
        digests = [_sha1(manifest), _sha1(cubin)]
        ok, deleted = self._run("discard", lambda: self._discard_script(keys=[name], args=digests))
        return bool(ok and deleted)

    def entry_keys(self, limit: int | None = None) -> list[str] | None:
        """The keys of the entries under the prefix (sorted, at most ``limit``); None if
        the remote is unavailable."""
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix) + "entry:*"
        start = len(self.prefix) + len("entry:")

        def scan() -> list[str]:
            found: set[str] = set()
            for name in self._client.scan_iter(match=pattern, count=1000):
                key = bytes(name)[start:].decode("ascii", "replace")
                if _KEY_RE.match(key):
                    found.add(key)
                    if limit is not None and len(found) >= limit:
                        break
            return sorted(found)

        ok, keys = self._run("scan", scan)
        return keys if ok else None

    # ----------------------------------------------------------------- locks

    def lock(self, key: str) -> RemoteLock:
        """A new (unheld) cluster-wide compile lock on ``key``."""
        return RemoteLock(self, key)

    def _set_lock(self, name: str, token: str) -> tuple[bool, bool]:
        """(reachable, taken) for SET name token NX PX lock_ttl."""
        ok, taken = self._run(
            "lock", lambda: self._client.set(name, token, nx=True, px=self.lock_ttl_ms)
        )
        return ok, bool(taken)

    def _renew_lock(self, name: str, token: str) -> tuple[bool, bool]:
        """(reachable, still ours) after extending the lock's expiry if it is ours."""
        ok, renewed = self._run(
            "renew lock",
            lambda: self._renew_script(keys=[name], args=[token, self.lock_ttl_ms]),
        )
        return ok, bool(renewed)

    def _release_lock(self, name: str, token: str) -> None:
        """Delete the lock if it still holds our token (never another owner's)."""
        self._run("release lock", lambda: self._release_script(keys=[name], args=[token]))

    def close(self) -> None:
        """Close the connections (the cache can still be used: they reopen on demand)."""
        with contextlib.suppress(*self._errors):
            self._client.close()


class RemoteLock:
    """A cluster-wide exclusive lock on one key; one instance per acquiring thread.

    Like locks.KeyLock: if Redis is unavailable the lock "succeeds" without excluding
    anyone (``shared`` is then False), since there is no fleet cache to protect. While held,
    a daemon thread extends the expiry every lock_ttl/3; if the lock was lost meanwhile
    (expired while Redis was unreachable, or deleted by someone), ``lost`` becomes True.
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
        reachable, taken = self.remote._set_lock(self.name, self.token)
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
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        deadline = time.monotonic() + timeout
        if self.try_acquire():
            return True
        self.remote._count(lock_waits=1)
        attempt = 0
        while True:
            if stop is not None and stop():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(_poll_delay(attempt), remaining))
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
            reachable, ours = self.remote._renew_lock(self.name, self.token)
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
            self.remote._release_lock(self.name, self.token)

    def __enter__(self) -> RemoteLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class Flight:
    """What RemoteLayer.single_flight found; exactly one of three cases.

    entry set: another node's entry, verified and published locally: use it.
    busy: the wait was 0 and another node holds the key's lock: come back later.
    neither: compile, publish, and call after_compile before leaving the with block (this
    process holds the remote lock, Redis is unavailable, or the wait timed out).
    """

    entry: Entry | None = None
    busy: bool = False


class RemoteLayer:
    """A RemoteCache composed with a local CacheStore: what the compile manager calls."""

    def __init__(self, store: CacheStore, remote: RemoteCache) -> None:
        self.store = store
        self.remote = remote

    def lookup(self, key: str) -> Entry | None:
        """The remote entry for ``key``, verified and published into the local root.

        The caller holds the local key lock (as CompileManager._miss does). A local write
        failure still returns the entry (persisted=False), like a compile's.
        """
        fetched = self.remote.fetch_verified(key)
        if fetched is None:
            return None
        manifest, cubin = fetched
        binary = binary_from_fields(manifest, cubin)
        seconds = _compile_seconds(manifest)
        return self.store.publish(key, manifest["components"], binary, seconds)

    def after_compile(self, entry: Entry) -> bool:
        """Upload a freshly compiled entry; True if Redis took it."""
        return self.remote.upload(entry.key, _portable_manifest(entry), entry.cubin)

    @contextlib.contextmanager
    def single_flight(self, key: str, wait: float = DEFAULT_WAIT) -> Iterator[Flight]:
        """Fetch ``key``, else take its cluster-wide lock for one compile (see Flight).

        ``wait``: seconds to wait for another node's compile (polling the entry and the
        lock); 0: do not wait (Flight.busy if another node holds the lock). The lock is
        released on leaving the block, so the upload must happen inside it.
        """
        entry = self.lookup(key)
        if entry is not None:
            yield Flight(entry=entry)
            return
        lock = self.remote.lock(key)
        try:
            yield self._contend(lock, key, wait)
        finally:
            lock.release()

    def _contend(self, lock: RemoteLock, key: str, wait: float) -> Flight:
        """Take ``lock`` (or wait for the entry); the Flight single_flight yields."""
        if lock.try_acquire():
            # Another node may have uploaded between our fetch and taking the lock.
            return Flight(entry=self.lookup(key))
        if wait <= 0:
            return Flight(busy=True)
        deadline = time.monotonic() + wait
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            got = remaining > 0 and lock.acquire(remaining, stop=lambda: self.remote.exists(key))
            entry = self.lookup(key)
            if entry is not None or got:
                return Flight(entry=entry)
            if time.monotonic() >= deadline:
                log.warning(
                    "mlpjit: waited %.1f s for another node compiling %s; compiling it here",
                    wait,
                    short_key(key),
                )
                return Flight()
            # The entry that ended the wait was rejected: pause, then wait for the lock again.
            time.sleep(min(_poll_delay(attempt), max(deadline - time.monotonic(), 0)))
            attempt += 1


def _compile_seconds(manifest: Mapping[str, Any]) -> float:
    """The manifest's compile_seconds if it is a finite number >= 0, else 0.0.

    The field is not covered by any checksum: 1e999 (parsed as inf) or a 400-digit int
    would make publish raise (JSON has no inf; float() overflows), so neither gets there.
    """
    value = manifest.get("compile_seconds")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    try:
        seconds = float(value)
    except OverflowError:
        return 0.0
    return seconds if math.isfinite(seconds) and seconds >= 0 else 0.0


def get_with_remote(
    store: CacheStore,
    layer: RemoteLayer | None,
    key: str,
    components: Mapping[str, Any],
    compile_fn: Callable[[], tuple[KernelBinary, float]],
    *,
    blocking: bool = True,
    timeout: float = DEFAULT_WAIT,
) -> Entry | None:
    """``key``'s entry: a local hit, a remote hit, or one compile across the fleet.

    The order CompileManager._miss follows once wired: local lookup, local key lock (orders
    this node's workers), local re-check, then the remote single flight (fetch, cluster
    lock, re-check), compile_fn() -> (binary, seconds), publish, upload. ``layer=None``: the
    local cache alone. None only when not ``blocking`` and another worker, here or on
    another node, is compiling the key. A waiter past ``timeout`` compiles for itself.
    """
    entry = store.lookup(key)
    if entry is not None:
        return entry
    lock = KeyLock(store.lock_path(key))
    if not lock.try_acquire():
        if not blocking:
            return None
        lock.acquire(timeout)
    try:
        entry = store.lookup(key)
        if entry is not None:
            return entry
        if layer is None:
            return store.publish(key, components, *compile_fn())
        with layer.single_flight(key, timeout if blocking else 0.0) as flight:
            if flight.busy:
                return None
            if flight.entry is not None:
                return flight.entry
            entry = store.publish(key, components, *compile_fn())
            layer.after_compile(entry)
            return entry
    finally:
        lock.release()


# --------------------------------------------------------------------- CLI helpers


def push(
    store: CacheStore, remote: RemoteCache, keys: Iterable[str] | None = None
) -> dict[str, Any]:
    """Upload verified local entries (root and layers; all, or ``keys``) for `cache push`.

    A key whose remote entry already verifies is left as it is ("present"); a bad remote
    entry is rejected and replaced. Returns plain lists of keys: pushed, present, failed
    (Redis did not take it), missing (not in the local cache, or failed verification).
    """
    wanted = sorted({k for k, _ in store.iter_manifests()} if keys is None else set(keys))
    report: dict[str, Any] = {
        "remote": remote.url,
        "pushed": [],
        "present": [],
        "failed": [],
        "missing": [],
    }
    for key in wanted:
        entry = store.lookup(check_key(key))
        if entry is None:
            report["missing"].append(key)
        elif remote.fetch_verified(key) is not None:
            report["present"].append(key)
        elif remote.upload(key, _portable_manifest(entry), entry.cubin):
            report["pushed"].append(key)
        else:
            report["failed"].append(key)
    report["available"] = remote.available
    return report


def pull(
    store: CacheStore, remote: RemoteCache, keys: Iterable[str] | None = None
) -> dict[str, Any]:
    """Verify remote entries (all under the prefix, or ``keys``) and publish them locally.

    Publishing is archive import's path (archive._publish: under the key lock, skipping a
    key being compiled or already in the root). Returns plain lists: pulled, skipped and
    rejected ({"key", "reason"} each), missing (not in Redis); "error" if Redis could not
    be listed.
    """
    names = remote.entry_keys() if keys is None else sorted({check_key(k) for k in keys})
    report = ImportReport(remote.url)
    missing: list[str] = []
    for key in names or []:
        result = remote._verified(key)
        if result is None:
            missing.append(key)
        elif isinstance(result, str):
            report.rejected.append({"key": key, "reason": result})
        else:
            manifest, cubin = result
            binary = binary_from_fields(manifest, cubin)
            # archive._publish reads compile_seconds as it is: hand it a safe one.
            manifest = {**manifest, "compile_seconds": _compile_seconds(manifest)}
            _publish(store, key, manifest, binary, report)
    out: dict[str, Any] = {
        "remote": remote.url,
        "pulled": report.imported,
        "skipped": report.skipped,
        "rejected": report.rejected,
        "missing": missing,
        "available": remote.available,
    }
    if names is None:
        out["error"] = "the remote cache is unavailable"
    return out


def remote_report(remote: RemoteCache) -> dict[str, Any]:
    """For `mlpjit doctor`: reachable, auth_ok, server_version, entries (counted up to
    REPORT_SCAN_CAP), error. A fresh probe, whatever earlier calls found."""
    out: dict[str, Any] = {
        "url": remote.url,
        "prefix": remote.prefix,
        "ttl_seconds": None if remote.ttl_ms is None else remote.ttl_ms / 1000,
        "reachable": False,
        "auth_ok": None,
        "server_version": None,
        "entries": None,
        "entries_capped": False,
        "error": None,
        "stats": asdict(remote.stats),
    }
    client = remote._client
    try:
        out["server_version"] = str(client.info("server").get("redis_version"))
        out["reachable"] = out["auth_ok"] = True
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", remote.prefix) + "entry:*"
        count = 0
        for _ in client.scan_iter(match=pattern, count=1000):
            count += 1
            if count >= REPORT_SCAN_CAP:
                out["entries_capped"] = True
                break
        out["entries"] = count
    except remote._auth_errors as err:
        out["reachable"], out["auth_ok"] = True, False
        out["error"] = f"{type(err).__name__}: {' '.join(str(err).split())}"
    except remote._errors as err:
        out["error"] = f"{type(err).__name__}: {' '.join(str(err).split())}"
    return out


# --------------------------------------------------------------------- settings


def _env_value(environ: Mapping[str, str], name: str) -> str | None:
    """The variable's value, or None when unset or blank (as config._get)."""
    value = environ.get(name)
    return None if value is None or not value.strip() else value.strip()


def _env_seconds(environ: Mapping[str, str], name: str, default: float | None) -> float | None:
    """A positive number of seconds from ``name``; ValueError naming it otherwise."""
    value = _env_value(environ, name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0.001:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return seconds


_MISSING_REDIS_WARNED = False


def remote_from_env(environ: Mapping[str, str] | None = None) -> RemoteCache | None:
    """The RemoteCache MLPJIT_REMOTE_CACHE configures, or None when it is unset.

    Also reads MLPJIT_REMOTE_PREFIX, MLPJIT_REMOTE_TTL and MLPJIT_REMOTE_TIMEOUT. A
    malformed value raises ValueError naming its variable (like config.py); redis-py not
    installed gives one WARNING and None (the process runs with the local cache only).
    """
    global _MISSING_REDIS_WARNED
    env = os.environ if environ is None else environ
    url = _env_value(env, "MLPJIT_REMOTE_CACHE")
    if url is None:
        return None
    prefix = _env_value(env, "MLPJIT_REMOTE_PREFIX") or DEFAULT_PREFIX
    ttl = _env_seconds(env, "MLPJIT_REMOTE_TTL", None)
    timeout = _env_seconds(env, "MLPJIT_REMOTE_TIMEOUT", DEFAULT_TIMEOUT)
    assert timeout is not None
    try:
        return RemoteCache(url, prefix=prefix, ttl=ttl, timeout=timeout)
    except ImportError:
        if not _MISSING_REDIS_WARNED:
            _MISSING_REDIS_WARNED = True
            log.warning(
                "mlpjit: MLPJIT_REMOTE_CACHE is set but redis-py is not installed "
                "(pip install 'mlpjit[redis]'); using the local cache only"
            )
        return None
    except ValueError as err:
        raise ValueError(f"MLPJIT_REMOTE_CACHE: {err}") from None
