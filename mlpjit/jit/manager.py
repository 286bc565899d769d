"""Single flight: check -> lock -> re-check -> compile -> publish, with stats and logging.

Across processes a per-key file lock makes W workers asking for the same kernel compile it
once; within a process, threads asking for the same key share one in-flight compile. warm()
spreads a list over workers: each starts at a different offset and first takes only keys
nobody is compiling, then waits for (and re-checks) the rest. A waiter that gives up on a
hung holder (MLPJIT_LOCK_TIMEOUT) compiles and publishes the kernel itself, so later
processes hit instead of waiting out the timeout again.

With a fleet cache (MLPJIT_REMOTE_CACHE, mlpjit.jit.remote) a local miss, under the local
key lock, first asks Redis: a remote entry is verified like a local load and published
locally. Else the cluster-wide single flight follows (the key's Redis lock, a re-check,
compile, publish locally, upload before the lock is released), so a fleet compiles each key
once. Without a remote the local path is unchanged, and a Redis that fails only costs one
warning: the manager then goes on as without it.

A compile is only started for an arch its kernel's spec lists, and a compiler
failure becomes one MlpjitError line naming the kernel, the first line of the compiler's
error and a log file holding all of it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
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
from mlpjit.jit.bounds import bounded
from mlpjit.jit.capture import current_stream_capturing as _capturing
from mlpjit.jit.key import cache_key, key_components, short_key, spec_key, toolchain
from mlpjit.jit.safe_fs import open_append
from mlpjit.jit.spec import KernelRequest, KernelSpec
from mlpjit.jit.store import CacheStore, Entry

if TYPE_CHECKING:
    from mlpjit.jit.locks import KeyLock
    from mlpjit.jit.remote import RemoteLayer

__all__ = [
    "CacheStats",
    "CompileManager",
    "check_compile_arch",
    "default_manager",
    "remote_layer",
]

log = logging.getLogger(__name__)

Progress = Callable[[int, int, "KernelRequest"], None]

# CuTe DSL's compiler keeps global state (MLIR context, option objects): one compile at a time.
_COMPILE_MUTEX = threading.Lock()

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
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


def _check_timeout(seconds: float) -> float:
    """The lock_timeout argument as float seconds within config.LOCK_TIMEOUT_RANGE (the
    range of MLPJIT_LOCK_TIMEOUT: a longer timed wait overflows); ValueError otherwise."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"lock_timeout must be a number of seconds, got {seconds!r}")
    return float(bounded(seconds, "lock_timeout", *config.LOCK_TIMEOUT_RANGE))


def _first_line(err: BaseException) -> str:
    """The first non-blank line of an error's text (colours stripped), with its type."""
    text = _ANSI_RE.sub("", str(err))
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    if len(line) > _MAX_REASON:
        line = line[: _MAX_REASON - 3] + "..."
    return f"{type(err).__name__}: {line}" if line else type(err).__name__


