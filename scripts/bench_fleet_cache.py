"""Benchmark: a cold fleet of 2 simulated nodes x 4 workers, with and without the Redis layer.

Each node is its own MLPJIT_CACHE_DIR; each worker is a process that warms the same 16
kernels through mlpjit's own default_manager(), configured like a server's by its
environment (MLPJIT_CACHE_DIR, and with the layer MLPJIT_REMOTE_CACHE and the fleet's
MLPJIT_REMOTE_KEY_FILE, so entries are signed and checked; --unsigned leaves the key file
out): CompileManager.warm
(a non-blocking pass from a per-process offset, then a blocking one), each miss going local
lookup, local key lock, then (with the layer) the remote fetch and cluster-wide lock,
compile, publish, upload.

Compiles are REAL by default: the smoke kernel of mlpjit.testing.smoke, compiled with CuTe
DSL for sm_90a on the CPU (a small kernel: most of its cost is importing CuTe DSL once per
process). ``--fake-compile SECONDS`` instead makes the smoke kernel's compile sleep that
long and return a hand-made KernelBinary (a hook in this script's workers only), to model
kernels that take seconds to compile (fp8_gemv).

Scenarios: local (no remote), remote (cold Redis), fresh (a third node with an empty cache,
warm from Redis only). For each: wall seconds, compiles in total, entries fetched from
Redis, CPU seconds of the workers (getrusage of the children) and of redis-server (INFO
cpu). It starts its own redis-server (Debian's package, on PATH) on a free port of
127.0.0.1 in a temp dir.

    python3 scripts/bench_fleet_cache.py [--fake-compile 2.0] [--kernels 16] [--workers 4]
                                         [--unsigned]
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


def _fake_compiles(seconds: float) -> None:
    """Make the smoke kernel's compile sleep ``seconds`` and return random cubin bytes."""
    import mlpjit.testing.smoke as smoke
    from mlpjit.jit.binary import KernelBinary

    def compile_fake(params: Any, arch: str) -> KernelBinary:
        time.sleep(seconds)
        grid = ((params.n + params.block - 1) // params.block, 1, 1)
        return KernelBinary(
            os.urandom(4096), f"fake_{params.n}", grid, (params.block, 1, 1), 0, True, smoke.PARAMS
        )

    smoke.compile_cubin = compile_fake


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Warm every kernel through default_manager() (MLPJIT_* set by the driver)."""
    import mlpjit.testing.smoke  # noqa: F401  (registers the smoke kernel)
    from mlpjit.jit.manager import default_manager
    from mlpjit.jit.spec import KernelRequest

    if spec["fake"] is not None:
        _fake_compiles(spec["fake"])
    requests = [
        KernelRequest("smoke", {"n": 1024 + 32 * i, "scale": 2.0, "block": 128}, ARCH)
        for i in range(spec["kernels"])
    ]
    manager = default_manager()
    manager.warm(requests)
    stats = manager.stats
    return {
        "compiles": stats.compiles,
        "remote_hits": stats.remote_hits,
        "uploads": stats.uploads,
        "remote": manager.remote is not None,
        "cutlass": "cutlass" in sys.modules,
    }


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


def write_key_file(path: Path) -> Path:
    """The fleet's key file, made as docs/SERVER.md says (32 random bytes, mode 0400)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
    return path


def _node_env(cache_dir: Path, url: str | None, key_file: Path | None) -> dict[str, str]:
    """A worker's environment: its node's cache dir and, with the layer, the Redis URL and
    the fleet's key file (None: unsigned)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLPJIT_")}
    env.update(PYTHONPATH=str(REPO), MLPJIT_CACHE_DIR=str(cache_dir))
    if url is not None:
        env["MLPJIT_REMOTE_CACHE"] = url
        if key_file is not None:
            env["MLPJIT_REMOTE_KEY_FILE"] = str(key_file)
    return env


def run_fleet(nodes: list[Path], workers: int, url: str | None, args) -> dict[str, Any]:
    """Start ``workers`` processes on each node at once; wall, compiles and CPU seconds."""
    cpu0, redis0, t0 = _children_cpu(), redis_cpu(args.redis_url), time.perf_counter()
    procs = []
    spec = {"kernels": args.kernels, "fake": args.fake_compile}
    for cache_dir in nodes:
        env = _node_env(cache_dir, url, args.key_file)
        for _ in range(workers):
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
    if any(r["remote"] != (url is not None) for r in results):
        raise SystemExit("a worker's manager did not have the remote layer it was given")
    return {
        "wall_s": round(time.perf_counter() - t0, 2),
        "compiles": sum(r["compiles"] for r in results),
        "remote_hits": sum(r["remote_hits"] for r in results),
        "uploads": sum(r["uploads"] for r in results),
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
    parser.add_argument(
        "--unsigned",
        action="store_true",
        help="no MLPJIT_REMOTE_KEY_FILE: remote entries are integrity-checked only",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="mlpjit-bench-fleet-") as tmp:
        root = Path(tmp)
        args.key_file = None if args.unsigned else write_key_file(root / "fleet.key")
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
    signing = "unsigned" if args.unsigned else "signed entries (MLPJIT_REMOTE_KEY_FILE)"
    print(
        f"{args.kernels} kernels, {args.workers} workers per node; {what}; {signing}; "
        f"{os.cpu_count()} CPUs\n"
    )
    print(
        "| scenario | nodes x workers | wall s | compiles | remote hits | uploads "
        "| workers CPU s | redis CPU s | workers importing CuTe DSL |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        nodes = 1 if name.startswith("fresh") else 2
        print(
            f"| {name} | {nodes} x {args.workers} | {row['wall_s']} | {row['compiles']} | "
            f"{row['remote_hits']} | {row['uploads']} | {row['workers_cpu_s']} | "
            f"{row['redis_cpu_s']} | {row['imported_cutlass']} |"
        )


if __name__ == "__main__":
    main()
