"""The compile-cache benchmark behind scripts/bench_compile_cache.py (its docstring: what it
compares and how to run it): the worker processes (this module run with ``--worker``), the
driver that starts them, and the report of a result.

Run as a worker (``python -m mlpjit.bench.compile_cache_bench --worker ...``), a process has
imported only the standard library and the packages mlpjit and mlpjit.bench (two module
docstrings) when its clock starts: ``import mlpjit.jit.manager`` and the rest are timed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The checkout (the scripts run from one: pip install -e .): --out's default is in it.
REPO = Path(__file__).resolve().parents[2]
ARCH = "sm_90a"


def _params(i: int) -> dict:
    return {"n": 1024 + 32 * i, "scale": 2.0, "block": 128}


def _requests(kernel: str, count: int) -> list:
    """``count`` distinct requests: smoke kernels, or the GLM-5 TP8 DenseMlp kernels."""
    from mlpjit.jit.spec import KernelRequest

    if kernel == "smoke":
        import mlpjit.testing.smoke  # noqa: F401  (registers the smoke kernel)

        return [KernelRequest("smoke", _params(i), ARCH) for i in range(count)]
    from mlpjit.layer_plan import dense_mlp_requests
    from mlpjit.models import MODELS

    hidden, inter = MODELS["glm5"]
    found = dense_mlp_requests(hidden, inter, 8, range(1, 9), ARCH)
    if count > len(found):
        raise SystemExit(f"--kernels must be <= {len(found)} with --kernel fp8_gemv")
    return found[:count]


# ---------------------------------------------------------------------------- worker side


def worker_mlpjit(kernel: str, count: int) -> dict:
    t0 = time.perf_counter()
    from mlpjit.jit.manager import CompileManager

    t1 = time.perf_counter()
    manager = CompileManager()
    manager.warm(_requests(kernel, count))
    ready = time.perf_counter() - t0
    stats = vars(manager.stats)
    return {
        "ready_s": ready,
        "after_import_s": time.perf_counter() - t1,
        "compiles": stats["compiles"],
        "stats": stats,
        "cutlass_imported": "cutlass" in sys.modules,
    }


def worker_baseline(kernel: str, count: int) -> dict:
    t0 = time.perf_counter()
    if kernel == "fp8_gemv":
        # compile_cubin is one cute.compile of the kernel for fake tensors, with no cache
        from mlpjit.kernels.fp8_gemv.kernel import compile_cubin

        for request in _requests(kernel, count):
            compile_cubin(request.spec.make_params(request.params), ARCH)
        return {"ready_s": time.perf_counter() - t0, "compiles": count}
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    from mlpjit.testing.smoke import program

    launch = program()  # the same @cute.jit program mlpjit compiles
    for i in range(count):
        p = _params(i)
        out = make_fake_compact_tensor(cutlass.Float32, (p["n"],), assumed_align=16)
        x = make_fake_compact_tensor(cutlass.Float32, (p["n"],), assumed_align=16)
        cute.compile(
            launch,
            out,
            x,
            make_fake_stream(),
            p["scale"],
            p["n"],
            p["block"],
            options=f"--gpu-arch {ARCH}",
        )
    return {"ready_s": time.perf_counter() - t0, "compiles": count}


# ---------------------------------------------------------------------------- driver side


def _spawn(kind: str, kernel: str, count: int, env: dict) -> subprocess.Popen:
    worker = [sys.executable, "-m", __name__, "--worker", kind]
    return subprocess.Popen(
        [*worker, "--kernel", kernel, "--kernels", str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )


def run_group(kind: str, kernel: str, workers: int, count: int, env: dict) -> dict:
    """Start ``workers`` processes at once; wall time, CPU seconds of children, results."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    procs = [_spawn(kind, kernel, count, env) for _ in range(workers)]
    outs = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{kind} worker failed:\n{err[-3000:]}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "workers": workers,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "compiles": sum(o["compiles"] for o in outs),
        "per_worker": outs,
    }


