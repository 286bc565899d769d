"""The start-up benchmark behind scripts/bench_startup.py (its docstring: what each worker
measures and how to run it): the presets' layer lists, the spawned workers, the report and
the plots of stored reports.

This module's top imports no torch and nothing of mlpjit that does: a spawned worker
re-imports it (its worker function ``_worker`` pickles by this module's name), so the
worker's import time is its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlpjit.bench.cli_args import positive_int, token_list
from mlpjit.models import PRESET_NAMES, get_preset
from mlpjit.testing.layers import dense_shard

# Preset -> (dense MLP layers, MoE layers with one shared expert each), from each model's
# config.json: num_hidden_layers and first_k_dense_replace (MTP layers left out).
LAYER_COUNTS: dict[str, tuple[int, int]] = {
    "glm5": (3, 75),
    "glm4.5": (3, 89),
    "deepseek-v3": (3, 58),
    "qwen3-8b": (36, 0),
    "qwen3-14b": (40, 0),
    "qwen3-32b": (64, 0),
}
DEFAULT_TOKENS = "1-8"
EAGER_TOKENS = 1
# The goals of a GLM-5 TP 8 start-up, printed beside the numbers and drawn in --plot's
# panels (ms, ms and us: {worker count: goal}).
GOALS = (
    "goals: prepare <= 0.100 s (1 worker), <= 0.150 s (8 workers); construct <= 0.040 s; "
    "eager <= 12 us"
)
PLOT_GOALS = {
    "prepare_s": {1: 100.0, 8: 150.0},
    "construct_s": {1: 40.0, 8: 40.0},
    "eager_host_us": {1: 12.0, 8: 12.0},
}


def model_layers(model: str, tp: int) -> list[tuple[str, int, int]]:
    """(kind, hidden, intermediate shard) of each MLP of ``model`` at TP ``tp``, in model
    order: its dense MLP layers first, then the shared expert of each MoE layer."""
    preset = get_preset(model)
    dense, moe = LAYER_COUNTS[preset.name]
    layers = []
    for kind, count in (("dense", dense), ("shared", moe)):
        if count:
            hidden, inter = dense_shard(preset.name, tp, kind)
            layers += [(kind, hidden, inter)] * count
    return layers


def distinct_requests(layers: Sequence[tuple[str, int, int]], tokens: Sequence[int], arch: str):
    """The distinct compile requests of ``layers`` (what one worker loads once each)."""
    from mlpjit.dense_mlp import kernel_requests

    found = {}
    for hidden, inter in dict.fromkeys((h, i) for _, h, i in layers):
        for r in kernel_requests(hidden, inter, tokens, arch, limit=None, ue8m0=True):
            found.setdefault(r.to_json_line(), r)
    return list(found.values())


# --------------------------------------------------------------------- worker side


def _host_us(call: Callable[[], object], calls: int, warmup: int, sync: Callable[[], None]):
    """Median microseconds until ``call()`` returns, over ``calls`` calls timed one by one;
    synchronized before and after the loop only (the GPU drains between warm-up batches)."""
    for start in range(0, warmup, calls):
        for _ in range(min(calls, warmup - start)):
            call()
        sync()
    times = []
    clock = time.perf_counter
    for _ in range(calls):
        t0 = clock()
        call()
        times.append(clock() - t0)
    sync()
    return round(statistics.median(times) * 1e6, 2)


def _device(torch: Any, rank: int) -> Any:
    """Worker ``rank``'s GPU (round robin over the visible ones), made current."""
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def _worker_body(rank: int, opts: dict, barrier: Any) -> dict:
    t0 = time.perf_counter()
    import torch

    from mlpjit.dense_mlp import DenseMlp
    from mlpjit.jit import launcher
    from mlpjit.jit.manager import default_manager
    from mlpjit.testing.layers import random_fp8_layer

    result: dict[str, Any] = {"worker": rank, "pid": os.getpid()}
    result["import_s"] = round(time.perf_counter() - t0, 4)
    # The workers must not compile: hiding CuTe DSL turns a cache miss into one clear error
    # (CompilerUnavailableError) instead of a compile inside the timed prepare.
    sys.modules["cutlass"] = None  # type: ignore[assignment]

    t0 = time.perf_counter()
    device = _device(torch, rank)
    torch.zeros(1, device=device).add_(1)
    torch.cuda.synchronize(device)
    result["cuda_init_s"] = round(time.perf_counter() - t0, 4)
    result["device"] = f"{device} {torch.cuda.get_device_name(device)}"

    layers = [tuple(layer) for layer in opts["layers"]]
    gen = torch.Generator(device).manual_seed(opts["seed"])
    weights = [random_fp8_layer(hidden, inter, gen) for _, hidden, inter in layers]
    torch.cuda.synchronize(device)  # construction must not wait for the weights' kernels
    manager = default_manager()
    before = manager.stats
    loads_before = launcher.module_loads()
    barrier.wait()

    t0 = time.perf_counter()
    mlps = [DenseMlp(**w) for w in weights]
    result["construct_s"] = round(time.perf_counter() - t0, 4)
    # The weight-scale checks construction queued (one host sync for all layers), which
    # the first prepare() would otherwise resolve: timed apart from prepare.
    t0 = time.perf_counter()
    DenseMlp.check_weight_scales(mlps)
    result["scale_check_s"] = round(time.perf_counter() - t0, 4)
    profiler = None
    if opts.get("profile"):
        import cProfile  # only when profiling: every worker re-imports this module

        profiler = cProfile.Profile()
    t0 = time.perf_counter()
    with profiler if profiler is not None else contextlib.nullcontext():
        for mlp in mlps:
            mlp.prepare(opts["tokens"])
    result["prepare_s"] = round(time.perf_counter() - t0, 4)
    if profiler is not None:
        result["prepare_profile"] = profile_rows(profiler, opts["profile"])
    # Every worker's start-up ends before any starts its eager loop: sharing one GPU, a
    # worker's module loads would otherwise wait behind the others' timed launches (on a
    # TP server each rank has a GPU of its own).
    barrier.wait()

    after = manager.stats
    result["module_loads"] = launcher.module_loads() - loads_before
    result["distinct_kernels"] = opts["distinct_kernels"]
    result["cache_lookups"] = (after.hits + after.misses) - (before.hits + before.misses)
    result["compiles"] = after.compiles - before.compiles
    result["paths"] = sorted({mlp.path(m) for mlp in mlps for m in opts["tokens"]})

    # Host syncs of constructing one layer of each kind (untimed: the count is patched in).
    kinds: dict[str, int] = {}  # the first layer of each kind
    for i, (kind, _, _) in enumerate(layers):
        kinds.setdefault(kind, i)
    with _counting_syncs(torch) as syncs:
        for i in kinds.values():
            DenseMlp(**weights[i])
    result["construct_syncs_per_layer"] = round(len(syncs) / len(kinds), 2)

    sync = torch.cuda.synchronize
    eager, launch, op, op_direct, alloc = {}, {}, {}, {}, {}
    for kind, i in kinds.items():
        mlp = mlps[i]
        x = torch.randn(EAGER_TOKENS, mlp.hidden, device=device, generator=gen)
        x = x.to(torch.bfloat16)
        times = {"calls": opts["calls"], "warmup": opts["warmup"], "sync": sync}
        eager[kind] = _host_us(lambda mlp=mlp, x=x: mlp(x), **times)
        launch[kind] = _host_us(_launches_only(torch, mlp, x), **times)
        alloc[kind] = _host_us(lambda mlp=mlp, x=x: x.new_empty((1, mlp.hidden)), **times)
        op[kind], op_direct[kind] = _op_host_us(mlp, x, opts["tokens"], times)
    result["eager_host_us"] = eager  # DenseMlp.__call__: checks, out, both launches
    result["launch_host_us"] = launch  # the two launches alone (KernelPair.launch)
    result["alloc_host_us"] = alloc  # the call's output allocation alone (x.new_empty)
    result["op_host_us"] = op  # torch.ops.mlpjit.dense_mlp: the op's dispatch and the call
    result["op_eager_host_us"] = op_direct  # mlpjit.ops.dense_mlp eager: no dispatch
    result["torch_op_host_us"] = _host_us(lambda: x.mul(1), opts["calls"], opts["warmup"], sync)

    # The planning of the model's distinct shapes, cold, in this process (part of prepare).
    _clear_planning_caches()
    t0 = time.perf_counter()
    distinct_requests(layers, opts["tokens"], "sm_90a")
    result["plan_s"] = round(time.perf_counter() - t0, 4)
    return result


