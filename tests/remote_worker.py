"""A worker process for the fleet tests of test_remote.py (run as a script, not collected).

argv[1] is a JSON spec:
  {"url": "redis://...", "prefix": "t:", "cache_dir": "/node/cache", "markers": "/dir",
   "count": 16, "threads": 2, "offset": 0, "compile_seconds": 0.05, "lock_ttl": 30,
   "remote": true}
Each thread gets the ``count`` hand-made keys in two passes, as CompileManager.warm does:
first without blocking, starting at offset + thread (skipping keys another worker compiles),
then blocking. Keys go through remote.get_with_remote, the order the manager follows. The
fake compile writes one marker file per compile (the test counts them), sleeps, and returns
a KernelBinary with random cubin bytes, so two compiles of one key never look alike.
It prints one JSON line: the cubin sha256 per key and the remote stats.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mlpjit.jit.binary import KernelBinary, KernelParam
from mlpjit.jit.key import FORMAT_VERSION, cache_key
from mlpjit.jit.remote import RemoteCache, RemoteLayer, get_with_remote
from mlpjit.jit.store import CacheStore


def components(i: int, arch: str = "sm_90a") -> dict[str, Any]:
    """Key components of hand-made kernel number ``i`` (no registry or compiler needed)."""
    return {
        "format": FORMAT_VERSION,
        "kernel": "smoke",
        "source": "5" * 64,
        "params": {"n": 1024 + 32 * i},
        "arch": arch,
        "toolchain": {"nvidia-cutlass-dsl": "4.8.1"},
    }


def fake_binary(i: int) -> KernelBinary:
    """A KernelBinary for kernel ``i`` with random cubin bytes (every launch field set)."""
    return KernelBinary(
        cubin=b"\x7fELF" + os.urandom(256),
        symbol=f"kernel_{i}",
        grid=(8, 2, 1),
        block=(128, 1, 1),
        smem_bytes=4096,
        pdl=True,
        params=(KernelParam("out", "ptr"), KernelParam("x", "ptr")),
        cluster=(2, 1, 1),
    )


def main() -> None:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    store = CacheStore(root=Path(spec["cache_dir"]), layers=())
    remote = None
    if spec.get("remote", True):
        remote = RemoteCache(
            spec["url"], prefix=spec["prefix"], lock_ttl=float(spec.get("lock_ttl", 30))
        )
    layer = None if remote is None else RemoteLayer(store, remote)
    markers = Path(spec["markers"])
    count, pause = int(spec["count"]), float(spec.get("compile_seconds", 0.05))
    comps = [components(i) for i in range(count)]
    keys = [cache_key(c) for c in comps]
    shas: dict[str, str] = {}
    mutex = threading.Lock()

    def compile_fn(i: int, thread: int):
        def run() -> tuple[KernelBinary, float]:
            name = f"{keys[i]}.{os.getpid()}.{thread}.{time.time_ns()}"
            (markers / name).write_text("compiled\n")
            time.sleep(pause)
            return fake_binary(i), pause

        return run

    def work(thread: int) -> None:
        start = int(spec.get("offset", 0)) + thread
        order = [(start + j) % count for j in range(count)]
        done: set[int] = set()
        for blocking in (False, True):
            for i in order:
                if i in done:
                    continue
                entry = get_with_remote(
                    store, layer, keys[i], comps[i], compile_fn(i, thread), blocking=blocking
                )
                if entry is not None:
                    done.add(i)
                    digest = hashlib.sha256(entry.cubin).hexdigest()
                    with mutex:
                        if shas.setdefault(keys[i], digest) != digest:
                            errors.append(f"different cubins for key {keys[i]} in one process")

    def guarded(thread: int) -> None:
        try:
            work(thread)
        except BaseException as err:  # reported below: a thread cannot fail the process
            errors.append(f"thread {thread}: {type(err).__name__}: {err}")

    errors: list[str] = []
    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(int(spec["threads"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit("; ".join(errors))
    stats = None if remote is None else vars(remote.stats)
    print(json.dumps({"sha": shas, "stats": stats}), flush=True)


if __name__ == "__main__":
    main()
