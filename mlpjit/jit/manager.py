"""Compile once: look up -> lock -> re-check -> shared tiers -> compile -> publish -> put.

Across processes a per-key file lock makes W workers asking for the same kernel compile it
once; within a process, threads asking for the same key share one in-flight compile. warm()
spreads a list over workers: each starts at a different offset and first takes only keys
nobody is compiling, then waits for (and re-checks) the rest. A waiter that gives up on a
hung holder (MLPJIT_LOCK_TIMEOUT) compiles and publishes the kernel itself, so later
processes hit instead of waiting out the timeout again.

The manager walks the chain of cache tiers (tiers.py): the store's local tiers without a
lock, then, under the local key lock, each shared tier (the Redis tier of
MLPJIT_REMOTE_CACHE, mlpjit.jit.remote): its entry, verified like a local load and
published locally, or its single flight (the key's lock there, a re-check, compile,
publish locally, put before the lock is released), so a fleet compiles each key once. A
shared tier that fails only costs one warning: the manager then goes on without it.

The whole flow for one request is ``CompileManager._get``, which ends in an ``Outcome``.

A compile is only started for an arch its kernel's spec lists, and a compiler
failure becomes one MlpjitError line naming the kernel, the first line of the compiler's
error and a log file holding all of it.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import json
import logging
import os
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mlpjit.errors import CaptureError, CompilerUnavailableError, MlpjitError
from mlpjit.jit import config
from mlpjit.jit.binary import KernelBinary
from mlpjit.jit.bounds import seconds
from mlpjit.jit.capture import current_stream_capturing as _capturing
from mlpjit.jit.entry import Entry
from mlpjit.jit.installed import installed_caches
from mlpjit.jit.key import cache_key, key_components, short_key, spec_key, toolchain
from mlpjit.jit.messages import error_line, strip_ansi
from mlpjit.jit.safe_fs import open_append
from mlpjit.jit.spec import KernelRequest, KernelSpec
from mlpjit.jit.store import CacheStore

if TYPE_CHECKING:
    from mlpjit.jit.locks import TierLock
    from mlpjit.jit.remote import RemoteTier
    from mlpjit.jit.tiers import SharedTier

__all__ = [
    "CacheStats",
    "CompileManager",
    "How",
    "Outcome",
    "check_compile_arch",
    "default_manager",
    "remote_tier",
]

log = logging.getLogger(__name__)

Progress = Callable[[int, int, "KernelRequest"], None]

# CuTe DSL's compiler keeps global state (MLIR context, option objects): one compile at a time.
_COMPILE_MUTEX = threading.Lock()

_MAX_REASON = 300  # characters of the compiler's first error line kept in the message


def check_compile_arch(spec: KernelSpec, arch: str) -> str:
    """Return ``arch`` if ``spec``'s kernel compiles for it; ValueError naming the allowed ones.

    Checked before a compile starts: CuTe DSL itself answers an unknown target with a
    KeyError and a too-old one with pages of ptxas errors.
    """
    if arch not in spec.archs:
        raise ValueError(
            f"kernel {spec.name} compiles for {', '.join(spec.archs) or 'no arch'}, not {arch!r}"
        )
    return arch


class How(enum.Enum):
    """How the compile-once flow ended for one request."""

    HIT = "found in a local tier, or in this process's memo"
    JOINED = "another thread of this process got it"
    READY = "another process published it while this one waited for the key's lock"
    FETCHED = "fetched from a shared tier, verified and published locally"
    COMPILED = "compiled and published here"
    BUSY = "another process or node is compiling it, and the caller would not wait"


@dataclass(frozen=True)
class Outcome:
    """The end of the compile-once flow: ``entry`` (None only when ``how`` is BUSY)."""

    how: How
    entry: Entry | None = None


BUSY = Outcome(How.BUSY)


@dataclass
class CacheStats:
    """Counters of one manager (snapshot via CompileManager.stats).

    hits: local hits; misses: local misses (each then a remote hit, a wait or a compile);
    quarantined: from the store; remote_hits, remote_rejects, uploads: from the shared
    tiers (0 without one): entries fetched from Redis, refused, and uploaded.
    """

    hits: int = 0
    misses: int = 0
    compiles: int = 0
    lock_waits: int = 0
    wait_seconds: float = 0.0
    compile_seconds: float = 0.0
    quarantined: int = 0
    remote_hits: int = 0
    remote_rejects: int = 0
    uploads: int = 0


@dataclass
class _KeyedRequest:
    """A request with its key material computed once."""

    request: KernelRequest
    spec: KernelSpec
    components: dict[str, Any]
    key: str
    spec_key: str  # the key without the toolchain (finds entries when no compiler is installed)
    waited: float = field(default=0.0)


class CompileManager:
    """Gets kernels from the cache, compiling each missing one once across processes."""

    def __init__(
        self,
        store: CacheStore | None = None,
        lock_timeout: float | None = None,
        remote: RemoteTier | None = None,
    ) -> None:
        """``lock_timeout``: seconds to wait on another process's compile of a key (None:
        MLPJIT_LOCK_TIMEOUT, read and checked at every get/warm). ValueError outside
        config.LOCK_TIMEOUT_RANGE (0.01 s to a day).
        ``remote``: the Redis tier behind ``store`` (None: the local tiers alone); its store
        is this manager's (ValueError if both are given and differ)."""
        if remote is not None and store is not None and remote.store is not store:
            raise ValueError("CompileManager: remote must be a RemoteTier over the same store")
        if store is None:
            store = remote.store if remote is not None else CacheStore()
        self.store = store
        self.remote = remote
        self.shared_tiers: tuple[SharedTier, ...] = () if remote is None else (remote,)
        self.lock_timeout = (
            None
            if lock_timeout is None
            else seconds(lock_timeout, "lock_timeout", config.LOCK_TIMEOUT_RANGE)
        )
        self._mutex = threading.Lock()
        self._inflight: dict[str, Future[Entry]] = {}
        self._waiters: dict[str, int] = {}
        self._memo: dict[str, Entry] = {}
        self._recorded: set[str] = set()
        self._stats = CacheStats()

    @property
    def stats(self) -> CacheStats:
        """A snapshot of this manager's counters."""
        with self._mutex:
            snap = CacheStats(**vars(self._stats))
        snap.quarantined = self.store.quarantined
        for tier in self.shared_tiers:
            counts = tier.stats
            snap.remote_hits += counts.hits
            snap.remote_rejects += counts.rejected
            snap.uploads += counts.uploads
        return snap

    def _count(self, **deltas: float) -> None:
        with self._mutex:
            for name, delta in deltas.items():
                setattr(self._stats, name, getattr(self._stats, name) + delta)

    def _timeout(self) -> float:
        """The lock wait of this get/warm. Read up front, so a bad MLPJIT_LOCK_TIMEOUT fails
        every call at once (ValueError naming it), not only the rare one that meets a lock."""
        return self.lock_timeout if self.lock_timeout is not None else config.lock_timeout()

    # ----------------------------------------------------------------- public API

    def get(self, request: KernelRequest) -> Entry:
        """The entry for ``request``: a cache hit, or a single-flight compile and publish."""
        outcome = self.obtain(request)
        assert outcome.entry is not None  # BUSY only when not waiting
        return outcome.entry

    def obtain(self, request: KernelRequest, wait: float | None = None) -> Outcome:
        """The compile-once flow for ``request`` and how it ended (see _get).

        ``wait``: seconds to wait for another process's or node's compile of the key (None:
        the lock timeout; 0: none at all, and the outcome is BUSY while one compiles it).
        ValueError for a wait outside 0 to config.LOCK_TIMEOUT_RANGE's end.
        """
        if wait is None:
            wait = self._timeout()
        else:
            wait = seconds(wait, "wait", (0.0, config.LOCK_TIMEOUT_RANGE[1]))
        return self._get(self._resolve(request), wait)

    def warm(
        self, requests: Sequence[KernelRequest], progress: Progress | None = None
    ) -> list[Entry]:
        """Get every request (in order), spreading compiles over cooperating processes.

        Pass 1 starts at an offset derived from the pid and compiles only keys whose lock is
        free, skipping ones another worker is compiling; pass 2 waits for those and re-checks.
        ``progress(done, total, request)`` is called after each request is ready.
        """
        timeout = self._timeout()
        resolved = [self._resolve(r) for r in requests]
        total = len(resolved)
        results: dict[int, Entry] = {}
        start = os.getpid() % total if total else 0
        first_pass = [((start + j) % total, 0.0) for j in range(total)]
        for i, wait in [*first_pass, *((i, timeout) for i in range(total))]:
            if i in results:
                continue
            outcome = self._get(resolved[i], wait=wait)
            if outcome.entry is not None:
                results[i] = outcome.entry
                if progress is not None:
                    progress(len(results), total, resolved[i].request)
        return [results[i] for i in range(total)]

    # ----------------------------------------------------------------- internals

    def _resolve(self, request: KernelRequest) -> _KeyedRequest:
        if not isinstance(request, KernelRequest):
            raise ValueError(f"request must be a KernelRequest, got {type(request).__name__}")
        spec = request.spec
        components = key_components(spec, request.params, request.arch)
        return _KeyedRequest(request, spec, components, cache_key(components), spec_key(components))

    def _lookup(self, r: _KeyedRequest) -> Entry | None:
        """The verified entry for ``r`` from the store's local tiers (no lock taken)."""
        # use=True: a load for a launch is what counts as a use (last_used, prune's LRU order).
        if toolchain():
            return self.store.lookup(r.key, use=True)
        # No compiler installed: any toolchain's build of this exact spec will do.
        return self.store.lookup_alias(r.spec_key, use=True)

    def _done(self, r: _KeyedRequest, entry: Entry, how: How) -> Outcome:
        """Remember ``entry`` for this process and record the request."""
        with self._mutex:
            self._memo[r.key] = entry
        if how is How.HIT:
            self._count(hits=1)
            log.debug("mlpjit: cache hit %s %s", r.request.kernel, short_key(entry.key))
        self._record(r)
        return Outcome(how, entry)

    def _get(self, r: _KeyedRequest, wait: float) -> Outcome:
        """The compile-once flow for one request, waiting at most ``wait`` seconds (0: not
        at all) for another process's or node's compile of it.

        1. LOOK UP: this process's memo, then each local tier (no lock).
        2. JOIN: threads of this process share one flight per key; a follower waits for
           the leader's result (BUSY when not waiting), and looks again if the leader was
           a non-waiting pass that gave up.
        3. LEAD: _claim_and_build, under the key's locks.
        """
        while True:
            with self._mutex:
                entry = self._memo.get(r.key)
            entry = entry or self._lookup(r)
            if entry is not None:
                return self._done(r, entry, How.HIT)
            with self._mutex:
                future = self._inflight.get(r.key)
                leader = future is None
                if leader:
                    future = self._inflight[r.key] = Future()
                elif wait:
                    self._waiters[r.key] = self._waiters.get(r.key, 0) + 1
            assert future is not None
            if leader:
                break
            if not wait:
                return BUSY
            try:
                return Outcome(How.JOINED, future.result())
            except CancelledError:
                continue  # the leader was a non-waiting warm pass that gave up: look again
        try:
            outcome = self._claim_and_build(r, wait)
        except BaseException as err:
            future.set_exception(err)
            raise
        finally:
            with self._mutex:
                self._inflight.pop(r.key, None)
                self._waiters.pop(r.key, None)
        if outcome.entry is None:
            future.cancel()
        else:
            future.set_result(outcome.entry)
        return outcome

    def _claim_and_build(self, r: _KeyedRequest, wait: float) -> Outcome:
        """The cross-process part of the flow, under the key's locks.

        4. CLAIM the local key lock: taken, BUSY (held, and not waiting), or given up after
           ``wait`` seconds on a hung holder.
        5. RE-CHECK the local tiers: another process may have published meanwhile (READY).
        6. SHARED tiers: each one's entry (FETCHED), else its single flight: BUSY when
           another node compiles it and the caller would not wait.
        7. COMPILE, PUBLISH locally, PUT into each shared tier, release the locks.

        A waiter that gave up compiles and publishes even though the holder (hung, or just
        slow) still has the lock: else every new process would wait the full timeout again
        for this key. Publishing is atomic (temp file and rename, manifest last) and every
        load verifies the sha256 against the manifest, so a late publish by the holder racing
        ours can cost at most a quarantine and one recompile, never a mismatched launch. It
        does not wait for a shared tier's lock too: the holder it gave up on may hold it.
        """
        if _capturing():  # never wait for a lock, let alone compile, inside a capture
            raise CaptureError(
                f"mlpjit kernel {r.request.kernel} {short_key(r.key)} is not compiled and "
                f"the current CUDA stream is capturing a graph; call prepare() before capture"
            )
        lock = self.store.writable.lock(r.key)
        if not lock.try_acquire():
            if not wait:
                return BUSY
            self._wait_for(r, lock, wait)
        try:
            self._count(misses=1)
            entry = self._lookup(r)
            if entry is not None:
                if r.waited:
                    log.info(
                        "mlpjit: %s %s ready after waiting %.2f s for another process",
                        r.request.kernel,
                        short_key(r.key),
                        r.waited,
                    )
                return self._done(r, entry, How.READY)
            with contextlib.ExitStack() as flights:
                for tier in self.shared_tiers:
                    check_compile_arch(r.spec, r.request.arch)  # no entry for another arch
                    if not toolchain():
                        # Without a compiler only the tier's alias of the spec can serve.
                        entry = tier.get_alias(r.spec_key).entry
                        if entry is not None:
                            return self._done(r, entry, How.FETCHED)
                        continue
                    flight = flights.enter_context(
                        tier.single_flight(r.key, wait if lock.held else 0.0)
                    )
                    if flight.entry is not None:
                        log.info(
                            "mlpjit: %s %s fetched from the remote cache",
                            r.request.kernel,
                            short_key(r.key),
                        )
                        return self._done(r, flight.entry, How.FETCHED)
                    if flight.busy and not wait:
                        return BUSY  # another node compiles it: warm's second pass waits
                entry = self._compile_and_publish(r, lock)
                for tier in self.shared_tiers:
                    tier.put(entry)  # before the shared tier's lock is released
                return self._done(r, entry, How.COMPILED)
        finally:
            lock.release()

    def _wait_for(self, r: _KeyedRequest, lock: TierLock, wait: float) -> None:
        """Wait at most ``wait`` seconds for the key's local lock (a holder is compiling);
        a wait that runs out leaves the lock unheld, with a warning."""
        t0 = time.perf_counter()
        got = lock.acquire(wait)
        r.waited = time.perf_counter() - t0
        self._count(lock_waits=1, wait_seconds=r.waited)
        if not got:
            log.warning(
                "mlpjit: waited %.1f s for another process compiling %s %s; compiling and "
                "publishing it here (MLPJIT_LOCK_TIMEOUT)",
                r.waited,
                r.request.kernel,
                short_key(r.key),
            )

    def _compile_and_publish(self, r: _KeyedRequest, lock: TierLock) -> Entry:
        """Compile ``r`` and publish it locally (under ``lock`` unless the wait for it ran
        out: see _claim_and_build for why that is safe)."""
        binary, seconds_taken = self._compile(r)
        gave_up = not lock.held
        if gave_up:
            lock.try_acquire()  # the holder may be gone by now: publish under the lock
        # A waiter that gave up re-checks: the holder may have published meanwhile.
        entry = (self._lookup(r) if gave_up else None) or self.store.publish(
            r.key, r.components, binary, seconds_taken
        )
        self._log_compile(r, seconds_taken)
        return entry

    def _compile(self, r: _KeyedRequest) -> tuple[KernelBinary, float]:
        """Compile ``r`` with its kernel module; see _compile_failed for how errors end."""
        check_compile_arch(r.spec, r.request.arch)
        if not toolchain():
            raise CompilerUnavailableError(self._no_compiler_message(r))
        try:
            module = importlib.import_module(r.spec.builder)
        except ImportError as err:
            if err.name and err.name.split(".")[0] in ("cutlass", "cuda"):
                raise CompilerUnavailableError(self._no_compiler_message(r)) from err
            raise
        with _COMPILE_MUTEX:
            t0 = time.perf_counter()
            try:
                params = r.spec.make_params(r.request.params)
                binary = module.compile_cubin(params, r.request.arch)
            except (ValueError, MlpjitError):
                raise  # the kernel's own parameter checks: already one clear line
            except Exception as err:
                raise MlpjitError(self._compile_failed(r, err)) from err
            seconds = time.perf_counter() - t0
        self._count(compiles=1, compile_seconds=seconds)
        return binary, seconds

    def _compile_failed(self, r: _KeyedRequest, err: Exception) -> str:
        """The one-line message of a failed compile; the full error goes to a log file.

        Compiler errors (ptxas, NVVM, MLIR) run to pages; callers such as `mlpjit warm`
        print one line, so the first line of the error and the log's path are what is kept.
        """
        what = f"compiling {r.request.kernel} {short_key(r.key)} for {r.request.arch} failed"
        text = "".join(traceback.format_exception(err))
        header = (
            f"{what}\nkey {r.key}\nparams {json.dumps(dict(r.request.params), sort_keys=True)}"
            f"\ntoolchain {json.dumps(toolchain(), sort_keys=True)}\n\n"
        )
        try:
            # mkstemp: a fresh file only we can read, never one an attacker pre-created.
            fd, path = tempfile.mkstemp(prefix=f"mlpjit-compile-{short_key(r.key)}-", suffix=".log")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(header + strip_ansi(text))
            where = f"full log: {path}"
        except OSError as log_err:
            log.debug("mlpjit: compile error of %s:\n%s", short_key(r.key), text)
            where = f"no log file ({log_err}); the full error is logged at DEBUG"
        return f"{what}: {error_line(err, first_line=True, max_chars=_MAX_REASON)} ({where})"

    def _no_compiler_message(self, r: _KeyedRequest) -> str:
        return (
            f"mlpjit kernel {r.request.kernel} (key {short_key(r.key)}, params "
            f"{json.dumps(dict(r.request.params), sort_keys=True)}, arch {r.request.arch}) is "
            f"not in any cache and nvidia-cutlass-dsl is not installed to compile it. Fix: "
            f"pip install nvidia-cutlass-dsl, or warm a cache with `mlpjit warm` and point "
            f"MLPJIT_CACHE_DIR or MLPJIT_CACHE_PATH at it"
        )

    def _log_compile(self, r: _KeyedRequest, seconds: float) -> None:
        with self._mutex:
            threads = self._waiters.get(r.key, 0)
        who = []
        if r.waited:
            who.append(f"after waiting {r.waited:.2f} s for the lock")
        if threads:
            who.append(f"{threads} other thread(s) waited")
        log.info(
            "mlpjit: compiled %s %s in %.2f s%s",
            r.request.kernel,
            short_key(r.key),
            seconds,
            f" ({'; '.join(who)})" if who else "",
        )

    def _record(self, r: _KeyedRequest) -> None:
        """Append the request to MLPJIT_RECORD once per process (O_APPEND: one line, atomic).

        The file is created 0600; an existing one is used only if it is our own regular file
        (never through a symlink, never a FIFO), else one warning and no record.
        """
        path = config.record_file()
        if path is None:
            return
        with self._mutex:
            if r.key in self._recorded:
                return
            self._recorded.add(r.key)
        line = r.request.to_json_line()
        try:
            fd = open_append(path)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError as err:
            log.warning("mlpjit: cannot append to MLPJIT_RECORD file %s: %s", path, err)