def profile_rows(profiler: Any, count: int) -> list[dict]:
    """The ``count`` functions of a finished profile with the most cumulative time, as
    {"function", "calls", "cum_ms", "own_ms"} (function: file:line(name), the file relative
    to mlpjit's package or its last two parts)."""
    import pstats

    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    rows = sorted(stats.items(), key=lambda item: item[1][3], reverse=True)[:count]
    return [
        {
            "function": f"{_short_path(file)}:{line}({name})",
            "calls": nc,
            "cum_ms": round(ct * 1e3, 3),
            "own_ms": round(tt * 1e3, 3),
        }
        for (file, line, name), (_, nc, tt, ct, _) in rows
    ]


def _short_path(file: str) -> str:
    parts = Path(file).parts
    if "mlpjit" in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("mlpjit") :])
    return "/".join(parts[-2:])


@contextlib.contextmanager
def _counting_syncs(torch: Any):
    """The host syncs inside the block, by name: bool(), item(), tolist(), cpu() of a
    tensor and torch.cuda.synchronize."""
    found: list[str] = []
    patched = [(torch.Tensor, name) for name in ("__bool__", "item", "tolist", "cpu")]
    patched.append((torch.cuda, "synchronize"))
    saved = [(owner, name, getattr(owner, name)) for owner, name in patched]

    def counting(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            found.append(name)
            return real(*args, **kwargs)

        return call

    for owner, name, real in saved:
        setattr(owner, name, counting(name, real))
    try:
        yield found
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)


