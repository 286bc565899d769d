"""`mlpjit warm`'s engine: fill the compile cache from a list of kernel requests, in this
process or in a pool of worker processes.

    records = warm_in_process(requests)          # one progress line per kernel to stderr
    records = warm_in_workers(requests, jobs=4)  # 4 processes over the same list

``warm_in_workers`` writes the list once to a private request file (JSON lines, the
MLPJIT_RECORD format) and starts ``jobs`` workers, each ``python -m mlpjit warm --from FILE
--json --worker-id N``: every worker walks the whole list, and the cache's per-key
try-locks make each missing kernel compile in exactly one of them while the others move on
to the next, so N workers compile a long list about N times as fast (CuTe DSL compiles one
kernel at a time per process). Workers print their progress to the inherited stderr and a
JSON summary on stdout, which is merged here by key.

A record is plain JSON data (``WarmRecord``), in the order of the request list. Standard
library only at import; the compile manager is imported when work starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypedDict

from mlpjit.errors import MlpjitError
from mlpjit.jit.key import request_key

if TYPE_CHECKING:
    from mlpjit.jit.spec import KernelRequest

__all__ = ["WarmRecord", "warm_in_process", "warm_in_workers", "worker_command"]


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
    from mlpjit.jit.manager import CompileManager, remote_layer
    from mlpjit.jit.store import CacheStore

    out = sys.stderr if log is None else log
    keys = [request_key(r) for r in requests]
    position = {id(r): i for i, r in enumerate(requests)}
    store = CacheStore()
    # The fleet cache too, when MLPJIT_REMOTE_CACHE is set: a warm pulls what another node
    # compiled and uploads what it compiles.
    manager = CompileManager(store, remote=remote_layer(store))
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


def worker_command(requests_file: Path, worker: int) -> list[str]:
    """The command line of pool worker number ``worker`` over the list in ``requests_file``."""
    return [
        sys.executable,
        "-m",
        "mlpjit",
        "warm",
        "--from",
        str(requests_file),
        "--json",
        "--worker-id",
        str(worker),
    ]


def warm_in_workers(requests: Sequence[KernelRequest], jobs: int) -> list[WarmRecord]:
    """Warm ``requests`` with ``jobs`` worker processes over the same list (see the module
    docstring); one record per distinct key, "compiles" summed over the workers.

    Raises MlpjitError naming every worker that failed (a non-zero exit status, e.g. a
    compile error it printed to stderr, or no JSON summary).
    """
    fd, name = tempfile.mkstemp(prefix="mlpjit-warm-", suffix=".jsonl")  # mode 0600
    path = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(r.to_json_line() + "\n" for r in requests)
        procs = [
            subprocess.Popen(worker_command(path, w), stdout=subprocess.PIPE, text=True)
            for w in range(jobs)
        ]
        outputs = [proc.communicate()[0] for proc in procs]
    finally:
        path.unlink(missing_ok=True)
    merged: dict[str, WarmRecord] = {}
    failed = []
    for w, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        if proc.returncode != 0:
            failed.append(f"worker {w} exited with status {proc.returncode}")
            continue
        try:
            records = json.loads(out)["entries"]
        except (ValueError, KeyError, TypeError):
            failed.append(f"worker {w} printed no summary (output ends: {out[-200:]!r})")
            continue
        for record in records:
            seen = merged.setdefault(record["key"], {**record, "compiles": 0})
            if record["status"] == "compiled":
                seen["compiles"] += 1
                seen["status"] = "compiled"
                seen["seconds"] = record["seconds"]
    if failed:
        raise MlpjitError("warm failed: " + "; ".join(failed))
    return list(merged.values())