@dataclass
class CacheStats:
    """Counters of one manager (snapshot via CompileManager.stats).

    hits: local hits; misses: local misses (each then a remote hit, a wait or a compile);
    quarantined: from the store; remote_hits, remote_rejects, uploads: from the remote
    layer (0 without one): entries fetched from Redis, refused, and uploaded.
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
        remote: RemoteLayer | None = None,
    ) -> None:
        """``lock_timeout``: seconds to wait on another process's compile of a key (None:
        MLPJIT_LOCK_TIMEOUT, read and checked at every get/warm). ValueError outside
        config.LOCK_TIMEOUT_RANGE (0.01 s to a day).
        ``remote``: the fleet cache in front of ``store`` (None: the local cache alone);
        its store is this manager's (ValueError if both are given and differ)."""
        if remote is not None and store is not None and remote.store is not store:
            raise ValueError("CompileManager: remote must be a RemoteLayer over the same store")
        if store is None:
            store = remote.store if remote is not None else CacheStore()
        self.store = store
        self.remote = remote
        self.lock_timeout = None if lock_timeout is None else _check_timeout(lock_timeout)
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
        if self.remote is not None:
            remote = self.remote.remote.stats
            snap.remote_hits, snap.remote_rejects = remote.hits, remote.rejected
            snap.uploads = remote.uploads
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
        timeout = self._timeout()
        entry = self._get(self._resolve(request), blocking=True, timeout=timeout)
        assert entry is not None
        return entry

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

        def finish(i: int, entry: Entry) -> None:
            results[i] = entry
            if progress is not None:
                progress(len(results), total, resolved[i].request)

        if total:
            start = os.getpid() % total
            for i in [(start + j) % total for j in range(total)]:
                entry = self._get(resolved[i], blocking=False, timeout=timeout)
                if entry is not None:
                    finish(i, entry)
            for i in range(total):
                if i not in results:
                    entry = self._get(resolved[i], blocking=True, timeout=timeout)
                    assert entry is not None
                    finish(i, entry)
        return [results[i] for i in range(total)]

    # ----------------------------------------------------------------- internals

    def _resolve(self, request: KernelRequest) -> _KeyedRequest:
        if not isinstance(request, KernelRequest):
            raise ValueError(f"request must be a KernelRequest, got {type(request).__name__}")
        spec = request.spec
        components = key_components(spec, request.params, request.arch)
        return _KeyedRequest(request, spec, components, cache_key(components), spec_key(components))

    def _lookup(self, r: _KeyedRequest) -> Entry | None:
        # use=True: a load for a launch is what counts as a use (last_used, prune's LRU order).
        if toolchain():
            return self.store.lookup(r.key, use=True)
        # No compiler installed: any toolchain's build of this exact spec will do.
        return self.store.lookup_alias(r.spec_key, use=True)

    def _hit(self, r: _KeyedRequest, entry: Entry, count: bool = True) -> Entry:
        with self._mutex:
            self._memo[r.key] = entry
        if count:
            self._count(hits=1)
            log.debug("mlpjit: cache hit %s %s", r.request.kernel, short_key(entry.key))
        self._record(r)
        return entry

    def _get(self, r: _KeyedRequest, blocking: bool, timeout: float) -> Entry | None:
        while True:
            with self._mutex:
                entry = self._memo.get(r.key)
            if entry is not None:
                return self._hit(r, entry)
            entry = self._lookup(r)
            if entry is not None:
                return self._hit(r, entry)
            # Threads of this process share one compile per key.
            with self._mutex:
                future = self._inflight.get(r.key)
                leader = future is None
                if leader:
                    future = self._inflight[r.key] = Future()
                elif blocking:
                    self._waiters[r.key] = self._waiters.get(r.key, 0) + 1
            assert future is not None
            if leader:
                break
            if not blocking:
                return None
            try:
                return future.result()
            except CancelledError:
                continue  # the leader was a non-blocking warm pass that skipped: try again
        try:
            entry = self._miss(r, blocking, timeout)
        except BaseException as err:
            future.set_exception(err)
            raise
        finally:
            with self._mutex:
                self._inflight.pop(r.key, None)
                self._waiters.pop(r.key, None)
        if entry is None:
            future.cancel()
        else:
            future.set_result(entry)
        return entry

    def _miss(self, r: _KeyedRequest, blocking: bool, timeout: float) -> Entry | None:
        """Compile ``r`` under its key lock (None if not blocking and another holds it).

        A waiter that times out compiles and publishes even though the holder (hung, or just
        slow) still has the lock: else every new process would wait the full timeout again
        for this key. Publishing is atomic (temp file and rename, manifest last) and every
        load verifies the sha256 against the manifest, so a late publish by the holder racing
        ours can cost at most a quarantine and one recompile, never a mismatched launch.
        """
        from mlpjit.jit.locks import KeyLock  # filelock is only needed on a miss

        if _capturing():  # never wait for a lock, let alone compile, inside a capture
            raise CaptureError(
                f"mlpjit kernel {r.request.kernel} {short_key(r.key)} is not compiled and "
                f"the current CUDA stream is capturing a graph; call prepare() before capture"
            )
        lock = KeyLock(self.store.lock_path(r.key))
        timed_out = False
        if not lock.try_acquire():
            if not blocking:
                return None
            t0 = time.perf_counter()
            timed_out = not lock.acquire(timeout)
            r.waited = time.perf_counter() - t0
            self._count(lock_waits=1, wait_seconds=r.waited)
            if timed_out:
                log.warning(
                    "mlpjit: waited %.1f s for another process compiling %s %s; compiling and "
                    "publishing it here (MLPJIT_LOCK_TIMEOUT)",
                    r.waited,
                    r.request.kernel,
                    short_key(r.key),
                )
        try:
            self._count(misses=1)
            entry = self._lookup(r)  # someone may have published while we waited
            if entry is not None:
                if r.waited:
                    log.info(
                        "mlpjit: %s %s ready after waiting %.2f s for another process",
                        r.request.kernel,
                        short_key(r.key),
                        r.waited,
                    )
                return self._hit(r, entry, count=False)
            if self.remote is None:
                entry = self._compile_and_publish(r, lock, timed_out)
            else:
                entry = self._remote_miss(r, lock, blocking, timed_out, timeout)
                if entry is None:
                    return None
        finally:
            lock.release()
        return self._hit(r, entry, count=False)

    def _compile_and_publish(self, r: _KeyedRequest, lock: KeyLock, timed_out: bool) -> Entry:
        """Compile ``r`` and publish it locally (the caller holds its key lock unless the
        wait for it timed out)."""
        binary, seconds = self._compile(r)
        if not lock.held:
            lock.try_acquire()  # the holder may be gone by now: publish under the lock
        # A waiter that timed out re-checks (the holder may have published meanwhile),
        # then publishes with or without the lock: see _miss for why that is safe.
        entry = (self._lookup(r) if timed_out else None) or self.store.publish(
            r.key, r.components, binary, seconds
        )
        self._log_compile(r, seconds)
        return entry

    def _remote_miss(
        self, r: _KeyedRequest, lock: KeyLock, blocking: bool, timed_out: bool, timeout: float
    ) -> Entry | None:
        """A local miss with a fleet cache: a remote hit, else one compile across the fleet
        (None only when not ``blocking`` and another node is compiling the key).

        A waiter whose local wait timed out does not wait for the remote lock too: the
        holder it gave up on may be the one holding it. Without a compiler the entry can
        only come through Redis' alias of the toolchain-less spec.
        """
        layer = self.remote
        assert layer is not None
        check_compile_arch(r.spec, r.request.arch)  # no entry exists for another arch
        if not toolchain():
            entry = layer.lookup_alias(r.spec_key)
            return entry if entry is not None else self._compile_and_publish(r, lock, timed_out)
        wait = timeout if blocking and not timed_out else 0.0
        with layer.single_flight(r.key, wait) as flight:
            if flight.entry is not None:
                log.info(
                    "mlpjit: %s %s fetched from the remote cache",
                    r.request.kernel,
                    short_key(r.key),
                )
                return flight.entry
            if flight.busy and not blocking:
                return None  # another node compiles it: warm's second pass waits for it
            entry = self._compile_and_publish(r, lock, timed_out)
            layer.after_compile(entry)  # before the remote lock is released
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
                f.write(header + _ANSI_RE.sub("", text))
            where = f"full log: {path}"
        except OSError as log_err:
            log.debug("mlpjit: compile error of %s:\n%s", short_key(r.key), text)
            where = f"no log file ({log_err}); the full error is logged at DEBUG"
        return f"{what}: {_first_line(err)} ({where})"

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


