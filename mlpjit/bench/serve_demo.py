"""The multi-worker start-up demo behind scripts/serve_demo.py (its docstring: what it
measures and how to run it): W spawned workers each import, build, prepare and (on a GPU)
capture and time a model of dense MLPs, or without a GPU warm its kernel list.

The top of this module imports no torch and nothing of mlpjit that does, so a spawned
worker's import time is its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from mlpjit.bench.cli_args import positive_int, token_list
from mlpjit.testing.layers import (
    ms,
    output_digest,
    random_fp8_layer,
    startup_stats,
    startup_table,
)

__all__ = ["format_table", "main", "parse_args"]

# --------------------------------------------------------------------- worker side


def _capture_and_decode(torch: Any, layers: list, tokens: list[int], hidden: int, steps: int):
    """One CUDA graph of the whole model per token count; then timed replays.

    Returns (capture seconds, {m: microseconds per decode step}, {m: sha256 of the output}).
    Inputs are seeded by m, so every worker's digests must agree (same weights, same kernels).
    """
    device = layers[0].device
    inter = layers[0].intermediate
    graphs = {}
    t0 = time.perf_counter()
    for m in tokens:
        gen = torch.Generator(device=device).manual_seed(m)
        x = torch.randn(m, hidden, device=device, generator=gen).to(torch.bfloat16)
        acts = [torch.empty(m, inter, device=device, dtype=torch.bfloat16) for _ in layers]
        outs = [torch.empty(m, hidden, device=device, dtype=torch.bfloat16) for _ in layers]

        def forward(x=x, acts=acts, outs=outs) -> None:
            h = x
            for layer, act, out in zip(layers, acts, outs, strict=True):
                h = layer.forward_into(h, act, out)

        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            forward()  # warm-up outside capture (allocator, first launches)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward()
        graphs[m] = (graph, x, acts, outs)
    torch.cuda.synchronize(device)
    capture_s = time.perf_counter() - t0

    step_us = {}
    for m in (tokens[0], tokens[-1]):
        graph = graphs[m][0]
        for _ in range(10):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            graph.replay()
        end.record()
        end.synchronize()
        step_us[m] = round(start.elapsed_time(end) * 1000.0 / steps, 2)
    digests = {}
    for m, (graph, _, _, outs) in graphs.items():
        graph.replay()
        torch.cuda.synchronize(device)
        digests[m] = output_digest(outs[-1])
    return capture_s, step_us, digests


def _worker_body(rank: int, opts: dict, barrier: Any, spawned_at: float) -> dict:
    entered = time.time()
    t0 = time.perf_counter()
    import torch

    import mlpjit  # noqa: F401  (timed: what a server pays to import it)
    from mlpjit.dense_mlp import DenseMlp
    from mlpjit.jit.manager import default_manager

    import_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "rank": rank,
        "pid": os.getpid(),
        "spawn_ms": ms(entered - spawned_at),
        "import_ms": ms(import_s),
    }
    hidden, inter = opts["hidden"], opts["intermediate"] // opts["tp"]
    tokens: list[int] = opts["tokens"]
    gpu = torch.cuda.is_available()
    t0 = time.perf_counter()
    if gpu:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        layers = []
        for seed in range(opts["layers"]):  # the same weights on every worker
            gen = torch.Generator(device).manual_seed(seed)
            weights = random_fp8_layer(hidden, inter, gen, w_std=48, pow2_exponents=(-12, -8))
            layers.append(DenseMlp(**weights, ue8m0=opts["ue8m0"]))
        torch.cuda.synchronize(device)
        result.update(mode="gpu", device=f"{device} {torch.cuda.get_device_name(device)}")
    else:
        from mlpjit.layer_plan import dense_mlp_requests

        requests = dense_mlp_requests(
            hidden, opts["intermediate"], opts["tp"], tokens, opts["arch"], ue8m0=opts["ue8m0"]
        )
        result.update(mode="compile-only", device=f"cpu (arch {opts['arch']})")
    result["build_ms"] = ms(time.perf_counter() - t0)

    barrier.wait()
    if not gpu:  # each layer asks for the model's kernel list, as its prepare() would
        manager = default_manager()
        result.update(
            startup_stats(lambda: [manager.warm(requests) for _ in range(opts["layers"])])
        )
    else:
        result.update(startup_stats(lambda: [layer.prepare(tokens) for layer in layers]))
        result["paths"] = sorted({layer.path(m) for layer in layers for m in tokens})
        capture_s, step_us, digests = _capture_and_decode(
            torch, layers, tokens, hidden, opts["steps"]
        )
        result["output_sha256"] = {str(m): d for m, d in digests.items()}
        result["capture_ms"] = ms(capture_s)
        result["step_us"] = {str(m): us for m, us in step_us.items()}
    return result


def _worker(rank: int, opts: dict, barrier: Any, spawned_at: float, out_path: str) -> None:
    """Process entry: run the worker and write its result (or its error) as JSON."""
    try:
        result = _worker_body(rank, opts, barrier, spawned_at)
    except BaseException:
        # Release the others from the start barrier (they may be gone already).
        with contextlib.suppress(Exception):
            barrier.abort()
        result = {"rank": rank, "error": traceback.format_exc()}
    Path(out_path).write_text(json.dumps(result))
    if "error" in result:
        raise SystemExit(1)


# --------------------------------------------------------------------- parent side


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """The demo's arguments; ``description``: the --help text (the script's docstring,
    first paragraph shown)."""
    p = argparse.ArgumentParser(description=(description or "").split("\n\n")[0] or None)
    p.add_argument("--workers", type=positive_int, default=4, help="worker processes (W)")
    p.add_argument("--cold", action="store_true", help="use a fresh temporary MLPJIT_CACHE_DIR")
    p.add_argument("--arch", default=None, help="target arch without a GPU, e.g. sm_90a")
    p.add_argument("--json", metavar="FILE", help="also write every worker's numbers as JSON")
    p.add_argument("--layers", type=positive_int, default=3, help="dense MLP layers per model")
    p.add_argument("--hidden", type=positive_int, default=6144, help="hidden size (GLM-5: 6144)")
    p.add_argument("--intermediate", type=positive_int, default=12288, help="full intermediate")
    p.add_argument("--tp", type=positive_int, default=8, help="tensor-parallel size")
    p.add_argument("--tokens", type=token_list, default=list(range(1, 9)), help="e.g. 1-8")
    p.add_argument("--steps", type=positive_int, default=200, help="decode steps timed per m")
    p.add_argument("--no-ue8m0", dest="ue8m0", action="store_false", help="float32 act scales")
    return p.parse_args(argv)


def format_table(results: list[dict]) -> str:
    """A markdown table, one row per process, plus a totals line."""
    return startup_table(results, "worker", ("spawn", "import", "build"))


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """Spawn the workers, collect their JSON results, print the table; 1 if any failed."""
    args = parse_args(argv, description)
    import torch
    import torch.multiprocessing as mp

    from mlpjit.jit import config
    from mlpjit.jit.spec import check_arch

    gpu = torch.cuda.is_available()
    arch = args.arch or config.arch_override()
    if not gpu and arch is None:
        print(
            "serve_demo: no GPU visible: pass --arch sm_90a to run the compile side",
            file=sys.stderr,
        )
        return 2
    if arch is not None:
        check_arch(arch, "--arch")
    if args.intermediate % args.tp:
        print(f"serve_demo: --tp {args.tp} must divide --intermediate", file=sys.stderr)
        return 2
    cold_dir = tempfile.mkdtemp(prefix="mlpjit-serve-demo-") if args.cold else None
    if cold_dir is not None:
        os.environ["MLPJIT_CACHE_DIR"] = cold_dir  # spawned workers inherit it
    opts = {
        "hidden": args.hidden,
        "intermediate": args.intermediate,
        "tp": args.tp,
        "layers": args.layers,
        "tokens": args.tokens,
        "arch": arch,
        "steps": args.steps,
        "ue8m0": args.ue8m0,
    }
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(args.workers)
    out_dir = Path(tempfile.mkdtemp(prefix="mlpjit-serve-demo-out-"))
    try:
        t0 = time.perf_counter()
        procs = []
        for rank in range(args.workers):
            out = str(out_dir / f"worker-{rank}.json")
            proc = ctx.Process(target=_worker, args=(rank, opts, barrier, time.time(), out))
            proc.start()
            procs.append(proc)
        for proc in procs:
            proc.join()
        wall = time.perf_counter() - t0
        results = []
        for rank, proc in enumerate(procs):
            path = out_dir / f"worker-{rank}.json"
            if path.exists():
                results.append(json.loads(path.read_text()))
            else:
                results.append({"rank": rank, "error": f"exited {proc.exitcode} without a result"})
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
        if cold_dir is not None:
            shutil.rmtree(cold_dir, ignore_errors=True)

    cache = "cold (fresh temporary dir)" if args.cold else f"{config.cache_dir()}"
    print(
        f"serve_demo: {args.workers} workers, {args.layers} layers of hidden {args.hidden}, "
        f"inter {args.intermediate // args.tp} (w13 [{2 * args.intermediate // args.tp}, "
        f"{args.hidden}], w2 [{args.hidden}, {args.intermediate // args.tp}]), tokens "
        f"{args.tokens[0]}-{args.tokens[-1]}, cache {cache}; wall {wall:.2f} s\n"
    )
    print(format_table(results))
    digests = [r["output_sha256"] for r in results if "output_sha256" in r]
    if digests:
        same = all(d == digests[0] for d in digests)
        print(f"\noutputs identical across workers (sha256 per token count): {same}")
        if not same:
            return 1
    for r in results:
        if "error" in r:
            print(f"\nworker {r['rank']} failed:\n{r['error']}", file=sys.stderr)
    if args.json:
        data = {
            "workers": args.workers,
            "cold": args.cold,
            "options": opts,
            "wall_s": round(wall, 3),
            "results": results,
        }
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    return 1 if any("error" in r for r in results) else 0
