"""The tensor-parallel demo behind scripts/tp_demo.py (its docstring: what it measures and
how to run it): GLM-5 dense layers sharded over ``--tp`` ranks, one process and GPU per rank
with NCCL (real mode), or every rank in one process (emulated mode).

The top of this module imports no torch and nothing of mlpjit that does, so a spawned
rank's import time is its own.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from mlpjit.bench.cli_args import positive_int, token_list
from mlpjit.bench.tp_layers import (
    HIDDEN,
    INTERMEDIATE,
    SEED,
    TOL,
    check_entry,
    check_shapes,
    emulated_chain,
    format_check,
    kernel_requests,
    random_input,
    random_layer,
    shard_layer,
)
from mlpjit.kernels.blocks import BLOCK
from mlpjit.kernels.fp8_gemv.params import MAX_TOKENS
from mlpjit.testing.layers import (
    ms,
    output_digest,
    replay_times,
    startup_stats,
    startup_table,
)

__all__ = ["dry_run", "format_table", "main", "parse_args", "run_emulated", "run_real"]

# Multicast / NVLS stay off in every rank: the GPUs this ran on do not support it.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
TEARDOWN_GRACE_S = 20  # seconds the ranks get to tear NCCL down once all results are in
FAILURE_GRACE_S = 30  # seconds the others get after a rank failed (they would wait in NCCL)
# What the ranks need of the arguments (the JSON's "options").
OPTIONS = ("tp", "layers", "hidden", "intermediate", "tokens", "check_tokens", "steps", "timeout")


# --------------------------------------------------------------------- prepare, capture, time


class StepGraph(NamedTuple):
    """A captured step and every buffer it reads or writes.

    The graph replays into these addresses, so they must live as long as the graph: a
    buffer dropped after capture goes back to torch's allocator, and replays then write
    into whatever tensor gets that memory next (caught by the first real TP=2 run).
    """

    graph: Any
    x: Any
    acts: list
    outs: list
    hs: list


def _capture(mlps: Sequence[Any], m: int, hidden: int, reduce: Any) -> StepGraph:
    """One CUDA graph of the L-layer step ``h += reduce(mlp(h))`` for m tokens.

    ``reduce`` is the in-place all-reduce (real mode) or None (one rank's compute only).
    Warm-up runs on a side stream first (also initialises NCCL's per-stream state before
    capture). Capture is thread-local, so NCCL's watchdog thread may keep querying its
    events meanwhile.
    """
    import torch

    device = mlps[0].device
    x = random_input(m, hidden, device=device)
    acts = [torch.empty(m, mlp.intermediate, device=device, dtype=torch.bfloat16) for mlp in mlps]
    outs = [torch.empty(m, hidden, device=device, dtype=torch.bfloat16) for _ in mlps]
    hs = [torch.empty(m, hidden, device=device, dtype=torch.bfloat16) for _ in mlps]

    def step() -> None:
        h = x
        for mlp, act, out, h_next in zip(mlps, acts, outs, hs, strict=True):
            mlp.forward_into(h, act, out)
            if reduce is not None:
                reduce(out)
            torch.add(h, out, out=h_next)
            h = h_next

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        step()
    return StepGraph(graph, x, acts, outs, hs)


def run_rank(
    mlps: Sequence[Any],
    opts: dict,
    reduce: Callable[[Any], None] | None = None,
    sync: Callable[[], object] | None = None,
    progress: Callable[[str], None] = lambda phase: None,
) -> tuple[dict, dict[int, StepGraph]]:
    """One rank's layers after build: prepare every token count (timed, with the compile
    manager's stats and the paths taken); on a GPU also one graph per token count
    (capture_ms) and the median step time at the smallest and largest count (step_us).

    ``reduce``: the all-reduce inside the graph (None: this rank's compute only); ``sync``:
    a barrier across ranks before prepare, capture and each timed series. Returns the
    numbers and the graphs (empty off the GPU).
    """
    import torch

    tokens: list[int] = opts["tokens"]
    if sync is not None:
        sync()  # every rank starts preparing at once
    row = startup_stats(lambda: [mlp.prepare(tokens) for mlp in mlps])
    row["paths"] = sorted({mlp.path(m) for mlp in mlps for m in tokens})
    progress("prepared")
    device = mlps[0].device
    if device.type != "cuda":
        return row, {}
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    graphs = {m: _capture(mlps, m, opts["hidden"], reduce) for m in tokens}
    torch.cuda.synchronize(device)
    row["capture_ms"] = ms(time.perf_counter() - t0)
    progress("graphs captured")
    row["step_us"] = {
        str(m): round(
            statistics.median(replay_times(graphs[m].graph, opts["steps"], 10, sync)) * 1000.0, 2
        )
        for m in sorted({tokens[0], tokens[-1]})
    }
    return row, graphs


# --------------------------------------------------------------------- real mode (one rank)


def _progress(rank: int, phase: str) -> None:
    """One stderr line per start-up phase, so a hang shows where it stopped."""
    print(f"tp_demo rank {rank}: {phase}", file=sys.stderr, flush=True)


def _rank_body(rank: int, opts: dict, spawned_at: float) -> dict:
    entered = time.time()
    t0 = time.perf_counter()
    import torch
    import torch.distributed as dist

    import mlpjit  # noqa: F401  (timed: what a server pays to import it)
    from mlpjit.dense_mlp import DenseMlp

    import_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "rank": rank,
        "mode": "real",
        "pid": os.getpid(),
        "spawn_ms": ms(entered - spawned_at),
        "import_ms": ms(import_s),
    }
    tp, hidden, inter = opts["tp"], opts["hidden"], opts["intermediate"]
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    result["device"] = f"{device} {torch.cuda.get_device_name(device)}"

    os.environ.update(NO_MULTICAST_ENV)  # before init, whatever the parent had
    _progress(rank, "imported; initializing NCCL")
    t0 = time.perf_counter()
    from datetime import timedelta

    dist.init_process_group(
        "nccl",
        rank=rank,
        world_size=tp,
        device_id=device,
        timeout=timedelta(seconds=opts["timeout"]),
    )
    warm = torch.ones(1, device=device)
    dist.all_reduce(warm)  # create the communicator now (timed as init)
    torch.cuda.synchronize(device)
    result["init_ms"] = ms(time.perf_counter() - t0)
    _progress(rank, "NCCL communicator up")
    if warm.item() != tp:
        raise RuntimeError(f"all_reduce of ones gave {warm.item()}, expected {tp}")

    t0 = time.perf_counter()
    full_layers, mlps = [], []
    for layer in range(opts["layers"]):
        full = random_layer(hidden, inter, seed=SEED + layer, device=device)
        mlps.append(DenseMlp(*shard_layer(*full.values(), rank, tp), ue8m0=True))
        if rank == 0:
            full_layers.append(full)  # the reference's weights
        del full
    torch.cuda.synchronize(device)
    result["build_ms"] = ms(time.perf_counter() - t0)
    _progress(rank, "weights built")

    row, graphs = run_rank(
        mlps,
        opts,
        reduce=dist.all_reduce,
        sync=dist.barrier,
        progress=lambda phase: _progress(rank, phase),
    )
    result.update(row)
    digests, snapshots, step = {}, {}, None
    for m in opts["tokens"]:  # every rank replays the same graphs in the same order
        step = graphs[m]
        step.graph.replay()
        torch.cuda.synchronize(device)
        digests[str(m)] = output_digest(step.hs[-1])
        if rank == 0 and m in opts["check_tokens"]:
            inputs = [step.x, *step.hs[:-1]]
            snapshots[m] = (
                step.x.clone(),
                step.hs[-1].clone(),
                [t.clone() for t in inputs],
                [o.clone() for o in step.outs],
            )
    result["output_sha256"] = digests
    if rank == 0:
        t0 = time.perf_counter()
        result["check"] = {
            str(m): check_entry(full_layers, *snapshot) for m, snapshot in snapshots.items()
        }
        result["reference_ms"] = ms(time.perf_counter() - t0)
    dist.barrier()
    # Graphs that captured NCCL collectives keep the communicator busy: drop them before
    # teardown (destroy_process_group can still hang after capture, pytorch#115388).
    del graphs, snapshots, step
    torch.cuda.synchronize(device)
    return result


def _rank_main(rank: int, opts: dict, spawned_at: float, out_dir: str) -> None:
    """Process entry of one rank: run it and write its result (or its error) as JSON, then
    tear the process group down and leave a marker file that says it returned.

    A rank still running 20 s before the deadline dumps every thread's stack to stderr, so
    a hang (NCCL init, capture, a collective) shows where it is.
    """
    faulthandler.dump_traceback_later(max(opts["timeout"] - 20, 1), exit=False)
    try:
        result = _rank_body(rank, opts, spawned_at)
    except BaseException:
        result = {"rank": rank, "error": traceback.format_exc()}
    # The result is complete before teardown: a hang there must not lose it. Written whole
    # (temp file, then rename): the parent takes an existing file as a finished rank.
    path = Path(out_dir, f"rank-{rank}.json")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)
    if "error" in result:
        raise SystemExit(1)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    Path(out_dir, f"rank-{rank}.teardown").write_text("ok")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_real(opts: dict) -> list[dict]:
    """Spawn one process per rank; return their results (rank order). Once a rank failed the
    others are stopped after FAILURE_GRACE_S (they would wait in NCCL), once all results are
    in after TEARDOWN_GRACE_S, and all of them at the --timeout deadline."""
    import torch.multiprocessing as mp

    os.environ.update(NO_MULTICAST_ENV)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    ctx = mp.get_context("spawn")
    out_dir = Path(tempfile.mkdtemp(prefix="mlpjit-tp-demo-"))
    result_paths = [out_dir / f"rank-{rank}.json" for rank in range(opts["tp"])]
    try:
        procs = []
        for rank in range(opts["tp"]):
            proc = ctx.Process(target=_rank_main, args=(rank, opts, time.time(), str(out_dir)))
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + opts["timeout"]
        failed_at = done_at = None
        while any(p.is_alive() for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
                failed_at = now
            if done_at is None and all(path.exists() for path in result_paths):
                done_at = now
            if (
                now > deadline
                or (failed_at is not None and now > failed_at + FAILURE_GRACE_S)
                or (done_at is not None and now > done_at + TEARDOWN_GRACE_S)
            ):
                for p in procs:  # only the processes started above
                    if p.is_alive():
                        p.terminate()
                break
            time.sleep(0.2)
        for p in procs:
            p.join(timeout=30)
        results = []
        for rank, (proc, path) in enumerate(zip(procs, result_paths, strict=True)):
            if not path.exists():
                msg = f"exited {proc.exitcode} without a result (stopped, or killed)"
                results.append({"rank": rank, "error": msg})
                continue
            result = json.loads(path.read_text())
            if "error" not in result:
                clean = (out_dir / f"rank-{rank}.teardown").exists()
                result["teardown"] = (
                    "clean"
                    if clean
                    else f"hung in destroy_process_group; stopped after {TEARDOWN_GRACE_S} s "
                    "(pytorch#115388)"
                )
            results.append(result)
        return results
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


# --------------------------------------------------------------------- emulated mode


def run_emulated(opts: dict, device_name: str) -> tuple[list[dict], dict]:
    """All ranks in this process, one after the other; returns (per-rank rows, check)."""
    import torch

    from mlpjit.dense_mlp import DenseMlp

    tp, hidden, inter = opts["tp"], opts["hidden"], opts["intermediate"]
    device = torch.device(device_name)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    full_layers = [
        random_layer(hidden, inter, seed=SEED + layer, device=device)
        for layer in range(opts["layers"])
    ]
    sync()
    build_full_ms = ms(time.perf_counter() - t0)

    rows, rank_mlps = [], []
    for rank in range(tp):
        row: dict[str, Any] = {"rank": rank, "mode": "emulated", "device": str(device)}
        t0 = time.perf_counter()
        mlps = [
            DenseMlp(*shard_layer(*full.values(), rank, tp), ue8m0=True) for full in full_layers
        ]
        sync()
        row["build_ms"] = ms(time.perf_counter() - t0)  # shard + DenseMlp (full layers: once)
        numbers, graphs = run_rank(mlps, opts)  # this rank's layers without the all-reduce
        del graphs
        rows.append({**row, **numbers})
        rank_mlps.append(mlps)

    check: dict[str, Any] = {"full_build_ms": build_full_ms, "per_m": {}, "bf16_sum": {}}
    t0 = time.perf_counter()
    for m in opts["check_tokens"]:
        x = random_input(m, hidden, device=device)
        for key, bf16_sum in (("per_m", False), ("bf16_sum", True)):
            chain = emulated_chain(rank_mlps, x, bf16_sum=bf16_sum)
            check[key][str(m)] = check_entry(full_layers, x, *chain)
    sync()
    check["check_ms"] = ms(time.perf_counter() - t0)
    return rows, check


EMULATION_NOTE = (
    "EMULATION: one process computes the {tp} ranks' shards one after the other on {device} and "
    "sums their partial outputs in float32 (NCCL adds bf16 hop by hop; that variant is in "
    "the JSON as emulation.bf16_sum). Not covered: NCCL, the ranks' concurrent start-up (one "
    "process imports once; later ranks hit kernels the first one compiled or loaded), and "
    "the capture of the all-reduce (graphs and step times are one rank's layers alone)."
)


# --------------------------------------------------------------------- arguments and output


# --tokens and --check-tokens: the decode sizes the kernels take
_decode_tokens = functools.partial(token_list, most=MAX_TOKENS)


def parse_args(
    argv: Sequence[str] | None = None, description: str | None = None
) -> argparse.Namespace:
    """Parse and cross-check the arguments (argparse exits 2 with a message naming them);
    ``description``: the --help text (the script's docstring, first paragraph shown)."""
    p = argparse.ArgumentParser(description=(description or "").split("\n\n")[0] or None)
    p.add_argument("--tp", type=positive_int, default=8, help="tensor-parallel size N (default 8)")
    p.add_argument("--layers", type=positive_int, default=3, help="dense layers (default 3)")
    p.add_argument("--tokens", type=_decode_tokens, default=list(range(1, 9)), help="e.g. 1-8")
    p.add_argument(
        "--check-tokens", type=_decode_tokens, default=[1, 8], help="checked counts (1,8)"
    )
    p.add_argument("--hidden", type=positive_int, default=HIDDEN, help=f"hidden size ({HIDDEN})")
    p.add_argument(
        "--intermediate",
        type=positive_int,
        default=INTERMEDIATE,
        help=f"full intermediate ({INTERMEDIATE})",
    )
    p.add_argument("--steps", type=positive_int, default=200, help="timed replays per token count")
    p.add_argument("--timeout", type=positive_int, default=540, help="real mode: seconds in all")
    p.add_argument("--emulate", action="store_true", help="one process, ranks in turn")
    p.add_argument("--dry-run", action="store_true", help="check args and shard shapes only")
    p.add_argument("--json", metavar="FILE", help="also write every number as JSON")
    args = p.parse_args(argv)
    try:
        check_shapes(args.hidden, args.intermediate, args.tp)
    except ValueError as err:
        p.error(f"--tp/--intermediate/--hidden: {err}")
    missing = sorted(set(args.check_tokens) - set(args.tokens))
    if missing:
        p.error(f"--check-tokens {missing} must be among --tokens {args.tokens}")
    return args


def dry_run(opts: dict) -> list[str]:
    """Shard meta tensors of the full layer for every rank; return the plan as lines."""
    import torch

    from mlpjit.dense_mlp import kernel_supported

    tp, hidden, inter = opts["tp"], opts["hidden"], opts["intermediate"]
    c = inter // tp

    def layer_shapes(n: int) -> list[tuple[int, int]]:  # w13, s13, w2, s2, intermediate n
        return [
            (2 * n, hidden),
            (2 * n // BLOCK, hidden // BLOCK),
            (hidden, n),
            (hidden // BLOCK, n // BLOCK),
        ]

    def text(dims: list[tuple[int, int]]) -> str:
        w13, s13, w2, s2 = (list(d) for d in dims)
        return f"w13 {w13} s13 {s13}, w2 {w2} s2 {s2}"

    dtypes = (torch.float8_e4m3fn, torch.float32) * 2
    full = [
        torch.empty(dims, dtype=dtype, device="meta")
        for dims, dtype in zip(layer_shapes(inter), dtypes, strict=True)
    ]
    for rank in range(tp):
        got = [tuple(t.shape) for t in shard_layer(*full, rank, tp)]
        if got != layer_shapes(c):
            raise RuntimeError(f"rank {rank}: shard shapes {got}, expected {layer_shapes(c)}")
    paths = {m: "kernel" if kernel_supported(hidden, c, m) else "stock" for m in opts["tokens"]}
    n_requests = len(kernel_requests("sm_90a", hidden=hidden, intermediate=inter, tp=tp))
    return [
        f"tp_demo dry run: tp {tp}, {opts['layers']} layers, hidden {hidden}, intermediate "
        f"{inter} (per rank {c}), tokens {opts['tokens']}, check tokens {opts['check_tokens']}",
        f"full layer: {text(layer_shapes(inter))}",
        f"every rank's shard: {text(layer_shapes(c))} (checked for ranks 0..{tp - 1})",
        f"path on sm_90a per token count: {paths}; kernel_requests: {n_requests} kernels",
        "no CUDA used",
    ]


def format_table(results: list[dict]) -> str:
    """A markdown table, one row per process, plus a totals line."""
    return startup_table(results, "rank", ("import", "init", "build"))


# --------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """Run the demo; 0 when every rank ran and the check passed, 1 otherwise, 2 for usage."""
    t_start = time.perf_counter()
    args = parse_args(argv, description)
    opts = {name: getattr(args, name) for name in OPTIONS}
    if args.dry_run:
        print("\n".join(dry_run(opts)))
        return 0
    t0 = time.perf_counter()
    import torch

    import mlpjit  # noqa: F401

    import_s = time.perf_counter() - t0
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0 and not args.emulate:
        print(
            "tp_demo: no CUDA device: pass --dry-run (shapes only) or --emulate (CPU reference "
            "math, small shapes advised)",
            file=sys.stderr,
        )
        return 2
    mode = "real" if gpus >= args.tp and not args.emulate else "emulated"
    if mode == "real":
        results = run_real(opts)
        per_m = next((r["check"] for r in results if "check" in r), {})
        digests = [r["output_sha256"] for r in results if "output_sha256" in r]
        same = len(digests) == args.tp and all(d == digests[0] for d in digests)
        extra: dict[str, Any] = {"outputs_identical_across_ranks": same}
        header = f"tp_demo: REAL tensor-parallel run, {args.tp} processes x 1 GPU, NCCL"
        footer = [f"outputs identical across ranks: {same}"]
        teardown = [f"rank {r['rank']} {r['teardown']}" for r in results if "teardown" in r]
        footer += ["teardown: " + "; ".join(teardown)] if teardown else []
    else:
        device = "cuda:0" if gpus else "cpu"
        if not args.emulate:
            print(f"tp_demo: {gpus} GPU(s) < --tp {args.tp}: emulating", file=sys.stderr)
        results, check = run_emulated(opts, device)
        results[0]["import_ms"] = ms(import_s)  # the one process's import (shown on rank 0)
        per_m = check["per_m"]
        extra = {"note": EMULATION_NOTE.format(tp=args.tp, device=device), "emulation": check}
        header = (
            f"tp_demo: {extra['note']}\nfull layers built once in {check['full_build_ms']:.0f} ms"
        )
        if not gpus:
            header += "\nOn CPU: reference math, no kernels, no graphs, no step times."
        bf16 = ", ".join(f"m={m}: {e['max']:.2e}" for m, e in check["bf16_sum"].items())
        footer = [
            f"(ranks summed in bf16 one after the other instead, as NCCL rounds: max per "
            f"layer {bf16})"
        ]
    wall = time.perf_counter() - t_start

    print(
        f"{header}\n{args.layers} residual layers (h += all_reduce(mlp_r(h))), hidden "
        f"{args.hidden}, intermediate {args.intermediate} (per rank {args.intermediate // args.tp}"
        f"), tokens {args.tokens[0]}-{args.tokens[-1]}, {args.steps} replays per step time; "
        f"wall {wall:.2f} s\n"
    )
    print(format_table(results))
    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"\nrank {r['rank']} failed:\n{r['error']}", file=sys.stderr)
    check_text, check_ok = format_check(per_m)
    print("\n" + check_text + "\n" + "\n".join(footer))
    passed = check_ok and extra.get("outputs_identical_across_ranks", True) and not failed
    if args.json:
        data = {
            "mode": mode,
            "options": opts,
            "gpus": gpus,
            "tol": TOL,
            "check_rel_l2": {m: e["max"] for m, e in per_m.items()},
            "check": per_m,
            "passed": passed,
            "wall_s": round(wall, 3),
            "env": {k: os.environ.get(k) for k in (*NO_MULTICAST_ENV, "MLPJIT_CACHE_DIR")},
            "results": results,
            **extra,
        }
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
