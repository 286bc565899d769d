#!/usr/bin/env python3
"""GLM-5 dense MLP layers as a tensor-parallel job, start-up and accuracy per rank (issue 6).

Builds ``--layers`` full GLM-5 dense layers (hidden 6144, intermediate 12288) of seeded
random FP8 weights, shards them for TP size ``--tp`` (``shard_layer``) and runs them with
DenseMlp. The model is a chain of residual blocks, ``h = h + all_reduce(mlp_r(h))`` per layer
(residual adds keep the activations at a steady scale over any number of layers; a chain
without them shrinks or grows layer by layer). The accuracy check, for each
``--check-tokens`` count and each layer: the all-reduced TP output of the layer against
``mlpjit.reference.dense_mlp_reference`` (the reference float math) of the full (TP=1) layer
on one device, given the same input (the TP run's own input to that layer), within 1e-2
relative L2. The final ``h`` against an independently computed reference chain is reported
too, as information only: FP8 re-quantization of each layer's input amplifies bf16-level
differences, so even two correct chains differ by about 4e-2 after 3 layers (see
``layer_errors``).

Real mode (``torch.cuda.device_count() >= --tp``): one spawned process per rank on cuda:r,
torch.distributed with NCCL (NVLS / multicast off). Each rank times: import, process-group
init, build (generate the full layers on its GPU from the seed, keep its shards), prepare of
tokens 1..8 (with the compile manager's stats deltas: hits, compiles, lock waits), capture of
one CUDA graph per token count of the whole L-layer decode step *including* the NCCL
all-reduce, and the decode step time (median of single-replay CUDA event times) at the
smallest and largest token count. Rank 0 runs the reference check; every rank's output digest
must agree.

Emulated mode (fewer GPUs than --tp, or ``--emulate``): ONE process on cuda:0 (or on CPU with
``--emulate`` and no GPU: reference math, no kernels, no graphs) builds every rank's shards,
prepares each rank's DenseMlps (the shards share kernel shapes: after the first rank all hits),
captures and times each rank's L layers *without* the all-reduce, and for the check sums the
ranks' partial outputs in float32 (what the all-reduce computes; NCCL itself adds bf16 values
hop by hop, rounding to bf16 at each of up to tp-1 steps: the JSON also reports that variant,
summed sequentially in bf16). It does not cover NCCL, start-up concurrency of the ranks, or the
capture of the all-reduce.

    python3 scripts/tp_demo.py --dry-run                       # CPU: args, shard shapes, plan
    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/tp_demo.py --emulate --json tp.json  # 1 GPU
    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/tp_demo.py --tp 8 --json tp.json     # 8 GPUs

``kernel_requests(arch)`` lists the kernels the GPU run needs (warm a cache on a CPU machine:
``mlpjit warm --model glm5 --tp 8 --tokens 1-8 --arch sm_90a`` gives the same list). The top
of this file imports the standard library only, so a spawned rank's import time is its own.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts import startup_report  # noqa: E402

HIDDEN, INTERMEDIATE = 6144, 12288  # GLM-5 dense layer (mlpjit.kernels.plan.MODELS["glm5"])
BLOCK = 128  # weight-scale block
MAX_TOKENS = 8  # the fused kernels take 1..8 tokens
TOL = 1e-2  # relative L2 error allowed against the full TP=1 reference
W_STD = 64.0  # std of the FP8 weight values before clamping (uses e4m3's range; 448 = 7 std)
SEED = 1234
# Multicast / NVLS stay off (the lent machines do not support it; see the device notes).
# Seconds the ranks get to tear NCCL down once all results are in.
TEARDOWN_GRACE_S = 20
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


# --------------------------------------------------------------------- weights and shards


def check_shapes(hidden: int, intermediate: int, tp: int) -> None:
    """ValueError unless the full layer shards evenly into 128-aligned TP slices."""
    for name, value in (("hidden", hidden), ("intermediate", intermediate), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if hidden % BLOCK:
        raise ValueError(f"hidden must be a multiple of {BLOCK}, got {hidden}")
    if intermediate % tp or (intermediate // tp) % BLOCK:
        raise ValueError(
            f"tp must divide intermediate ({intermediate}) into slices that are a multiple of "
            f"{BLOCK} (the weight-scale block), got tp={tp}"
        )


def random_layer(hidden: int, intermediate: int, *, seed: int, device: Any) -> dict:
    """One full dense layer of seeded random FP8 weights with float32 128x128 block scales.

    Weights: ``randn * 64`` clamped to +-448, as float8_e4m3fn. Scales: positive float32,
    ``1/(64*sqrt(k))`` times a per-block factor in [2^-0.5, 2^0.5), so each dequantized weight
    matrix has a standard deviation near 1/sqrt(k) (unit-scale activations stay unit-scale).
    The same seed gives the same layer on the same device type; nothing depends on the rank.
    """
    import torch

    check_shapes(hidden, intermediate, 1)
    gen = torch.Generator(device=device).manual_seed(seed)

    def weight(n: int, k: int) -> Any:
        w = torch.randn(n, k, generator=gen, device=device)
        return w.mul_(W_STD).clamp_(-448.0, 448.0).to(torch.float8_e4m3fn)

    def scale(n: int, k: int) -> Any:
        jitter = torch.rand(n // BLOCK, k // BLOCK, generator=gen, device=device) - 0.5
        return (2.0**jitter) / (W_STD * k**0.5)

    return {
        "w13": weight(2 * intermediate, hidden),
        "w13_scale": scale(2 * intermediate, hidden),
        "w2": weight(hidden, intermediate),
        "w2_scale": scale(hidden, intermediate),
    }


def random_input(m: int, hidden: int, *, device: Any, seed: int = SEED) -> Any:
    """bf16 randn [m, hidden], seeded by m (identical on every rank)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed + 1000 * m)
    return torch.randn(m, hidden, generator=gen, device=device).to(torch.bfloat16)