_DEFAULT: CompileManager | None = None
_DEFAULT_SETTINGS: tuple[Any, ...] | None = None
_DEFAULT_MUTEX = threading.Lock()
_MISSING_REDIS_WARNED = False


def remote_tier(store: CacheStore) -> RemoteTier | None:
    """The fleet cache MLPJIT_REMOTE_CACHE configures in front of ``store``, or None.

    The fleet is optional for a serving process (prepare, warm): without redis-py, or with a
    malformed MLPJIT_REMOTE_* value (a bad URL, TTL, timeout or key file), it logs one
    WARNING naming the variable and keeps to its local cache. The remote package (and
    redis-py) is imported only when the variable is set. The explicit fleet commands (cache
    push, pull, stats) build their RemoteCache themselves and fail on the same values.
    """
    global _MISSING_REDIS_WARNED
    try:
        if config.remote_cache_url() is None:
            return None
        from mlpjit.jit.remote import RemoteTier, remote_from_env

        remote = remote_from_env()
    except ValueError as err:
        log.warning("mlpjit: %s; using the local cache only", err)
        return None
    except ImportError:
        if not _MISSING_REDIS_WARNED:
            _MISSING_REDIS_WARNED = True
            log.warning(
                "mlpjit: MLPJIT_REMOTE_CACHE is set but redis-py is not installed "
                "(pip install 'mlpjit[redis]'); using the local cache only"
            )
        return None
    return None if remote is None else RemoteTier(store, remote)