def _launches_only(torch: Any, mlp: Any, x: Any) -> Callable[[], None]:
    """A call of the two kernel launches of ``mlp`` at x's token count, nothing else: the
    raw slots DenseMlp passes, on the current stream."""
    from mlpjit.jit import launcher

    m = x.shape[0]
    act = torch.empty(m, mlp.intermediate, dtype=torch.bfloat16, device=x.device)
    out = torch.empty(m, mlp.hidden, dtype=torch.bfloat16, device=x.device)
    pair = launcher.kernel_pair(*_pair_kernels(mlp, m))
    first = (act.data_ptr(), x.data_ptr(), mlp.w13.data_ptr(), mlp.w13_scale.data_ptr())
    second = (out.data_ptr(), act.data_ptr(), mlp.w2.data_ptr(), mlp.w2_scale.data_ptr())
    stream = launcher.stream_handle_getter()(x.device.index)
    return lambda: pair.launch(first, second, mlp.pdl, stream)


def _pair_kernels(mlp: Any, m: int) -> tuple[Any, Any]:
    """The loaded gate_up and down kernels of ``mlp`` at m tokens (from the process memo)."""
    from mlpjit.dense_mlp import kernel_requests
    from mlpjit.jit import loaded

    requests = kernel_requests(
        mlp.hidden, mlp.intermediate, [m], mlp.arch, limit=mlp.limit, ue8m0=mlp.ue8m0, sms=mlp.sms
    )
    gate_up, down = loaded.load_kernels(requests, mlp.device)
    return gate_up, down


