"""RemoteCache: one Redis database holding the fleet's entries, aliases, locks and counters.

Every call fails open. It has a socket timeout and no client-side retries, so a Redis that
is down, slow or refusing (auth, TLS, wrong db) costs one timeout at most. The first
failure logs one WARNING naming the URL (password redacted) and the error; the remote is
then skipped for ``retry_after`` seconds (calls return None or do nothing at once), as if
it were not configured. A verified entry is one that passed entry.verify_manifest, the
check every local load makes, and, with a fleet secret (MLPJIT_REMOTE_KEY_FILE), whose
signature verifies (sign.py). Bytes that fail are counted, deleted from Redis if the key
still holds those very bytes, and never handed out.

redis-py is imported only when a RemoteCache is built (the ``mlpjit[redis]`` extra).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from mlpjit.errors import CorruptEntryError
from mlpjit.jit import config
from mlpjit.jit.bounds import clamped, seconds
from mlpjit.jit.cache_layout import MAX_CUBIN_BYTES, MAX_MANIFEST_BYTES, check_key, is_key
from mlpjit.jit.entry import compile_seconds_of, verify_manifest
from mlpjit.jit.key import short_key
from mlpjit.jit.messages import error_line
from mlpjit.jit.remote import lua
from mlpjit.jit.remote.lock import RemoteLock
from mlpjit.jit.remote.sign import MAX_SIGNATURE_BYTES, FleetSigner

__all__ = [
    "COUNTERS",
    "DEFAULT_LOCK_TTL",
    "DEFAULT_PREFIX",
    "DEFAULT_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "Fetched",
    "RemoteCache",
    "RawEntry",
    "RemoteStats",
    "Verified",
    "remote_from_env",
]

log = logging.getLogger("mlpjit.jit.remote")

T = TypeVar("T")
RawEntry = tuple[bytes, bytes, bytes | None]  # (manifest, cubin, signature) as Redis holds them

DEFAULT_PREFIX = config.DEFAULT_REMOTE_PREFIX
DEFAULT_TIMEOUT = config.DEFAULT_REMOTE_TIMEOUT
DEFAULT_LOCK_TTL = 30.0  # seconds a dead holder's lock outlives it; renewed every third
# The longest lock TTL: a lock with a longer expiry (or none) is no holder's, and is taken
# over rather than waited for.
MAX_LOCK_TTL = 300.0
DEFAULT_RETRY_AFTER = 30.0  # seconds the remote is skipped after a failure
MAX_RETRY_AFTER = 3600.0
# Fleet-wide counters, each the Redis key <prefix>stats:<name>, INCRed as things happen.
COUNTERS = ("hits", "rejected", "uploads")
# A remote cubin is read only up to this size: real kernels' cubins are tens of KiB, and
# anyone who can write Redis could otherwise make every node read the store's whole cap.
MAX_REMOTE_CUBIN_BYTES = min(MAX_CUBIN_BYTES, 32 << 20)
# Keys SCAN visits per page (a hint to the server): a page's reply holds at most about as
# many entry names, each of a fixed length.
SCAN_PAGE = 1000
MAX_COUNT = 2**63 - 1  # what INCR counts up to
MAX_COUNTER_BYTES = 20  # the digits of MAX_COUNT, and a sign
# An alias' value: a key (64 hex digits), then ":" and a signature of at most
# MAX_SIGNATURE_BYTES; a longer value is refused on the server, unread.
MAX_REMOTE_ALIAS_BYTES = 64 + 1 + MAX_SIGNATURE_BYTES

_TAKEOVER_WARNED = False  # this process logged a lock taken over (RemoteCache.set_lock)
_TAKEOVER_MUTEX = threading.Lock()

# An alias' value: the key it names, then ":" and its signature when a fleet secret signed it.
_ALIAS_RE = re.compile(rb"([0-9a-f]{64})(?::([0-9a-f]{1,128}))?")  # fullmatch


def _milliseconds(value: float, what: str, bounds: tuple[float, float]) -> int:
    """``value`` seconds (within ``bounds``: bounds.seconds) as whole milliseconds."""
    return int(seconds(value, what, bounds) * 1000)


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN MATCH pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _counter_value(raw: object) -> int:
    """A counter's stored value as an int: 0 when absent, not decimal digits, or longer
    than a count; at most MAX_COUNT (anyone who can write Redis can set it)."""
    if not isinstance(raw, bytes) or len(raw) > MAX_COUNTER_BYTES or not raw.isdigit():
        return 0
    return int(clamped(raw.decode("ascii", "replace"), 0, MAX_COUNT, 0, integer=True))


@dataclass(frozen=True)
class Verified:
    """A remote entry that passed the check: its manifest (parsed) and cubin."""

    manifest: dict[str, Any]
    cubin: bytes


@dataclass(frozen=True)
class Fetched:
    """What RemoteCache.verified found for a key: ``found`` (verified), ``rejected`` (why
    the bytes there were refused), or neither (absent, or the remote is off)."""

    found: Verified | None = None
    rejected: str | None = None


class _Refused(Exception):
    """Bytes from Redis that are no usable entry, with the reason (caught in this module)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class RemoteStats:
    """Counters of one RemoteCache, in this process (snapshot via RemoteCache.stats).

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
    """Entries, aliases, locks and counters in one Redis database; every method fails open.

    Layout under the prefix: ``entry:<key>`` a hash {manifest, cubin, sig}; ``alias:<spec_key>``
    the full key of the latest upload for a toolchain-less spec (hits without a compiler),
    ``<key>:<sig>`` when signed; ``lock:<key>`` a compile lock; ``stats:hits|rejected|uploads``
    the fleet's counters. ``sig`` is there when the uploader had a fleet secret; a cache built
    with one (``signed``) requires it on every entry and alias it uses.
    """

    def __init__(
        self,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        ttl: float | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        lock_ttl: float = DEFAULT_LOCK_TTL,
        retry_after: float = DEFAULT_RETRY_AFTER,
        secret: bytes | None = None,
    ) -> None:
        """``url``: redis://[user:pass@]host:port/db or rediss:// (TLS; CA and client
        certificates as redis-py query options, e.g. ?ssl_ca_certs=/path/ca.pem). ``ttl``:
        seconds an uploaded entry lives (None: no expiry). ``timeout``: seconds for a
        connect and for each reply. ``secret``: the fleet key (config.remote_secret): sign
        uploads and use only entries whose signature verifies (None: integrity checks only).
        ValueError for a malformed URL or setting; ImportError (naming the extra) without
        redis-py. Nothing is connected here."""
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as err:
            raise ImportError(
                "the remote compile cache needs redis-py: pip install 'mlpjit[redis]'"
            ) from err

        config.check_remote_url(url)
        if not isinstance(prefix, str):
            raise ValueError(f"remote cache prefix must be a str, got {prefix!r}")
        self.url = config.redact_url(url)
        self.prefix = prefix
        ttl_range, timeout_range = config.REMOTE_TTL_RANGE, config.REMOTE_TIMEOUT_RANGE
        self.ttl_ms = None if ttl is None else _milliseconds(ttl, "remote cache ttl", ttl_range)
        self.timeout = _milliseconds(timeout, "remote cache timeout", timeout_range) / 1000
        self.lock_ttl_ms = _milliseconds(lock_ttl, "remote cache lock_ttl", (0.01, MAX_LOCK_TTL))
        retry_ms = _milliseconds(retry_after, "remote cache retry_after", (0.01, MAX_RETRY_AFTER))
        self.retry_after = retry_ms / 1000
        self._signer = None if secret is None else FleetSigner(secret)
        # No client-side retries: one failure is one timeout at most, then the tier is off.
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._auth_errors = (redis.AuthenticationError, redis.AuthenticationWrongNumberOfArgsError)
        self._acl_errors = (redis.exceptions.NoPermissionError,)
        self._scripts = {
            name: self._client.register_script(getattr(lua, name.upper()))
            for name in (
                "fetch",
                "discard",
                "alias",
                "counters",
                "incr",
                "acquire",
                "renew",
                "release",
            )
        }
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

    def alias_name(self, spec_key: str) -> str:
        """The Redis key of the alias of a toolchain-less spec key."""
        return f"{self.prefix}alias:{check_key(spec_key, 'spec key')}"

    def lock_name(self, key: str) -> str:
        """The Redis key of ``key``'s compile lock."""
        return f"{self.prefix}lock:{check_key(key)}"

    def counter_name(self, counter: str) -> str:
        """The Redis key of a fleet-wide counter (one of COUNTERS)."""
        if counter not in COUNTERS:
            raise ValueError(f"counter must be one of {', '.join(COUNTERS)}, got {counter!r}")
        return f"{self.prefix}stats:{counter}"

    @property
    def stats(self) -> RemoteStats:
        """A snapshot of this process's counters."""
        with self._mutex:
            return RemoteStats(**asdict(self._stats))

    @property
    def signed(self) -> bool:
        """Whether entries are authenticated: uploads signed, and only remote entries and
        aliases whose signature verifies are used (a fleet secret was given)."""
        return self._signer is not None

    @property
    def available(self) -> bool:
        """False while the remote is skipped after a failure (for retry_after seconds)."""
        return time.monotonic() >= self._down_until

    def _count(self, **deltas: int) -> None:
        with self._mutex:
            for name, delta in deltas.items():
                setattr(self._stats, name, getattr(self._stats, name) + delta)

    # ----------------------------------------------------------------- failing open

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
            "mlpjit: remote compile cache %s failed (%s: %s)%s; continuing with the local "
            "cache only, next try in %.0f s",
            self.url,
            what,
            error_line(err),
            self.hint(err),
            self.retry_after,
        )

    def hint(self, err: BaseException) -> str:
        """'; <what to check>' for the failures whose message does not say it, else ''."""
        if isinstance(err, self._auth_errors):
            return "; check the user and password in MLPJIT_REMOTE_CACHE"
        if isinstance(err, self._acl_errors):
            return f"; the Redis ACL of this user must allow the keys {self.prefix}*"
        if "CERTIFICATE_VERIFY_FAILED" in str(err):
            return "; for a private CA add ?ssl_ca_certs=/path/to/ca.pem to the URL"
        return ""

    def _reject(self, key: str, reason: str, what: str = "entry") -> None:
        """Count a refused entry or alias (here and fleet-wide); one WARNING per key and
        reason."""
        with self._mutex:
            self._stats.rejected += 1
            first = (key, reason) not in self._rejected_seen
            self._rejected_seen.add((key, reason))
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "mlpjit: rejected remote cache %s %s from %s: %s; it is not used",
            what,
            short_key(key),
            self.url,
            reason,
        )
        self._bump("rejected")

    # ----------------------------------------------------------------- entries

    def _fetch_reply(self, key: str) -> RawEntry | None:
        """The entry's (manifest, cubin, signature or None), or None (absent, or the remote
        is off); _Refused with the reason the server or the size caps refuse it."""
        name = self.entry_name(key)
        caps = [MAX_MANIFEST_BYTES, MAX_REMOTE_CUBIN_BYTES, MAX_SIGNATURE_BYTES]
        ok, reply = self._run("fetch", lambda: self._scripts["fetch"](keys=[name], args=caps))
        if not ok or reply is None:
            if ok:
                self._count(misses=1)
            return None
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == b"bad":
            raise _Refused(bytes(reply[1]).decode("utf-8", "replace"))
        return _raw_entry(reply)

    def fetch(self, key: str) -> tuple[bytes, bytes] | None:
        """The raw (manifest bytes, cubin) stored for ``key``, unverified and unauthenticated;
        None if absent, refused by the size caps, or the remote is unavailable. Use
        fetch_verified."""
        try:
            reply = self._fetch_reply(key)
        except _Refused as refused:
            self._reject(key, refused.reason)
            return None
        return None if reply is None else reply[:2]

    def _check(self, key: str, raw: RawEntry) -> dict[str, Any]:
        """The parsed manifest of an entry that is authentic (when signed) and intact;
        _Refused with the reason otherwise. The signature is checked first: untrusted JSON
        is parsed only once it is known to come from the fleet."""
        manifest, cubin, sig = raw
        if self._signer is not None:
            problem = self._signer.entry_problem(key, manifest, cubin, sig)
            if problem is not None:
                raise _Refused(problem)
        try:
            return verify_manifest(key, manifest, cubin)
        except CorruptEntryError as err:
            raise _Refused(str(err)) from None

    def verified(self, key: str, *, served: bool = True, spec_key: str | None = None) -> Fetched:
        """``key``'s remote entry checked: Fetched.found if it passes the store's check
        (and, with a fleet secret, the signature check), Fetched.rejected with the reason
        it was refused (counted, and the entry discarded if its bytes were read), or
        neither (absent, or the remote is off).

        ``served``: count a verified entry as a hit (False for a presence check such as
        push's). ``spec_key``: the entry must also be a build of that toolchain-less spec
        (it was found through an alias, which anyone who can write Redis can point
        anywhere). With a fleet secret an entry without a valid signature is rejected like
        a corrupt one. The returned manifest's compile_seconds is made safe to publish.
        """
        reply = None
        try:
            reply = self._fetch_reply(key)
            if reply is None:
                return Fetched()
            manifest = self._check(key, reply)
        except _Refused as refused:
            self._reject(key, refused.reason)
            if reply is not None:
                self.discard(key, *reply)
            return Fetched(rejected=refused.reason)
        if spec_key is not None and manifest["spec_key"] != spec_key:
            reason = f"it is not a build of spec {short_key(spec_key)}, which its alias names"
            self._reject(key, reason)
            return Fetched(rejected=reason)
        if served:
            self._count(hits=1)
            self._bump("hits")
        manifest["compile_seconds"] = compile_seconds_of(manifest)
        return Fetched(Verified(manifest, reply[1]))

    def fetch_verified(self, key: str, spec_key: str | None = None) -> Verified | None:
        """(manifest, cubin) of ``key``'s remote entry if it verifies exactly like a local
        load (entry.verify_manifest) and, with a fleet secret, its signature verifies; None
        otherwise. See ``verified``."""
        return self.verified(key, spec_key=spec_key).found

    def exists(self, key: str) -> bool:
        """Whether Redis holds an entry for ``key`` (False if the remote is unavailable)."""
        name = self.entry_name(key)
        ok, count = self._run("exists", lambda: self._client.exists(name))
        return bool(ok and count)

    def upload(self, key: str, manifest: bytes, cubin: bytes) -> bool:
        """Store ``key``'s entry (replacing any) and its spec's alias, with the TTL; True if
        Redis took them. With a fleet secret both are signed.

        The entry is verified first, so a bad local entry is never spread to the fleet.
        """
        try:
            parsed = verify_manifest(key, manifest, cubin)
            if len(cubin) > MAX_REMOTE_CUBIN_BYTES:
                raise CorruptEntryError(
                    f"its cubin is {len(cubin)} bytes, over the fleet cache's cap of "
                    f"{MAX_REMOTE_CUBIN_BYTES}"
                )
        except CorruptEntryError as err:
            log.warning("mlpjit: not uploading cache entry %s: %s", short_key(key), err)
            return False
        spec_key = parsed["spec_key"]
        name, alias = self.entry_name(key), self.alias_name(spec_key)
        fields = {"manifest": manifest, "cubin": cubin}
        alias_value = key.encode("ascii")
        if self._signer is not None:
            fields["sig"] = self._signer.sign_entry(key, manifest, cubin)
            alias_value += b":" + self._signer.sign_alias(spec_key, key)

        def write() -> None:
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(name)  # a hostile value of another type would make HSET fail
            pipe.hset(name, mapping=fields)
            pipe.set(alias, alias_value, px=self.ttl_ms)
            if self.ttl_ms is not None:
                pipe.pexpire(name, self.ttl_ms)
            pipe.execute()

        ok, _ = self._run("upload", write)
        if ok:
            self._count(uploads=1)
            self._bump("uploads")
        return ok

    def discard(self, key: str, manifest: bytes, cubin: bytes, sig: bytes | None = None) -> bool:
        """Delete ``key``'s entry if it still holds exactly these bytes (``sig``: its
        signature field, None when it had none); True if deleted.

        A good entry uploaded since the bad one was read is left alone.
        """
        name = self.entry_name(key)
        digests = [_sha1(manifest), _sha1(cubin), "" if sig is None else _sha1(sig)]
        ok, deleted = self._run(
            "discard", lambda: self._scripts["discard"](keys=[name], args=digests)
        )
        return bool(ok and deleted)

    def alias_target(self, spec_key: str) -> str | None:
        """The full key the alias of ``spec_key`` names, or None (absent, not a key, the
        remote is off, or, with a fleet secret, its signature does not verify: rejected).
        Even a signed alias may be an old one: verify what it names with ``spec_key``."""
        name = self.alias_name(spec_key)
        cap = [MAX_REMOTE_ALIAS_BYTES]
        ok, value = self._run("alias", lambda: self._scripts["alias"](keys=[name], args=cap))
        if ok and isinstance(value, list) and len(value) == 2 and value[0] == b"bad":
            self._reject(spec_key, bytes(value[1]).decode("ascii", "replace"), what="alias")
            return None
        match = _ALIAS_RE.fullmatch(value) if ok and isinstance(value, bytes) else None
        if match is None:
            return None
        key, sig = match.group(1).decode("ascii"), match.group(2)
        if self._signer is not None:
            problem = self._signer.alias_problem(spec_key, key, sig)
            if problem is not None:
                self._reject(spec_key, problem, what="alias")
                return None
        return key

    def entry_keys(self, limit: int | None = None) -> list[str] | None:
        """The keys of the entries under the prefix (sorted, at most ``limit``); None if
        the remote is unavailable."""
        ok, keys = self._run("scan", lambda: self._scan_entries(limit))
        return keys if ok else None

    def _scan_entries(self, limit: int | None) -> list[str]:
        """SCAN for entry keys (raises redis-py's errors; see entry_keys).

        The MATCH pattern is the exact shape of an entry's name (the prefix, "entry:", then
        64 lowercase hex digits, each a [0-9a-f] class, no "*"), so the server filters every
        page: a planted name of another length or alphabet, however huge, never leaves
        Redis, and a page holds at most SCAN_PAGE names of a fixed length.
        """
        pattern = _glob_escape(self.prefix) + "entry:" + "[0-9a-f]" * 64
        start = len(self.prefix) + len("entry:")
        found: set[str] = set()
        for name in self._client.scan_iter(match=pattern, count=SCAN_PAGE):
            key = bytes(name)[start:].decode("ascii", "replace")
            if is_key(key):
                found.add(key)
                if limit is not None and len(found) >= limit:
                    break
        return sorted(found)

    # ----------------------------------------------------------------- fleet counters

    def _bump(self, counter: str) -> None:
        """INCR a fleet-wide counter, best effort (a stray value there is left alone)."""
        name = self.counter_name(counter)
        self._run("count", lambda: self._scripts["incr"](keys=[name]))

    def fleet_counters(self) -> dict[str, int] | None:
        """The fleet-wide counters ({"hits", "rejected", "uploads"}), or None when the
        remote is unavailable."""
        ok, counters = self._run("read counters", self._read_counters)
        return counters if ok else None

    def _read_counters(self) -> dict[str, int]:
        """The fleet-wide counters, each read only if it can be a count (raises redis-py's
        errors; see fleet_counters)."""
        names = [self.counter_name(c) for c in COUNTERS]
        values = self._scripts["counters"](keys=names, args=[MAX_COUNTER_BYTES])
        if not isinstance(values, list) or len(values) != len(COUNTERS):
            values = [None] * len(COUNTERS)
        return {c: _counter_value(v) for c, v in zip(COUNTERS, values, strict=True)}

    # ----------------------------------------------------------------- locks

    def lock(self, key: str) -> RemoteLock:
        """A new (unheld) cluster-wide compile lock on ``key``."""
        return RemoteLock(self, key)

    def set_lock(self, name: str, token: str) -> tuple[bool, bool]:
        """(reachable, taken) for taking the lock ``name`` with ``token`` (for RemoteLock).

        A value under ``name`` that no live holder wrote (no expiry or a longer one than
        MAX_LOCK_TTL, not a token, another type) is taken over: anyone who can write Redis
        could otherwise make every node wait out its timeout on every kernel.
        """
        args = [token, self.lock_ttl_ms, int(MAX_LOCK_TTL * 1000)]
        ok, status = self._run("lock", lambda: self._scripts["acquire"](keys=[name], args=args))
        if ok and status == 2:
            self._took_over(name)
        return ok, ok and status in (1, 2)

    def _took_over(self, name: str) -> None:
        """Log that a lock nobody holds was taken over: WARNING once per process."""
        global _TAKEOVER_WARNED
        with _TAKEOVER_MUTEX:
            first, _TAKEOVER_WARNED = not _TAKEOVER_WARNED, True
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "mlpjit: the remote compile lock %s held a value no mlpjit node writes (no expiry, "
            "or not a lock token); taken over (later ones are logged at DEBUG)",
            short_key(name[-64:]),
        )

    def renew_lock(self, name: str, token: str) -> tuple[bool, bool]:
        """(reachable, still ours) after extending the lock's expiry if it is ours."""
        ok, renewed = self._run(
            "renew lock",
            lambda: self._scripts["renew"](keys=[name], args=[token, self.lock_ttl_ms]),
        )
        return ok, bool(renewed)

    def release_lock(self, name: str, token: str) -> None:
        """Delete the lock if it still holds our token (never another owner's)."""
        self._run("release lock", lambda: self._scripts["release"](keys=[name], args=[token]))

    def count_lock_wait(self) -> None:
        """Count one lock acquisition that had to wait for another holder."""
        self._count(lock_waits=1)

    # ----------------------------------------------------------------- inspection

    def problem(self) -> str | None:
        """None if the server answers a PING with these credentials now, else why not (one
        line, with a hint): a fresh probe, whatever earlier calls found."""
        try:
            self._client.ping()
        except self._errors as err:
            return error_line(err) + self.hint(err)
        return None

    def report(self, scan_cap: int) -> dict[str, Any]:
        """A fresh look at the server, whatever earlier calls found (for doctor and stats):
        signed (this cache's setting), reachable, auth_ok, server_version, entries (counted
        up to ``scan_cap``), entries_capped, fleet counters, error. Never raises for a
        Redis failure."""
        out: dict[str, Any] = {
            "signed": self.signed,
            "reachable": False,
            "auth_ok": None,
            "server_version": None,
            "entries": None,
            "entries_capped": False,
            "fleet": None,
            "error": None,
        }
        try:
            out["server_version"] = str(self._client.info("server").get("redis_version"))
            out["reachable"] = out["auth_ok"] = True
            out["entries"] = count = len(self._scan_entries(scan_cap))
            out["entries_capped"] = count >= scan_cap
            out["fleet"] = self._read_counters()
        except self._auth_errors as err:
            out["reachable"], out["auth_ok"] = True, False
            out["error"] = error_line(err) + self.hint(err)
        except self._errors as err:
            out["error"] = error_line(err) + self.hint(err)
        return out

    def close(self) -> None:
        """Close the connections (the cache can still be used: they reopen on demand)."""
        with contextlib.suppress(*self._errors):
            self._client.close()


