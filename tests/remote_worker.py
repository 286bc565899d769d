"""A worker process for the fleet tests of test_remote_fleet.py (run as a script, not collected).

The node is its environment: MLPJIT_CACHE_DIR (one per simulated node) and MLPJIT_REMOTE_CACHE
/ MLPJIT_REMOTE_PREFIX, read by mlpjit's own default_manager(). argv[1] is a JSON spec:
  {"node": 0, "markers": "/dir", "count": 16, "threads": 1, "arch": "sm_90a",
   "compile_pause": 0.0}
Each thread warms the same ``count`` smoke kernels (mlpjit.testing.smoke, real CuTe DSL
compiles) through that one manager. Test hook (this file only, never in mlpjit): the smoke
kernel's compile writes one marker file per compile, "<node>.<n>.<pid>.<thread>.<ns>" (the
test counts them), then sleeps ``compile_pause`` seconds with the key's locks held.
It prints one JSON line: the cubin sha256 per key, the manager's stats, the remote's stats
(None without one) and whether cutlass got imported.

Also home to the hand-made entries of test_remote.py (no registry or compiler needed).
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
from mlpjit.jit.key import FORMAT_VERSION


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


def _count_compiles(node: int, markers: Path, pause: float) -> None:
    """Wrap the smoke kernel's compile_cubin: a marker file per compile, then a pause."""
    import mlpjit.testing.smoke as smoke

    real = smoke.compile_cubin

    def counted(params: Any, arch: str) -> KernelBinary:
        binary = real(params, arch)
        name = f"{node}.{params.n}.{os.getpid()}.{threading.get_ident()}.{time.time_ns()}"
        (markers / name).write_text("compiled\n")
        time.sleep(pause)
        return binary

    smoke.compile_cubin = counted


def main() -> None:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from mlpjit.jit.manager import default_manager
    from mlpjit.jit.spec import KernelRequest

    _count_compiles(int(spec["node"]), Path(spec["markers"]), float(spec.get("compile_pause", 0)))
    requests = [
        KernelRequest("smoke", {"n": 1024 + 32 * i, "scale": 2.0, "block": 128}, spec["arch"])
        for i in range(int(spec["count"]))
    ]
    manager = default_manager()
    shas: dict[str, str] = {}
    errors: list[str] = []
    mutex = threading.Lock()

    def work(thread: int) -> None:
        try:
            for entry in manager.warm(requests):
                digest = hashlib.sha256(entry.cubin).hexdigest()
                with mutex:
                    if shas.setdefault(entry.key, digest) != digest:
                        errors.append(f"different cubins for key {entry.key} in one process")
        except BaseException as err:  # reported below: a thread cannot fail the process
            errors.append(f"thread {thread}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(int(spec["threads"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit("; ".join(errors))
    remote = None if manager.remote is None else vars(manager.remote.remote.stats)
    out = {
        "sha": shas,
        "stats": vars(manager.stats),
        "remote": remote,
        "cutlass_loaded": "cutlass" in sys.modules,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