def shard_layer(w13: Any, s13: Any, w2: Any, s2: Any, rank: int, tp: int) -> tuple:
    """Rank ``rank``'s tensor-parallel shard of a full layer, as new contiguous tensors.

    w13 [2I, H] (gate rows then up rows) -> gate rows [r*I/tp, (r+1)*I/tp) followed by the
    matching up rows [I + r*I/tp, I + (r+1)*I/tp), with the matching scale rows of s13
    [2I/128, H/128]; w2 [H, I] -> columns [r*I/tp, (r+1)*I/tp) with the matching scale columns
    of s2 [H/128, I/128]. Returns (w13_r [2I/tp, H], s13_r, w2_r [H, I/tp], s2_r). The sum
    over ranks of each shard's MLP output is the full layer's output (up to rounding).
    Works on any device, meta included. ValueError for bad shapes, rank or tp.
    """
    import torch

    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive int, got {tp!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < tp:
        raise ValueError(f"rank must be an int in [0, {tp}), got {rank!r}")
    if w13.dim() != 2 or w13.shape[0] % 2:
        raise ValueError(f"w13 must be [2*intermediate, hidden], got {list(w13.shape)}")
    inter, hidden = w13.shape[0] // 2, w13.shape[1]
    check_shapes(hidden, inter, tp)
    expected = {
        "w2": (w2, (hidden, inter)),
        "s13": (s13, (2 * inter // BLOCK, hidden // BLOCK)),
        "s2": (s2, (hidden // BLOCK, inter // BLOCK)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")
    c = inter // tp  # this rank's intermediate slice
    lo, hi = rank * c, (rank + 1) * c
    blo, bhi, bi = lo // BLOCK, hi // BLOCK, inter // BLOCK
    w13_r = torch.cat([w13[lo:hi], w13[inter + lo : inter + hi]]).contiguous()
    s13_r = torch.cat([s13[blo:bhi], s13[bi + blo : bi + bhi]]).contiguous()
    return w13_r, s13_r, w2[:, lo:hi].contiguous(), s2[:, blo:bhi].contiguous()


def kernel_requests(
    arch: str = "sm_90a",
    *,
    hidden: int = HIDDEN,
    intermediate: int = INTERMEDIATE,
    tp: int = 8,
    tokens: Iterable[int] = range(1, MAX_TOKENS + 1),
) -> list:
    """The compile requests the GPU run needs: both kernels of a TP-``tp`` shard, ue8m0 on.

    The full TP=1 layer is only used by the reference (plain torch), so it needs no kernel.
    The same list as ``mlpjit warm --model glm5 --tp 8 --tokens 1-8 --arch sm_90a``.
    """
    from mlpjit.kernels.plan import dense_mlp_requests

    check_shapes(hidden, intermediate, tp)
    return dense_mlp_requests(hidden, intermediate, tp, list(tokens), arch, ue8m0=True)


def rel_l2(got: Any, want: Any) -> float:
    """||got - want|| / ||want|| in float64."""
    g, w = got.double(), want.double()
    return float((g - w).norm() / w.norm().clamp_min(1e-30))


def reference_chain(full_layers: Sequence[dict], x: Any) -> Any:
    """The residual chain with the full layers in reference math: h += dense_mlp_reference(h)."""
    from mlpjit.reference import dense_mlp_reference

    h = x
    for layer in full_layers:
        h = h + dense_mlp_reference(
            h, layer["w13"], layer["w13_scale"], layer["w2"], layer["w2_scale"], ue8m0=True
        )
    return h


def layer_errors(full_layers: Sequence[dict], inputs: Sequence[Any], outputs: Sequence[Any]):
    """Relative L2 error of each layer's TP output (the all-reduced partial sum) against the
    full layer's reference output, both computed from the same input: the TP run's own input
    to that layer (x for the first, the previous h after that).

    This is the accuracy check. Comparing only the final h of two independently computed
    chains instead amplifies rounding: a bf16-level difference in h moves some values of
    the next layer's FP8 activation quantization across a rounding step (an FP8 step is
    6 to 12 percent of the value), so two correct chains drift apart by a few 1e-2 after
    three layers (measured on CPU: 2.7e-3 per layer, 4e-2 for the chain of 3).
    """
    from mlpjit.reference import dense_mlp_reference

    errors = []
    for layer, h, got in zip(full_layers, inputs, outputs, strict=True):
        want = dense_mlp_reference(
            h, layer["w13"], layer["w13_scale"], layer["w2"], layer["w2_scale"], ue8m0=True
        )
        errors.append(rel_l2(got, want))
    return errors


def emulated_chain(
    rank_mlps: Sequence[Sequence[Any]], x: Any, *, bf16_sum: bool = False
) -> tuple[Any, list, list]:
    """The TP chain computed in one process: ``rank_mlps[r][layer]`` are the shards' DenseMlps.

    Per layer the ranks' partial outputs are summed in float32 and rounded once to bf16 (what
    the all-reduce computes), or with ``bf16_sum`` added one rank after the other in bf16
    (closer to NCCL, which rounds to bf16 at each hop of its ring). Returns (final h, each
    layer's input, each layer's summed output) for ``layer_errors``.
    """
    import torch

    h, inputs, outputs = x, [], []
    for layer in range(len(rank_mlps[0])):
        parts = [mlps[layer](h) for mlps in rank_mlps]
        if bf16_sum:
            total = parts[0]
            for part in parts[1:]:
                total = total + part
        else:
            total = torch.stack([p.float() for p in parts]).sum(0).to(torch.bfloat16)
        inputs.append(h)
        outputs.append(total)
        h = h + total
    return h, inputs, outputs


def check_entry(full_layers: Sequence[dict], x: Any, h: Any, inputs: list, outputs: list) -> dict:
    """The check for one token count: per-layer errors, their max, and the chain's error."""
    errors = layer_errors(full_layers, inputs, outputs)
    return {
        "layers": errors,
        "max": max(errors),
        "chain": rel_l2(h, reference_chain(full_layers, x)),
    }


def _digest(t: Any) -> str:
    import torch

    raw = t.detach().contiguous().view(torch.int16).cpu().numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


# --------------------------------------------------------------------- CUDA graphs


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


def _capture(torch: Any, mlps: Sequence[Any], m: int, hidden: int, reduce: Any) -> StepGraph:
    """One CUDA graph of the L-layer step ``h += reduce(mlp(h))`` for m tokens.

    ``reduce`` is the in-place all-reduce (real mode) or None (one rank's compute only).
    Returns the graph with its buffers (input, per-layer act, out and h). Warm-up runs on a side
    stream first (also initialises NCCL's per-stream state before capture). Capture is
    thread-local, so NCCL's watchdog thread may keep querying its events meanwhile.
    """
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


def _median_replay_us(torch: Any, graph: Any, steps: int, before: Any = None) -> float:
    """Median over ``steps`` single replays, each timed with its own pair of CUDA events."""
    for _ in range(10):
        graph.replay()
    if before is not None:
        before()
    events = []
    for _ in range(steps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return round(statistics.median(s.elapsed_time(e) for s, e in events) * 1000.0, 2)


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

    result: dict[str, Any] = {
        "rank": rank,
        "mode": "real",
        "pid": os.getpid(),
        "spawn_ms": startup_report.ms(entered - spawned_at),
        "import_ms": startup_report.ms(time.perf_counter() - t0),
    }
    tp, hidden, inter = opts["tp"], opts["hidden"], opts["intermediate"]
    tokens: list[int] = opts["tokens"]
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
    result["init_ms"] = startup_report.ms(time.perf_counter() - t0)
    _progress(rank, "NCCL communicator up")
    if warm.item() != tp:
        raise RuntimeError(f"all_reduce of ones gave {warm.item()}, expected {tp}")

    t0 = time.perf_counter()
    full_layers, mlps = [], []
    for layer in range(opts["layers"]):
        full = random_layer(hidden, inter, seed=SEED + layer, device=device)
        w13, s13, w2, s2 = shard_layer(
            full["w13"], full["w13_scale"], full["w2"], full["w2_scale"], rank, tp
        )
        mlps.append(DenseMlp(w13, s13, w2, s2, ue8m0=True))
        if rank == 0:
            full_layers.append(full)  # the reference's weights
        del full
    torch.cuda.synchronize(device)
    result["build_ms"] = startup_report.ms(time.perf_counter() - t0)
    _progress(rank, "weights built")

    dist.barrier()  # every rank starts preparing at once
    result.update(startup_report.timed_prepare(mlps, tokens))
    _progress(rank, "prepared")

    def reduce(out: Any) -> None:
        dist.all_reduce(out)

    dist.barrier()
    t0 = time.perf_counter()
    graphs = {m: _capture(torch, mlps, m, hidden, reduce) for m in tokens}
    torch.cuda.synchronize(device)
    result["capture_ms"] = startup_report.ms(time.perf_counter() - t0)
    _progress(rank, "graphs captured")

    result["step_us"] = {
        str(m): _median_replay_us(torch, graphs[m].graph, opts["steps"], before=dist.barrier)
        for m in sorted({tokens[0], tokens[-1]})
    }
    digests, snapshots, step = {}, {}, None
    for m in tokens:  # every rank replays the same graphs in the same order (collectives)
        step = graphs[m]
        step.graph.replay()
        torch.cuda.synchronize(device)
        digests[str(m)] = _digest(step.hs[-1])
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
        result["reference_ms"] = startup_report.ms(time.perf_counter() - t0)
    dist.barrier()
    # Graphs that captured NCCL collectives keep the communicator busy: drop them before
    # teardown (destroy_process_group can still hang after capture, pytorch#115388).
    del graphs, snapshots, step
    torch.cuda.synchronize(device)
    return result


def _teardown(rank: int, out_dir: str) -> None:
    """Destroy the process group; a marker file tells the parent it returned."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    Path(out_dir, f"rank-{rank}.teardown").write_text("ok")


def _rank_main(rank: int, opts: dict, spawned_at: float, out_dir: str) -> None:
    """Process entry of one rank: run it and write its result (or its error) as JSON.

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
    _teardown(rank, out_dir)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_real(opts: dict) -> list[dict]:
    """Spawn one process per rank; return their results (rank order). A rank that fails
    makes the others be stopped after a grace period (they would wait in NCCL)."""
    import torch.multiprocessing as mp

    os.environ.update(NO_MULTICAST_ENV)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    ctx = mp.get_context("spawn")
    out_dir = Path(tempfile.mkdtemp(prefix="mlpjit-tp-demo-"))
    try:
        procs = []
        for rank in range(opts["tp"]):
            proc = ctx.Process(target=_rank_main, args=(rank, opts, time.time(), str(out_dir)))
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + opts["timeout"]
        failed_at = None
        done_at = None  # when every rank had written its result
        while any(p.is_alive() for p in procs):
            if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
                failed_at = time.monotonic()
            if done_at is None and all(
                (out_dir / f"rank-{r}.json").exists() for r in range(len(procs))
            ):
                done_at = time.monotonic()
            grace_over = (failed_at is not None and time.monotonic() > failed_at + 30) or (
                done_at is not None and time.monotonic() > done_at + TEARDOWN_GRACE_S
            )
            if grace_over or time.monotonic() > deadline:
                for p in procs:  # only the processes started above
                    if p.is_alive():
                        p.terminate()
                break
            time.sleep(0.2)
        for p in procs:
            p.join(timeout=30)
        results = []
        for rank, proc in enumerate(procs):
            path = out_dir / f"rank-{rank}.json"
            if path.exists():
                result = json.loads(path.read_text())
                if "error" not in result:
                    clean = (out_dir / f"rank-{rank}.teardown").exists()
                    result["teardown"] = (
                        "clean"
                        if clean
                        else f"hung in destroy_process_group; stopped after "
                        f"{TEARDOWN_GRACE_S} s (pytorch#115388)"
                    )
                results.append(result)
            else:
                msg = f"exited {proc.exitcode} without a result (stopped, or killed)"
                results.append({"rank": rank, "error": msg})
        return results
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


# --------------------------------------------------------------------- emulated mode


def run_emulated(opts: dict, device_name: str) -> tuple[list[dict], dict]:
    """All ranks in this process, one after the other; returns (per-rank rows, check)."""
    import torch

    from mlpjit.dense_mlp import DenseMlp

    tp, hidden, inter = opts["tp"], opts["hidden"], opts["intermediate"]
    tokens: list[int] = opts["tokens"]
    device = torch.device(device_name)
    gpu = device.type == "cuda"

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    full_layers = [
        random_layer(hidden, inter, seed=SEED + layer, device=device)
        for layer in range(opts["layers"])
    ]
    sync()
    build_full_ms = startup_report.ms(time.perf_counter() - t0)

    rows, rank_mlps = [], []
    for rank in range(tp):
        row: dict[str, Any] = {"rank": rank, "mode": "emulated", "device": str(device)}
        t0 = time.perf_counter()
        mlps = []
        for full in full_layers:
            shards = shard_layer(
                full["w13"], full["w13_scale"], full["w2"], full["w2_scale"], rank, tp
            )
            mlps.append(DenseMlp(*shards, ue8m0=True))
        sync()
        row["build_ms"] = startup_report.ms(
            time.perf_counter() - t0
        )  # shard + DenseMlp (full layers: once)
        row.update(startup_report.timed_prepare(mlps, tokens))
        if gpu:  # this rank's L layers without the all-reduce
            t0 = time.perf_counter()
            graphs = {m: _capture(torch, mlps, m, hidden, None) for m in tokens}
            sync()
            row["capture_ms"] = startup_report.ms(time.perf_counter() - t0)
            row["step_us"] = {
                str(m): _median_replay_us(torch, graphs[m].graph, opts["steps"])
                for m in sorted({tokens[0], tokens[-1]})
            }
            del graphs
        rows.append(row)
        rank_mlps.append(mlps)

    check: dict[str, Any] = {"full_build_ms": build_full_ms, "per_m": {}, "bf16_sum": {}}
    t0 = time.perf_counter()
    for m in opts["check_tokens"]:
        x = random_input(m, hidden, device=device)
        check["per_m"][str(m)] = check_entry(full_layers, x, *emulated_chain(rank_mlps, x))
        check["bf16_sum"][str(m)] = check_entry(
            full_layers, x, *emulated_chain(rank_mlps, x, bf16_sum=True)
        )
    sync()
    check["check_ms"] = startup_report.ms(time.perf_counter() - t0)
    return rows, check


EMULATION_NOTE = (
    "EMULATION: one process computes the {tp} ranks' shards one after the other on {device} and "
    "sums their partial outputs in float32 (NCCL adds bf16 hop by hop; that variant is in "
    "the JSON as emulation.bf16_sum). Not covered: NCCL, the ranks' concurrent start-up (one "
    "process imports once; later ranks hit kernels the first one compiled or loaded), and "
    "the capture of the all-reduce (graphs and step times are one rank's layers alone)."
)


# --------------------------------------------------------------------- arguments and output


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return value


def _parse_tokens(text: str) -> list[int]:
    from mlpjit.cli import parse_tokens

    try:
        counts = parse_tokens(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if counts[-1] > MAX_TOKENS:
        raise argparse.ArgumentTypeError(
            f"token counts must be in 1..{MAX_TOKENS} (the decode sizes the kernels take), "
            f"got {text!r}"
        )
    return counts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the arguments (argparse exits 2 with a message naming them)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=_positive, default=8, help="tensor-parallel size N (default 8)")
    p.add_argument("--layers", type=_positive, default=3, help="dense layers (default 3)")
    p.add_argument("--tokens", type=_parse_tokens, default=list(range(1, 9)), help="e.g. 1-8")
    p.add_argument(
        "--check-tokens", type=_parse_tokens, default=[1, 8], help="checked counts (1,8)"
    )
    p.add_argument("--hidden", type=_positive, default=HIDDEN, help="hidden size (6144)")
    p.add_argument(
        "--intermediate", type=_positive, default=INTERMEDIATE, help="full intermediate (12288)"
    )
    p.add_argument("--steps", type=_positive, default=200, help="timed replays per token count")
    p.add_argument("--timeout", type=_positive, default=540, help="real mode: seconds in all")
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
    meta = torch.device("meta")
    full = {
        "w13": torch.empty(2 * inter, hidden, dtype=torch.float8_e4m3fn, device=meta),
        "w13_scale": torch.empty(2 * inter // BLOCK, hidden // BLOCK, device=meta),
        "w2": torch.empty(hidden, inter, dtype=torch.float8_e4m3fn, device=meta),
        "w2_scale": torch.empty(hidden // BLOCK, inter // BLOCK, device=meta),
    }
    c = inter // tp
    want = [
        (2 * c, hidden),
        (2 * c // BLOCK, hidden // BLOCK),
        (hidden, c),
        (hidden // BLOCK, c // BLOCK),
    ]
    for rank in range(tp):
        got = shard_layer(full["w13"], full["w13_scale"], full["w2"], full["w2_scale"], rank, tp)
        shapes = [tuple(t.shape) for t in got]
        if shapes != want:
            raise RuntimeError(f"rank {rank}: shard shapes {shapes}, expected {want}")
    paths = {m: "kernel" if kernel_supported(hidden, c, m) else "stock" for m in opts["tokens"]}
    n_requests = len(kernel_requests("sm_90a", hidden=hidden, intermediate=inter, tp=tp))
    return [
        f"tp_demo dry run: tp {tp}, {opts['layers']} layers, hidden {hidden}, intermediate "
        f"{inter} (per rank {c}), tokens {opts['tokens']}, check tokens {opts['check_tokens']}",
        f"full layer: w13 [{2 * inter}, {hidden}] s13 [{2 * inter // BLOCK}, {hidden // BLOCK}], "
        f"w2 [{hidden}, {inter}] s2 [{hidden // BLOCK}, {inter // BLOCK}]",
        f"every rank's shard: w13 {list(want[0])} s13 {list(want[1])}, w2 {list(want[2])} "
        f"s2 {list(want[3])} (checked for ranks 0..{tp - 1})",
        f"path on sm_90a per token count: {paths}; kernel_requests: {n_requests} kernels",
        "no CUDA used",
    ]


HEADER = [
    "rank",
    "mode",
    "import ms",
    "init ms",
    "build ms",
    "prepare ms",
    "hits",
    "compiles",
    "compile s",
    "lock waits",
    "cutlass",
    "capture ms",
    "step us (m min / max)",
]


def _row(r: dict) -> list[str]:
    if "error" in r:
        return [str(r["rank"]), "error", *["-"] * (len(HEADER) - 2)]
    steps = r.get("step_us", {})

    def num(key: str) -> str:
        return f"{r[key]:.0f}" if key in r else "-"

    return [
        str(r["rank"]),
        r["mode"],
        num("import_ms"),
        num("init_ms"),
        num("build_ms"),
        num("prepare_ms"),
        str(r["hits"]),
        str(r["compiles"]),
        f"{r['compile_seconds']:.2f}",
        f"{r['lock_waits']} ({r['wait_seconds']:.2f} s)",
        "yes" if r["cutlass_imported"] else "no",
        num("capture_ms"),
        " / ".join(f"{v:.1f}" for v in steps.values()) if steps else "-",
    ]


def format_table(results: list[dict]) -> str:
    """A markdown table, one row per process, plus a totals line."""
    return startup_report.format_table(results, HEADER, _row)


def format_check(per_m: dict[str, dict]) -> tuple[str, bool]:
    """The check's lines, one per token count: each layer's error against TOL (the check),
    and the chain's error (information only, see ``layer_errors``); (text, all passed)."""
    ok = bool(per_m) and all(e["max"] <= TOL for e in per_m.values())
    lines = [
        f"check: each layer's all-reduced TP output vs the full TP=1 layer "
        f"(dense_mlp_reference, ue8m0) on the same input, relative L2 <= {TOL:g}:"
    ]
    for m, e in per_m.items():
        layers = " ".join(f"{v:.2e}" for v in e["layers"])
        verdict = "ok" if e["max"] <= TOL else "FAIL"
        lines.append(
            f"  m={m}: layers {layers} (max {e['max']:.2e}) {verdict}; whole chain vs an "
            f"independent reference chain {e['chain']:.2e} (info: FP8 re-quantization "
            "amplifies rounding)"
        )
    lines.append(f"check -> {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines), ok


# --------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; 0 when every rank ran and the check passed, 1 otherwise, 2 for usage."""
    t_start = time.perf_counter()
    args = parse_args(argv)
    opts = {
        "tp": args.tp,
        "layers": args.layers,
        "hidden": args.hidden,
        "intermediate": args.intermediate,
        "tokens": args.tokens,
        "check_tokens": args.check_tokens,
        "steps": args.steps,
        "timeout": args.timeout,
    }
    if args.dry_run:
        print("\n".join(dry_run(opts)))
        return 0
    t0 = time.perf_counter()
    import torch

    import mlpjit  # noqa: F401

    import_ms = startup_report.ms(time.perf_counter() - t0)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0 and not args.emulate:
        print(
            "tp_demo: no CUDA device: pass --dry-run (shapes only) or --emulate (CPU reference "
            "math, small shapes advised)",
            file=sys.stderr,
        )
        return 2
    mode = "real" if gpus >= args.tp and not args.emulate else "emulated"
    check_ok, extra = False, {}
    if mode == "real":
        results = run_real(opts)
        per_m = next((r["check"] for r in results if "check" in r), {})
        digests = [r["output_sha256"] for r in results if "output_sha256" in r]
        same = len(digests) == args.tp and all(d == digests[0] for d in digests)
        extra["outputs_identical_across_ranks"] = same
        header = f"tp_demo: REAL tensor-parallel run, {args.tp} processes x 1 GPU, NCCL"
    else:
        device = "cuda:0" if gpus else "cpu"
        if not args.emulate:
            print(f"tp_demo: {gpus} GPU(s) < --tp {args.tp}: emulating", file=sys.stderr)
        results, check = run_emulated(opts, device)
        results[0]["import_ms"] = import_ms  # the one process's import (shown on rank 0)
        per_m = check["per_m"]
        extra["check"] = check
        extra["note"] = EMULATION_NOTE.format(tp=args.tp, device=device)
        header = (
            f"tp_demo: {extra['note']}\nfull layers built once in {check['full_build_ms']:.0f} ms"
        )
        if not gpus:
            header += "\nOn CPU: reference math, no kernels, no graphs, no step times."
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
    print("\n" + check_text)
    if mode == "real":
        print(f"outputs identical across ranks: {extra['outputs_identical_across_ranks']}")
        teardown = {r["rank"]: r["teardown"] for r in results if "teardown" in r}
        if teardown:
            print("teardown: " + "; ".join(f"rank {k} {v}" for k, v in teardown.items()))
        check_ok = check_ok and extra["outputs_identical_across_ranks"]
    else:
        bf16 = extra["check"]["bf16_sum"]
        print(
            "(ranks summed in bf16 one after the other instead, as NCCL rounds: max per layer "
            + ", ".join(f"m={m}: {e['max']:.2e}" for m, e in bf16.items())
            + ")"
        )
    if args.json:
        env = {k: os.environ.get(k) for k in (*NO_MULTICAST_ENV, "MLPJIT_CACHE_DIR")}
        data = {
            "mode": mode,
            "options": opts,
            "gpus": gpus,
            "tol": TOL,
            "check_rel_l2": {m: e["max"] for m, e in per_m.items()},
            "check": per_m,
            "passed": check_ok and not failed,
            "wall_s": round(wall, 3),
            "env": env,
            "results": results,
            **{k: v for k, v in extra.items() if k != "check"},
            **({"emulation": extra["check"]} if "check" in extra else {}),
        }
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    return 0 if check_ok and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