def _op_host_us(mlp: Any, x: Any, tokens: Sequence[int], times: dict) -> tuple[float, float]:
    """Host us of one call through the torch op, and through mlpjit.ops.dense_mlp eager."""
    import torch

    from mlpjit import ops

    args = (mlp.w13, mlp.w13_scale, mlp.w2, mlp.w2_scale, mlp.limit, mlp.ue8m0)
    ops.prepare(*args[:4], tokens, limit=mlp.limit, ue8m0=mlp.ue8m0)
    through_op = _host_us(lambda: torch.ops.mlpjit.dense_mlp(x, *args), **times)
    eager = _host_us(lambda: ops.dense_mlp(x, *args), **times)
    return through_op, eager


def _clear_planning_caches() -> None:
    """Forget every memoized plan of this process (fp8_gemv's searches, the shard requests,
    DenseMlp's paths), so the next planning is cold."""
    import mlpjit.dense_mlp
    import mlpjit.kernels.fp8_gemv.tuning
    import mlpjit.layer_plan

    modules = (mlpjit.kernels.fp8_gemv.tuning, mlpjit.layer_plan, mlpjit.dense_mlp)
    for module in modules:
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def _worker(rank: int, opts: dict, barrier: Any, out_path: str) -> None:
    """Process entry: run the worker and write its result (or its error) as JSON."""
    try:
        result = _worker_body(rank, opts, barrier)
    except BaseException as err:
        with contextlib.suppress(Exception):
            barrier.abort()  # release the others from the start barrier
        result = {"worker": rank, "error": _first_line(err), "traceback": traceback.format_exc()}
    Path(out_path).write_text(json.dumps(result))


def _first_line(err: BaseException) -> str:
    """An error as one line: its type and the first line of its message."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


# --------------------------------------------------------------------- parent side


def parse_workers(text: str) -> list[int]:
    """'1,8' -> [1, 8]: the worker counts of the runs, in order (each >= 1)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--workers must be a comma list of ints >= 1, got {text!r}"
        ) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"--workers must be a comma list of ints >= 1, got {text!r}"
        )
    return counts


def _series(text: str) -> tuple[str, str]:
    label, sep, match = text.partition("=")
    if not (sep and label and match):
        raise argparse.ArgumentTypeError(f"--series takes LABEL=TEXT, got {text!r}")
    return label, match


def stored_runs(paths: Sequence[Path]) -> dict[str, dict]:
    """name -> report of the files: a --json report (named after its file) or a file of
    named reports, {"runs": {name: report}}."""
    runs: dict[str, dict] = {}
    for path in paths:
        data = json.loads(path.read_text())
        if isinstance(data.get("runs"), dict):
            runs.update(data["runs"])
        else:
            runs[path.stem] = data
    return runs


def group_series(
    runs: dict[str, dict], series: Sequence[tuple[str, str]] | None
) -> dict[str, list[dict]]:
    """label -> reports: the runs whose name holds each series' text (each run in the first
    series that matches it), or one series per run without ``series``."""
    if not series:
        return {name: [report] for name, report in runs.items()}
    grouped: dict[str, list[dict]] = {label: [] for label, _ in series}
    for name, report in runs.items():
        label = next((label for label, match in series if match in name), None)
        if label is not None:
            grouped[label].append(report)
    empty = [label for label, reports in grouped.items() if not reports]
    if empty:
        raise ValueError(f"--series {empty[0]}: no run name holds its text ({', '.join(runs)})")
    return grouped


