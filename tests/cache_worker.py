"""A worker process for the multi-process cache tests (run as a script, not collected).

argv[1] is a JSON spec:
  {"count": 16, "first": 0, "arch": "sm_90a", "mode": "warm" | "get",
   "rounds": 1,                      # repeat with a fresh manager each round
   "hold_file": null, "hold_seconds": 0,
   "lock_timeout": null}
Test hook (this file only, never in mlpjit): with "hold_file", the smoke kernel's compile
touches that file after compiling, then sleeps hold_seconds; the test can kill -9 the process
while it holds the key lock.
It prints one JSON line: stats (summed over rounds), sha256 per key, persisted flags, and
whether cutlass got imported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time


def main() -> None:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import mlpjit.testing.smoke as smoke  # registers the smoke kernel
    from mlpjit.jit.manager import CompileManager
    from mlpjit.jit.spec import KernelRequest

    hold_file = spec.get("hold_file")
    if hold_file:
        real = smoke.compile_cubin

        def slow_compile(params, arch):
            binary = real(params, arch)
            with open(hold_file, "w") as f:
                f.write("compiled\n")
            time.sleep(float(spec.get("hold_seconds", 60)))
            return binary

        smoke.compile_cubin = slow_compile

    first, count = int(spec.get("first", 0)), int(spec.get("count", 1))
    requests = [
        KernelRequest("smoke", {"n": 1024 + 32 * i, "scale": 2.0, "block": 128}, spec["arch"])
        for i in range(first, first + count)
    ]
    totals: dict[str, float] = {}
    shas: dict[str, str] = {}
    persisted: dict[str, bool] = {}
    for _ in range(int(spec.get("rounds", 1))):
        manager = CompileManager(lock_timeout=spec.get("lock_timeout"))
        if spec.get("mode", "warm") == "warm":
            entries = manager.warm(requests)
        else:
            entries = [manager.get(r) for r in requests]
        for entry in entries:
            digest = hashlib.sha256(entry.cubin).hexdigest()
            if shas.setdefault(entry.key, digest) != digest:
                raise SystemExit(f"different bytes for {entry.key} across rounds")
            persisted[entry.key] = entry.persisted
        for name, value in vars(manager.stats).items():
            totals[name] = totals.get(name, 0) + value
    out = {
        "stats": totals,
        "sha": shas,
        "persisted": persisted,
        "cutlass_loaded": "cutlass" in sys.modules,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
