"""Benchmark: a cold fleet of 2 simulated nodes x 4 workers, with and without the Redis layer.

Each node is its own MLPJIT_CACHE_DIR; each worker is a process that gets the same 16
kernels the way CompileManager.warm does (a non-blocking pass from a per-worker offset,
then a blocking one), through mlpjit.jit.remote.get_with_remote: local lookup, local key
lock, then (with the layer) the remote fetch and cluster-wide lock, compile, publish, upload.

Compiles are REAL by default: the smoke kernel of mlpjit.testing.smoke, compiled with CuTe
DSL for sm_90a on the CPU (a small kernel: most of its cost is importing CuTe DSL once per
process). ``--fake-compile SECONDS`` instead sleeps that long and returns a hand-made
KernelBinary, to model kernels that take seconds to compile (fp8_gemv).

Scenarios: local (no remote), remote (cold Redis), fresh (a third node with an empty cache,
warm from Redis only). For each: wall seconds, compiles in total, CPU seconds of the
workers (getrusage of the children) and of redis-server (INFO cpu). It starts its own
redis-server (Debian's package, on PATH) on a free port of 127.0.0.1 in a temp dir.

    python3 scripts/bench_fleet_cache.py [--fake-compile 2.0] [--kernels 16] [--workers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ARCH = "sm_90a"


# ---------------------------------------------------------------------------- worker side


def _kernel(i: int, fake: float | None) -> tuple[dict[str, Any], Any]:
    """(key components, compile function) of kernel ``i``: real smoke, or a fake sleep."""
    params = {"n": 1024 + 32 * i, "scale": 2.0, "block": 128}
    if fake is None:
        from mlpjit.jit.key import key_components
        from mlpjit.testing.smoke import SPEC

        def compile_real():
            from mlpjit.testing.smoke import compile_cubin

            t0 = time.perf_counter()
            binary = compile_cubin(SPEC.make_params(params), ARCH)
            return binary, time.perf_counter() - t0

        return key_components(SPEC, params, ARCH), compile_real
    from mlpjit.jit.binary import KernelBinary, KernelParam
    from mlpjit.jit.key import FORMAT_VERSION

    components = {
        "format": FORMAT_VERSION,
        "kernel": "fake",
        "source": "0" * 64,
        "params": params,
        "arch": ARCH,
        "toolchain": {},
    }

    def compile_fake():
        time.sleep(fake)
        binary = KernelBinary(
            os.urandom(4096),
            f"fake_{i}",
            (8, 1, 1),
            (128, 1, 1),
            0,
            True,
            (KernelParam("out", "ptr"), KernelParam("x", "ptr")),
        )
        return binary, fake

    return components, compile_fake


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Get every kernel (two passes, like CompileManager.warm); count the compiles."""
    from mlpjit.jit.key import cache_key
    from mlpjit.jit.remote import RemoteCache, RemoteLayer, get_with_remote
    from mlpjit.jit.store import CacheStore

    store = CacheStore(root=Path(spec["cache_dir"]), layers=())
    layer = RemoteLayer(store, RemoteCache(spec["url"])) if spec["url"] else None
    count, compiles = spec["kernels"], [0]
    kernels = [_kernel(i, spec["fake"]) for i in range(count)]

    def counted(compile_fn):
        def run():
            compiles[0] += 1
            return compile_fn()

        return run

    order = [(spec["offset"] + j) % count for j in range(count)]
    done: set[int] = set()
    for blocking in (False, True):
        for i in order:
            if i in done:
                continue
            components, compile_fn = kernels[i]
            entry = get_with_remote(
                store,
                layer,
                cache_key(components),
                components,
                counted(compile_fn),
                blocking=blocking,
            )
            if entry is not None:
                done.add(i)
    return {"compiles": compiles[0], "cutlass": "cutlass" in sys.modules}


# ---------------------------------------------------------------------------- driver side


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    """redis-server on a free port of 127.0.0.1 without persistence; (process, URL)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH: apt-get install -y redis-server")
    import redis

    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            str(workdir / "redis.log"),
        ],
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            client.ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"redis-server did not start; see {workdir / 'redis.log'}")


def redis_cpu(url: str) -> float:
    """CPU seconds redis-server has used so far."""
    import redis

    info = redis.Redis.from_url(url).info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_fleet(nodes: list[Path], workers: int, url: str | None, args) -> dict[str, Any]:
    """Start ``workers`` processes on each node at once; wall, compiles and CPU seconds."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cpu0, redis0, t0 = _children_cpu(), redis_cpu(args.redis_url), time.perf_counter()
    procs = []
    total = len(nodes) * workers
    for n, cache_dir in enumerate(nodes):
        for w in range(workers):
            spec = {
                "cache_dir": str(cache_dir),
                "url": url,
                "kernels": args.kernels,
                "fake": args.fake_compile,
                "offset": (n * workers + w) * args.kernels // total,
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", json.dumps(spec)],
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
    results = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"a worker failed (exit {proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "wall_s": round(time.perf_counter() - t0, 2),
        "compiles": sum(r["compiles"] for r in results),
        "workers_cpu_s": round(_children_cpu() - cpu0, 2),
        "redis_cpu_s": round(redis_cpu(args.redis_url) - redis0, 3),
        "imported_cutlass": sum(r["cutlass"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fake-compile",
        type=float,
        default=None,
        metavar="SECONDS",
        help="sleep this long per compile instead of compiling the smoke kernel",
    )
    parser.add_argument("--kernels", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4, help="worker processes per node")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="mlpjit-bench-fleet-") as tmp:
        root = Path(tmp)
        proc, args.redis_url = start_redis(root)
        try:
            rows = {
                "local (no remote)": run_fleet(
                    [root / "l0", root / "l1"], args.workers, None, args
                ),
                "remote, cold Redis": run_fleet(
                    [root / "r0", root / "r1"], args.workers, args.redis_url, args
                ),
                "fresh node from Redis": run_fleet(
                    [root / "r2"], args.workers, args.redis_url, args
                ),
            }
        finally:
            proc.kill()
            proc.wait()
    what = (
        f"fake compile of {args.fake_compile} s"
        if args.fake_compile is not None
        else f"real smoke kernel compiles (CuTe DSL, {ARCH}, on the CPU)"
    )
    print(
        f"{args.kernels} kernels, {args.workers} workers per node; {what}; {os.cpu_count()} CPUs\n"
    )
    print(
        "| scenario | nodes x workers | wall s | compiles | workers CPU s | redis CPU s "
        "| workers importing CuTe DSL |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        nodes = 1 if name.startswith("fresh") else 2
        print(
            f"| {name} | {nodes} x {args.workers} | {row['wall_s']} | {row['compiles']} | "
            f"{row['workers_cpu_s']} | {row['redis_cpu_s']} | {row['imported_cutlass']} |"
        )


if __name__ == "__main__":
    main()
