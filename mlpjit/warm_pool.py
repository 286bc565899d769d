"""`mlpjit warm`'s engine: fill the compile cache from a list of kernel requests, in this
process or in a pool of worker processes.

    records = warm_in_process(requests)          # one progress line per kernel to stderr
    records = warm_in_workers(requests, jobs=4)  # 4 processes over the same list

``warm_in_workers`` starts ``jobs`` worker processes (multiprocessing's "spawn": no forked
CUDA or lock state) and hands each the whole list as request lines (the MLPJIT_RECORD
format): every worker walks it, and the cache's per-key try-locks make each missing kernel
compile in exactly one of them while the others move on to the next, so N workers compile
a long list about N times as fast (CuTe DSL compiles one kernel at a time per process).
Workers print their progress to the inherited stderr and return their records as objects,
merged here by key; an error a worker raises comes back as the exception itself.

A record is plain JSON data (``WarmRecord``), in the order of the request list. Standard
library only at import; the compile manager is imported when work starts.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, TextIO, TypedDict

from mlpjit.errors import MlpjitError
from mlpjit.jit.key import request_key

if TYPE_CHECKING:
    from mlpjit.jit.spec import KernelRequest

__all__ = ["WarmRecord", "warm_in_process", "warm_in_workers"]


class WarmRecord(TypedDict):
    """What warming one request did (an entry of `mlpjit warm --json`'s "entries")."""

    key: str  # the full cache key
    kernel: str
    params: dict[str, Any]
    status: str  # "compiled" (by this process, or by one of the workers) or "hit"
    seconds: float  # wall time of this kernel's step: its compile when compiled
    compiles: int  # processes that compiled it: 0 for a hit, 1 with single flight


def warm_in_process(
    requests: Sequence[KernelRequest], *, worker_id: int | None = None, log: TextIO | None = None
) -> list[WarmRecord]:
    """Compile (or hit) every request through a CompileManager in this process.

    Writes one progress line per kernel to ``log`` (default: stderr), prefixed "w<N> " for
    a pool worker (``worker_id``). Raises what the manager raises (e.g. a compile error).
    """
    from mlpjit.jit.manager import CompileManager, remote_tier
    from mlpjit.jit.store import CacheStore

    out = sys.stderr if log is None else log
    keys = [request_key(r) for r in requests]
    position = {id(r): i for i, r in enumerate(requests)}
    store = CacheStore()
    # The fleet cache too, when MLPJIT_REMOTE_CACHE is set: a warm pulls what another node
    # compiled and uploads what it compiles.
    manager = CompileManager(store, remote=remote_tier(store))
    records: list[WarmRecord] = []
    prefix = f"w{worker_id} " if worker_id is not None else ""
    state = {"t": time.perf_counter(), "compiles": 0}

    def progress(done: int, total: int, request: KernelRequest) -> None:
        now, compiles = time.perf_counter(), manager.stats.compiles
        compiled = compiles > state["compiles"]
        seconds = now - state["t"]
        state.update(t=now, compiles=compiles)
        i = position.get(id(request), 0)
        status = "compiled" if compiled else "hit"
        records.append(
            {
                "key": keys[i],
                "kernel": request.kernel,
                "params": dict(request.params),
                "status": status,
                "seconds": round(seconds, 4),
                "compiles": int(compiled),
            }
        )
        print(
            f"{prefix}[{done}/{total}] {request.kernel} {keys[i][:12]} {status} {seconds:.2f}s",
            file=out,
            flush=True,
        )

    manager.warm(requests, progress=progress)
    order = {key: i for i, key in enumerate(keys)}
    return sorted(records, key=lambda r: order[r["key"]])


def _worker(lines: list[str], worker_id: int) -> list[WarmRecord]:
    """A pool worker: register the kernels (this is a fresh interpreter), then warm the
    list in process."""
    from mlpjit.jit.spec import KernelRequest
    from mlpjit.planning import register_kernels

    register_kernels()
    requests = [KernelRequest.from_json_line(line) for line in lines]
    return warm_in_process(requests, worker_id=worker_id)


def warm_in_workers(requests: Sequence[KernelRequest], jobs: int) -> list[WarmRecord]:
    """Warm ``requests`` with ``jobs`` worker processes over the same list (see the module
    docstring); one record per distinct key, in request order, "compiles" summed over the
    workers.

    Raises MlpjitError naming every worker that failed with one of mlpjit's errors (a
    compile error, an unusable cache dir) or died; any other exception a worker raised is
    re-raised as is (a bug: its traceback matters).
    """
    lines = [r.to_json_line() for r in requests]
    context = multiprocessing.get_context("spawn")
    results: list[list[WarmRecord] | BaseException] = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_worker, lines, w) for w in range(jobs)]
        for future in futures:
            try:
                results.append(future.result())
            except BaseException as err:  # noqa: BLE001 (sorted out below, per worker)
                results.append(err)
    return _merge(results, [request_key(r) for r in requests])


def _merge(
    results: Sequence[list[WarmRecord] | BaseException], keys: list[str]
) -> list[WarmRecord]:
    """One record per key from every worker's records; errors raised as described in
    warm_in_workers."""
    merged: dict[str, WarmRecord] = {}
    failed = []
    for w, result in enumerate(results):
        if isinstance(result, BrokenProcessPool):
            failed.append(f"worker {w} died ({result})")
        elif isinstance(result, MlpjitError):
            failed.append(f"worker {w}: {result}")
        elif isinstance(result, BaseException):
            raise result
        else:
            for record in result:
                seen = merged.setdefault(record["key"], {**record, "compiles": 0})
                if record["status"] == "compiled":
                    seen["compiles"] += 1
                    seen["status"] = "compiled"
                    seen["seconds"] = record["seconds"]
    if failed:
        raise MlpjitError("warm failed: " + "; ".join(failed))
    order = {key: i for i, key in enumerate(keys)}
    return sorted(merged.values(), key=lambda r: order.get(r["key"], len(order)))