def remote_layer(store: CacheStore) -> RemoteLayer | None:
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
        from mlpjit.jit.remote import RemoteLayer, remote_from_env

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
    return None if remote is None else RemoteLayer(store, remote)


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
    # The key file as its path and mtime: a rotated key rebuilds the layer (the bytes stay
    # in the layer, never in this tuple).
    key_file = config.remote_key_file()
    key_stamp = None
    if key_file is not None:
        try:
            key_stamp = (key_file, os.stat(key_file).st_mtime_ns)
        except OSError:
            key_stamp = (key_file, None)
    return (url, *settings, key_stamp)


def default_manager() -> CompileManager:
    """The process-wide manager, built on first use from MLPJIT_CACHE_DIR / MLPJIT_CACHE_PATH
    and MLPJIT_REMOTE_* (the fleet cache, when MLPJIT_REMOTE_CACHE is set).

    Rebuilt if those variables changed since (tests, or a server that re-points its cache).
    """
    global _DEFAULT, _DEFAULT_SETTINGS
    root, layers = config.cache_dir().absolute(), tuple(p.absolute() for p in config.cache_path())
    # Compared as configured: the store resolves symlinks once, which must not rebuild it.
    settings = (root, layers, _remote_settings())
    with _DEFAULT_MUTEX:
        if _DEFAULT is None or settings != _DEFAULT_SETTINGS:
            store = CacheStore(root, layers)
            _DEFAULT = CompileManager(store, remote=remote_layer(store))
            _DEFAULT_SETTINGS = settings
        return _DEFAULT