def _raw_entry(reply: object) -> RawEntry:
    """The (manifest, cubin, signature or None) of the FETCH script's "ok" reply;
    _Refused with the reason the reply is refused."""
    if not (isinstance(reply, list) and len(reply) == 4 and reply[0] == b"ok"):
        raise _Refused("malformed reply")
    manifest, cubin, sig = reply[1:]
    if not (isinstance(manifest, bytes) and isinstance(cubin, bytes)):
        raise _Refused("malformed reply")
    if not (sig is None or isinstance(sig, bytes)):
        raise _Refused("malformed reply")
    if len(manifest) > MAX_MANIFEST_BYTES or len(cubin) > MAX_REMOTE_CUBIN_BYTES:
        raise _Refused("over the size cap")
    if sig is not None and len(sig) > MAX_SIGNATURE_BYTES:
        raise _Refused("the signature field is over its size cap")
    return manifest, cubin, sig


def remote_from_env() -> RemoteCache | None:
    """The RemoteCache MLPJIT_REMOTE_CACHE configures, or None when it is unset.

    Prefix, TTL, timeout and the fleet secret come from MLPJIT_REMOTE_PREFIX,
    MLPJIT_REMOTE_TTL, MLPJIT_REMOTE_TIMEOUT and MLPJIT_REMOTE_KEY_FILE (config.py). A
    malformed value or an unsafe key file raises ValueError naming its variable; ImportError
    (naming the extra) without redis-py. Without a key file the cache is integrity-checked
    only (``signed`` is False).
    """
    url = config.remote_cache_url()
    if url is None:
        return None
    prefix, ttl, timeout = config.remote_prefix(), config.remote_ttl(), config.remote_timeout()
    secret = config.remote_secret()
    try:
        return RemoteCache(url, prefix=prefix, ttl=ttl, timeout=timeout, secret=secret)
    except ValueError as err:  # redis-py's own checks of the URL's query options
        raise ValueError(f"MLPJIT_REMOTE_CACHE: {err}") from None