def parse_args(
    argv: Sequence[str] | None = None, description: str | None = None
) -> argparse.Namespace:
    """The benchmark's arguments, checked (argparse exits 2); ``description``: the --help
    text (the script's docstring)."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="glm5", choices=PRESET_NAMES, help="model preset")
    p.add_argument("--tp", type=positive_int, default=8, help="tensor-parallel size (shards)")
    p.add_argument("--workers", type=parse_workers, default=[1, 8], help="runs, e.g. 1,8")
    p.add_argument("--tokens", type=token_list, default=token_list(DEFAULT_TOKENS), help="e.g. 1-8")
    p.add_argument("--calls", type=positive_int, default=200, help="timed eager calls")
    p.add_argument("--warmup", type=int, default=2000, help="untimed eager calls first")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument(
        "--profile",
        type=positive_int,
        metavar="N",
        help="profile each worker's prepare (cProfile; prepare s then includes the "
        "profiler's cost) and report its N functions of most cumulative time",
    )
    p.add_argument("--dry-run", action="store_true", help="list layers and kernels; no GPU")
    p.add_argument("--plot", type=Path, help="with --plot-from: write a PNG of those reports")
    p.add_argument("--plot-from", type=Path, nargs="+", metavar="JSON", help="stored reports")
    p.add_argument(
        "--series",
        type=_series,
        action="append",
        metavar="LABEL=TEXT",
        help="plot the runs whose name holds TEXT as one series LABEL (default: one per run)",
    )
    args = p.parse_args(argv)
    if (args.plot is None) != (args.plot_from is None):
        p.error("--plot and --plot-from go together")
    for path in args.plot_from or ():
        if not path.is_file():
            p.error(f"--plot-from: no such file {path}")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    try:
        args.layers = model_layers(args.model, args.tp)
    except ValueError as err:
        p.error(str(err))
    return args


def run_workers(count: int, opts: dict) -> list[dict]:
    """Start ``count`` workers at once and return their results in worker order."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(count)
    with tempfile.TemporaryDirectory(prefix="mlpjit-bench-startup-") as out_dir:
        paths = [str(Path(out_dir) / f"worker-{rank}.json") for rank in range(count)]
        procs = [
            ctx.Process(target=_worker, args=(rank, opts, barrier, path))
            for rank, path in enumerate(paths)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        results = []
        for rank, (proc, path) in enumerate(zip(procs, paths, strict=True)):
            if Path(path).exists():
                results.append(json.loads(Path(path).read_text()))
            else:
                error = f"exited {proc.exitcode} without a result"
                results.append({"worker": rank, "error": error})
    return results


def format_table(runs: list[dict]) -> str:
    """A markdown table, one row per worker of each run (host us per layer kind: DenseMlp
    call / its two launches alone / its output allocation alone / through the torch op /
    mlpjit.ops.dense_mlp eager; "-" where a report lacks a part)."""
    head = (
        "| workers | worker | construct s | syncs/layer | scale check s | prepare s | plan s | "
        "module loads | distinct kernels | cache lookups | eager host us (call / launches / "
        "alloc / op / op eager) | torch op host us |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for run in runs:
        for r in run["results"]:
            if "error" in r:
                lines.append(f"| {run['workers']} | {r['worker']} | error: {r['error']} |")
                continue
            eager = " ; ".join(
                f"{kind} {us:.1f} / {r['launch_host_us'][kind]:.1f} / "
                f"{_part(r, 'alloc_host_us', kind)} / "
                f"{r['op_host_us'][kind]:.1f} / {r['op_eager_host_us'][kind]:.1f}"
                for kind, us in r["eager_host_us"].items()
            )
            lines.append(
                f"| {run['workers']} | {r['worker']} | {r['construct_s']:.3f} | "
                f"{r['construct_syncs_per_layer']} | {r['scale_check_s']:.3f} | "
                f"{r['prepare_s']:.3f} | {r['plan_s']:.3f} | {r['module_loads']} | "
                f"{r['distinct_kernels']} | {r['cache_lookups']} | {eager} | "
                f"{r['torch_op_host_us']:.1f} |"
            )
    return "\n".join(lines)


def _part(result: dict, name: str, kind: str) -> str:
    """One eager-time part of a worker's result, or "-" in reports from before it."""
    value = result.get(name, {}).get(kind)
    return "-" if value is None else f"{value:.1f}"


def format_profile(rows: list[dict]) -> str:
    """A worker's prepare profile (profile_rows) as a markdown table."""
    lines = ["| cum ms | own ms | calls | function |", "|---|---|---|---|"]
    lines += [
        f"| {r['cum_ms']:.2f} | {r['own_ms']:.2f} | {r['calls']} | {r['function']} |"
        for r in rows
    ]
    return "\n".join(lines)


MISSING_KERNEL = "the cache lacks kernels of"


def failure_line(args: argparse.Namespace, error: str) -> str:
    """The one line a failed worker ends the run with; a missing kernel names the fix."""
    if "CompilerUnavailableError" in error or "not in any cache" in error:
        return (
            f"bench_startup: {MISSING_KERNEL} {args.model} TP {args.tp}; warm it with "
            f"`mlpjit warm --model {args.model} --tp {args.tp} --arch sm_90a` and point "
            f"MLPJIT_CACHE_DIR at it ({error})"
        )
    return f"bench_startup: {error}"


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """Run the workers and print their report (or --dry-run / --plot); 2 without a GPU, 1
    when a worker fails. ``description``: the --help text (the script's docstring)."""
    args = parse_args(argv, description)
    if args.plot is not None:
        from mlpjit.bench import plots

        try:
            series = group_series(stored_runs(args.plot_from), args.series)
        except ValueError as err:
            print(f"bench_startup: {err}", file=sys.stderr)
            return 2
        plots.startup(series, args.plot, PLOT_GOALS)
        print(f"plot: {args.plot}")
        return 0
    import mlpjit.dense_mlp  # noqa: F401  (imported first: the planning alone is timed)
    from mlpjit.jit import config

    arch = "sm_90a"
    # Timed: a cold planning of the model's shapes (what each worker's prepare includes).
    t0 = time.perf_counter()
    requests = distinct_requests(args.layers, args.tokens, arch)
    plan_s = round(time.perf_counter() - t0, 4)
    kinds = {kind: sum(1 for k, _, _ in args.layers if k == kind) for kind, _, _ in args.layers}
    header = (
        f"{args.model} TP {args.tp}: {len(args.layers)} MLPs "
        f"({', '.join(f'{n} {kind}' for kind, n in kinds.items())}), tokens "
        f"{args.tokens[0]}-{args.tokens[-1]}, {len(requests)} distinct kernels (planned in "
        f"{plan_s:.3f} s here, part of each worker's prepare)"
    )
    if args.dry_run:
        print(f"dry run: {header}")
        for kind, hidden, inter in dict.fromkeys(args.layers):
            print(f"{kind}: hidden {hidden}, intermediate {inter} x {kinds[kind]} layers")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_startup: no CUDA GPU visible; run it on the GPU machine (--dry-run: the plan)")
        return 2
    opts = {
        "layers": args.layers,
        "tokens": args.tokens,
        "calls": args.calls,
        "warmup": args.warmup,
        "seed": args.seed,
        "distinct_kernels": len(requests),
        "profile": args.profile,
    }
    runs = []
    for count in args.workers:
        t0 = time.perf_counter()
        results = run_workers(count, opts)
        runs.append(
            {"workers": count, "wall_s": round(time.perf_counter() - t0, 3), "results": results}
        )
        failed = [r for r in results if "error" in r]
        if failed:
            line = failure_line(args, failed[0]["error"])
            if MISSING_KERNEL not in line:  # unexpected: the whole story on stderr
                for r in failed:
                    print(r.get("traceback", r["error"]), file=sys.stderr)
            print(line)
            return 1
    if args.json:
        report = {
            "model": args.model,
            "tp": args.tp,
            "layers": kinds,
            "tokens": args.tokens,
            "distinct_kernels": len(requests),
            "plan_s": plan_s,
            "cache_dir": str(config.cache_dir()),
            "runs": runs,
        }
        print(json.dumps(report, indent=1))
    else:
        print(f"{header}; cache {config.cache_dir()}\n{GOALS}\n")
        print(format_table(runs))
        for run in runs:
            profile = run["results"][0].get("prepare_profile")
            if profile:
                head = f"{run['workers']} worker(s), worker 0's prepare"
                print(f"\n{head}:\n{format_profile(profile)}")
    return 0