def _env(**extra: str) -> dict:
    """This environment without MLPJIT_* and CUTE_DSL_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLPJIT_", "CUTE_DSL_"))}
    env.update(extra)
    return env


def report(result: dict) -> str:
    """The markdown table and the warm-start line of one result (as docs/BENCHMARKS.md has)."""
    kernel, k, ws = result.get("kernel", "smoke"), result["kernels"], result["warm_start"]
    cpus = result.get("machine", {}).get("cpus", "?")
    lines = [
        f"Cold cache, {k} {kernel} kernels for {result['arch']}, {cpus} CPU cores:",
        "",
        "| W | mlpjit wall s | mlpjit compiles | mlpjit CPU s "
        "| cute.compile wall s | cute.compile compiles | cute.compile CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        m, b = r["mlpjit"], r["baseline"]
        lines.append(
            f"| {r['workers']} | {m['wall_s']:.2f} | {m['compiles']} | {m['cpu_s']:.1f} "
            f"| {b['wall_s']:.2f} | {b['compiles']} | {b['cpu_s']:.1f} |"
        )
    repeats = f" (median of {result['warm_repeats']})" if "warm_repeats" in result else ""
    lines += [
        "",
        f"Warm start of a fresh process, all {k} ready{repeats}: mlpjit "
        f"{ws['mlpjit_ready_ms']:.1f} ms in-process including `import mlpjit` "
        f"({ws['mlpjit_after_import_ms']:.1f} ms of it after the import; "
        f"{ws['mlpjit_compiles']} compiles, cutlass imported: {ws['mlpjit_imports_cutlass']}; "
        f"{ws['mlpjit_process_wall_s']:.2f} s with interpreter start); cute.compile "
        f"{ws['baseline_ready_ms']:.0f} ms ({ws['baseline_process_wall_s']:.2f} s with "
        "interpreter start).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None, description: str | None = None) -> None:
    """Run the benchmark (or one --worker, or --plot-from's report). ``description``: the
    --help text (the script's docstring, first line shown)."""
    ap = argparse.ArgumentParser(description=(description or "").split("\n")[0] or None)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--kernel", choices=["smoke", "fp8_gemv"], default="smoke")
    ap.add_argument("--kernels", type=int, default=16)
    ap.add_argument("--warm-repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "compile_cache.json")
    ap.add_argument("--plot", type=Path, help="write a PNG of the results here (matplotlib)")
    ap.add_argument(
        "--plot-from",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="print the tables of earlier results (and --plot them together) instead of running",
    )
    ap.add_argument("--worker", choices=["mlpjit", "baseline"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.plot_from:
        for path in args.plot_from:
            if not path.is_file():
                ap.error(f"--plot-from: no such file {path}")
        results = [json.loads(path.read_text()) for path in args.plot_from]
        print("\n\n".join(report(result) for result in results))
        if args.plot is not None:
            from mlpjit.bench import plots

            plots.compile_cache(results, args.plot)
            print(f"\nplot: {args.plot}")
        return
    if args.worker:
        fn = worker_mlpjit if args.worker == "mlpjit" else worker_baseline
        print(json.dumps(fn(args.kernel, args.kernels)), flush=True)
        return

    rows = []
    with tempfile.TemporaryDirectory(prefix="mlpjit-bench-") as tmp:
        for w in args.workers:
            cache = Path(tmp) / f"cache-w{w}"
            mine = run_group(
                "mlpjit", args.kernel, w, args.kernels, _env(MLPJIT_CACHE_DIR=str(cache))
            )
            cute_cache = Path(tmp) / f"cute-cache-w{w}"
            cute_cache.mkdir()
            base = run_group(
                "baseline", args.kernel, w, args.kernels, _env(CUTE_DSL_CACHE_DIR=str(cute_cache))
            )
            base["cute_cache_files"] = sum(1 for p in cute_cache.rglob("*") if p.is_file())
            rows.append({"workers": w, "mlpjit": mine, "baseline": base})
            print(
                f"W={w}: mlpjit {mine['wall_s']:.1f} s / {mine['compiles']} compiles, "
                f"baseline {base['wall_s']:.1f} s / {base['compiles']} compiles",
                flush=True,
            )
        # Warm start: a fresh process, all kernels already in the cache built above.
        warm_env = _env(MLPJIT_CACHE_DIR=str(Path(tmp) / f"cache-w{args.workers[-1]}"))
        warm = [
            run_group("mlpjit", args.kernel, 1, args.kernels, warm_env)
            for _ in range(args.warm_repeats)
        ]
        cold = [run_group("baseline", args.kernel, 1, args.kernels, _env()) for _ in range(2)]

    def ready(groups: list, field: str = "ready_s") -> float:
        return statistics.median(g["per_worker"][0][field] for g in groups)

    warm_start = {
        "mlpjit_ready_ms": round(1000 * ready(warm), 2),
        "mlpjit_after_import_ms": round(1000 * ready(warm, "after_import_s"), 2),
        "mlpjit_process_wall_s": round(statistics.median(g["wall_s"] for g in warm), 3),
        "mlpjit_compiles": sum(g["compiles"] for g in warm),
        "mlpjit_imports_cutlass": any(g["per_worker"][0]["cutlass_imported"] for g in warm),
        "baseline_ready_ms": round(1000 * ready(cold), 2),
        "baseline_process_wall_s": round(statistics.median(g["wall_s"] for g in cold), 3),
    }
    result = {
        "kernel": args.kernel,
        "kernels": args.kernels,
        "arch": ARCH,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "rows": rows,
        "warm_start": warm_start,
        "warm_repeats": args.warm_repeats,
        "command": "python3 scripts/bench_compile_cache.py " + " ".join(sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot is not None:
        from mlpjit.bench import plots

        plots.compile_cache([result], args.plot)

    print()
    print(report(result))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
