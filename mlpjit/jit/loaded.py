"""The process-wide memo of loaded kernels: a request's LoadedKernel per device, asked once.

A model has many layers of a few shapes (GLM-5 at TP 8: 78 MLPs, 32 distinct kernels), and
each layer's prepare() asks for its kernels by request. Through the compile manager alone
every ask pays for the request's key (params validated, two sha256 of canonical JSON) before
the manager's own memo answers. Through ``load_kernels`` the first ask of a request on a
device goes through the manager (the cache lookup and its verification, or a compile) and
the launcher (one cuModuleLoadData per key and device); every later ask is a dict lookup.

The memo never serves what the manager would no longer give:
- it is kept per compile manager, weakly: ``default_manager()`` builds a new manager when
  MLPJIT_CACHE_DIR, MLPJIT_CACHE_PATH or the MLPJIT_REMOTE_* settings change, and a new
  manager starts with an empty memo (so does a test's own manager);
- within a manager, per MLPJIT_RECORD file: a process that starts recording asks the
  manager again, which appends each kernel it serves to the record once.
Values derived from loaded kernels (DenseMlp's kernel pairs per layer signature) live in
``derived()``'s dict, in the same scope, so the later layers of a shape skip even the memo's
per-request lookups.
``clear()`` forgets everything (tests). Loaded modules stay loaded either way: the launcher
keeps one per (key, device) for the life of the process.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlpjit.jit import config

if TYPE_CHECKING:
    import torch

    from mlpjit.jit.launcher import LoadedKernel
    from mlpjit.jit.manager import CompileManager
    from mlpjit.jit.spec import KernelRequest

__all__ = ["MemoStats", "clear", "derived", "load_kernels", "stats"]


@dataclass
class MemoStats:
    """What the memo did in this process: ``asked`` requests, of which ``hits`` it answered
    itself; the rest went to the compile manager and the launcher."""

    asked: int = 0
    hits: int = 0


_lock = threading.Lock()
# manager -> {(MLPJIT_RECORD file, device, request identity): LoadedKernel}
_memo: weakref.WeakKeyDictionary[Any, dict[tuple, LoadedKernel]] = weakref.WeakKeyDictionary()
_stats = MemoStats()
# manager -> {MLPJIT_RECORD file: the derived() dict}
_derived: weakref.WeakKeyDictionary[Any, dict[Any, dict]] = weakref.WeakKeyDictionary()


# id(request) -> (request, its identity): the planner hands every layer of a shape the same
# request objects, so each is taken apart once. Holding the request keeps its id unique.
_identities: dict[int, tuple[KernelRequest, tuple]] = {}
_MAX_IDENTITIES = 4096


def _identity(request: KernelRequest) -> tuple:
    """What tells two requests apart, hashable: a value's type is part of it, as it is of
    the key (the canonical JSON of 1, 1.0 and true differ, and so do their cache keys)."""
    known = _identities.get(id(request))
    if known is not None and known[0] is request:
        return known[1]
    params = tuple(sorted((name, type(value), value) for name, value in request.params.items()))
    identity = (request.kernel, request.arch, params)
    if len(_identities) >= _MAX_IDENTITIES:
        _identities.clear()
    _identities[id(request)] = (request, identity)
    return identity


def load_kernels(
    requests: Sequence[KernelRequest],
    device: torch.device,
    manager: CompileManager | None = None,
) -> Iterator[LoadedKernel]:
    """The loaded kernel of each request on CUDA ``device``, in order, as an iterator.

    ``manager`` (default: ``default_manager()``) gets the requests the memo does not hold,
    all in one ``warm`` before the first kernel is yielded (compiling what no cache holds);
    they are then loaded one by one, each remembered as soon as it is loaded, so a failure
    part way leaves the kernels before it in the memo.
    """
    from mlpjit.jit import launcher
    from mlpjit.jit import manager as manager_module

    if manager is None:
        manager = manager_module.default_manager()
    record = config.record_file()
    keys = [(record, device, _identity(r)) for r in requests]
    with _lock:
        memo = _memo.get(manager)
        if memo is None:
            memo = _memo[manager] = {}
        found = [memo.get(key) for key in keys]
        _stats.asked += len(keys)
        _stats.hits += sum(kernel is not None for kernel in found)
    missing = [r for r, kernel in zip(requests, found, strict=True) if kernel is None]
    entries = iter(manager.warm(missing) if missing else ())
    for key, kernel in zip(keys, found, strict=True):
        if kernel is None:
            kernel = launcher.load_kernel(next(entries), device)
            with _lock:
                memo[key] = kernel
        yield kernel


def derived(manager: CompileManager | None = None) -> dict:
    """The dict where callers keep values made from this scope's loaded kernels (e.g. a
    layer signature's kernel pairs), under keys of their own: one dict per compile manager
    (``manager``, default ``default_manager()``; weakly) and MLPJIT_RECORD file, like the
    kernels themselves, so it never serves a kernel the memo would not; emptied by
    ``clear()``."""
    from mlpjit.jit import manager as manager_module

    if manager is None:
        manager = manager_module.default_manager()
    record = config.record_file()
    with _lock:
        scopes = _derived.get(manager)
        if scopes is None:
            scopes = _derived[manager] = {}
        found = scopes.get(record)
        if found is None:
            found = scopes[record] = {}
        return found


def stats() -> MemoStats:
    """A snapshot of the memo's counters in this process."""
    with _lock:
        return MemoStats(_stats.asked, _stats.hits)


def clear() -> None:
    """Forget every remembered kernel and reset the counters (tests)."""
    global _stats
    with _lock:
        _memo.clear()
        _derived.clear()
        _identities.clear()
        _stats = MemoStats()