def _remote_settings() -> tuple[Any, ...] | None:
    """The MLPJIT_REMOTE_* values a default manager was built from (None: no remote; the
    error's text for a malformed value, so that fixing it rebuilds the manager)."""
    try:
        url = config.remote_cache_url()
        settings = (config.remote_prefix(), config.remote_ttl(), config.remote_timeout())
    except ValueError as err:
        return ("malformed", str(err))
    if url is None:
        return None
    # The key file as its path and mtime: a rotated key rebuilds the tier (the bytes stay
    # in the tier, never in this tuple).
    key_file = config.remote_key_file()
    key_stamp = None
    if key_file is not None:
        try:
            key_stamp = (key_file, os.stat(key_file).st_mtime_ns)
        except OSError:
            key_stamp = (key_file, None)
    return (url, *settings, key_stamp)


def default_manager() -> CompileManager:
    """The process-wide manager, built on first use from MLPJIT_CACHE_DIR / MLPJIT_CACHE_PATH,
    the installed cubin wheels (MLPJIT_CACHE_WHEELS) and MLPJIT_REMOTE_* (the fleet cache,
    when MLPJIT_REMOTE_CACHE is set).

    Rebuilt if those variables changed since (tests, or a server that re-points its cache).
    """
    global _DEFAULT, _DEFAULT_SETTINGS
    root = config.cache_dir().absolute()
    read_only = tuple(p.absolute() for p in config.cache_path())
    wheels = installed_caches()
    # Compared as configured: the store resolves symlinks once, which must not rebuild it.
    settings = (root, read_only, wheels, _remote_settings())
    with _DEFAULT_MUTEX:
        if _DEFAULT is None or settings != _DEFAULT_SETTINGS:
            store = CacheStore(root, read_only, wheels)
            _DEFAULT = CompileManager(store, remote=remote_tier(store))
            _DEFAULT_SETTINGS = settings
        return _DEFAULT
