"""The decode-step benchmark of tiny DeepSeek-V3 and GLM-5 transformers models behind
scripts/bench_transformers.py (its docstring: the variants, modes and how to run it):
arguments, the guarded sections of a run, timing and the per-MLP chains.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mlpjit.bench.decode_step import CACHE_SLACK, DecodeStep, capture_step
from mlpjit.bench.transformers_report import (
    add_speedups,
    markdown_report,
    merge_results,
    write_json,
)
from mlpjit.testing.layers import device_l2_bytes, layers_needed, rel_l2
from mlpjit.testing.tiny_models import (
    MIN_POSITIONS,
    MODELS,
    build_pair,
    fp8_linears,
    routed_prefixes,
)

__all__ = [
    "DECODE_TOKENS",
    "MODES",
    "VARIANTS",
    "kernel_requests",
    "main",
    "mlp_shapes",
    "parse_args",
    "positions_for",
    "step_bytes",
]

VARIANTS = ("mlpjit", "bf16", "hf_fp8")
MODES = ("eager", "graph", "compiled")
DEFAULT_MODES = ("eager", "graph")
DECODE_TOKENS = (1,)  # the token counts apply() prepares kernels for
MIN_CONTEXT = 9  # a prefill of more than 8 tokens takes DenseMlp's stock path: no kernels
DEVICE = "cuda"  # where the models and layers live (the CPU tests set "cpu")


def log(message: str) -> None:
    """One progress line on stderr."""
    print(
        f"[bench_transformers {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True
    )


def describe(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters)."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return line if len(line) <= 300 else line[:297] + "..."


def attempt(
    label: str, errors: list[dict], fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """fn(*args, **kwargs), or None with the error recorded in ``errors`` and on stderr."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # recorded; the run goes on
        message = describe(exc)
        log(f"{label}: FAILED: {message}")
        traceback.print_exc(file=sys.stderr)
        errors.append({"section": label, "error": message})
        return None


# ---- shapes and kernels ---------------------------------------------------------------------


def mlp_shapes(name: str) -> list[dict]:
    """The routed MLP shapes of a model: {"module", "hidden", "intermediate", "count"}."""
    _, hidden, dense, shared = MODELS[name]
    prefixes = routed_prefixes()
    n_shared = sum(p.endswith("shared_experts") for p in prefixes)
    return [
        {
            "module": "dense mlp",
            "hidden": hidden,
            "intermediate": dense,
            "count": len(prefixes) - n_shared,
        },
        {"module": "shared expert", "hidden": hidden, "intermediate": shared, "count": n_shared},
    ]


def kernel_requests(arch: str = "sm_90a", models: Sequence[str] = tuple(MODELS)) -> list:
    """The compile requests the benchmark needs: both kernels of each routed MLP shape at 1
    token, ue8m0=False and no clamp (apply()'s defaults; the per-MLP chains use the same).
    Shapes the kernels do not take (mlpjit.dense_mlp.kernel_supported) run DenseMlp's stock
    path and need none."""
    from mlpjit.dense_mlp import kernel_requests as layer_requests

    requests = []
    for name in models:
        for shape in mlp_shapes(name):
            for r in layer_requests(
                shape["hidden"], shape["intermediate"], DECODE_TOKENS, arch, limit=None, ue8m0=False
            ):
                if r not in requests:
                    requests.append(r)
    return requests


# ---- arguments ------------------------------------------------------------------------------


def _choices(text: str, allowed: Sequence[str], flag: str, p: argparse.ArgumentParser) -> list[str]:
    items = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        p.error(f"{flag}: unknown {bad or text!r}; allowed: {', '.join(allowed)}")
    return items


def parse_args(
    argv: Sequence[str] | None = None, description: str | None = None
) -> argparse.Namespace:
    """The benchmark's arguments, checked (argparse exits 2); ``description``: the --help text
    (the script's docstring)."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of {list(MODELS)}")
    p.add_argument(
        "--tokens-context",
        default="64",
        help=f"comma list of context lengths (tokens cached before the step, >= {MIN_CONTEXT})",
    )
    p.add_argument("--steps", type=int, default=100, help="timed decode steps per mode (>= 1)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (>= 0)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma list of {MODES}")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {VARIANTS}")
    p.add_argument(
        "--no-compile-fallback",
        action="store_true",
        help="do not try the compiled mode where a graph capture failed",
    )
    p.add_argument(
        "--experts-implementation",
        default=None,
        help="transformers' routed experts code: eager, grouped_mm, batched_mm (default: its pick)",
    )
    p.add_argument(
        "--mlp-replays", type=int, default=100, help="graph replays per MLP chain (0: skip)"
    )
    p.add_argument("--l2-multiple", type=float, default=4.0, help="MLP chain weights / L2 size")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the kernels; no GPU")
    p.add_argument(
        "--report-from",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="print the report of saved results (several: merged, e.g. one run per model)",
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.model_list = _choices(args.models, tuple(MODELS), "--models", p)
    args.mode_list = _choices(args.modes, MODES, "--modes", p)
    args.variant_list = _choices(args.variants, VARIANTS, "--variants", p)
    try:
        args.context_list = list(
            dict.fromkeys(int(t) for t in args.tokens_context.split(",") if t.strip())
        )
    except ValueError:
        p.error(f"--tokens-context must be a comma list of ints, got {args.tokens_context!r}")
    if not args.context_list or min(args.context_list) < MIN_CONTEXT:
        p.error(
            f"--tokens-context must be >= {MIN_CONTEXT} (a prefill of 1-8 tokens would need "
            f"kernels this benchmark does not prepare), got {args.tokens_context!r}"
        )
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.warmup < 0 or args.mlp_replays < 0:
        p.error("--warmup and --mlp-replays must be >= 0")
    if not args.l2_multiple > 0:
        p.error("--l2-multiple must be > 0")
    missing = [str(f) for f in args.report_from or () if not f.is_file()]
    if missing:
        p.error(f"--report-from: no such file {', '.join(missing)}")
    return args


def positions_for(contexts: Sequence[int]) -> int:
    """max_position_embeddings (and GLM-5's index_topk) covering every static cache."""
    longest = max(contexts) + CACHE_SLACK
    return max(MIN_POSITIONS, -(-longest // MIN_POSITIONS) * MIN_POSITIONS)


# ---- models ---------------------------------------------------------------------------------


def step_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights one decode token reads: every parameter but the embedding (one
    row of it), routed experts counted for top-k of them."""
    config = model.config
    share = config.num_experts_per_tok / config.n_routed_experts
    total = 0.0
    for name, p in model.named_parameters():
        nbytes = p.numel() * p.element_size()
        if "embed_tokens" in name:
            nbytes = p.shape[-1] * p.element_size()
        elif ".mlp.experts." in name:
            nbytes *= share
        total += nbytes
    return int(total)


# ---- timing ---------------------------------------------------------------------------------


def _timed(
    call: Callable[[], object], before: Callable[[], object], steps: int, warmup: int
) -> list[float]:
    """Microseconds of each of ``steps`` calls, each between its own CUDA events, with
    ``before()`` (untimed) ahead of every call; ``warmup`` untimed rounds first."""
    for _ in range(warmup):
        before()
        call()
    torch.cuda.synchronize()
    events = []
    for _ in range(steps):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in events]


def summarize(times_us: list[float]) -> dict[str, float]:
    ordered = sorted(times_us)

    def q(f: float) -> float:
        return ordered[min(len(ordered) - 1, int(f * len(ordered)))]

    return {"step_us": statistics.median(ordered), "p10_us": q(0.1), "p90_us": q(0.9)}


def measure_mode(
    step: DecodeStep, mode: str, args: argparse.Namespace
) -> tuple[dict, torch.Tensor]:
    """(timing summary, the step's logits) of one mode."""
    if mode == "eager":
        times = _timed(step.run, step.rewind, args.steps, args.warmup)
        return summarize(times), step().float().cpu()
    if mode == "graph":
        graph, logits = capture_step(step)
        try:
            times = _timed(graph.replay, step.rewind, args.steps, args.warmup)
            step.rewind()
            graph.replay()
            return summarize(times), logits.float().cpu()
        finally:
            del graph
    if mode == "compiled":
        # a fresh compile per model and context: no recompile limit reached, no stale graph
        step.model.__dict__.pop("_compiled_call", None)
        _reset_compiler()
        compiled = step.model.get_compiled_call(None)
        t0 = time.perf_counter()
        for _ in range(3):  # cudagraph trees record on the first calls
            step(compiled)
        torch.cuda.synchronize()
        log(f"  compiled in {time.perf_counter() - t0:.1f} s")
        times = _timed(lambda: step.run(compiled), step.rewind, args.steps, args.warmup)
        return summarize(times), step(compiled).float().cpu()
    raise ValueError(f"unknown mode {mode!r}")


# ---- per-MLP chains -------------------------------------------------------------------------


def bench_mlp(shape: dict, args: argparse.Namespace, l2_bytes: int, bw: float) -> dict:
    """DenseMlp alone at 1 token on one shape, against the bf16 module math and the floor."""
    from mlpjit import DenseMlp
    from mlpjit.testing.layers import TIMING_SCALE, graph_times, layer_bytes, random_fp8_layer

    hidden, inter = shape["hidden"], shape["intermediate"]
    n = layers_needed(hidden, inter, l2_bytes, args.l2_multiple)
    gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
    row = {**shape, "tokens": 1, "layers": n, "floor_us": layer_bytes(hidden, inter) / bw * 1e6}
    errors = row.setdefault("errors", [])
    x = torch.randn(1, hidden, generator=gen, device=DEVICE).to(torch.bfloat16)

    def fp8_chain() -> None:
        mlps = [
            DenseMlp(**random_fp8_layer(hidden, inter, gen, scale=TIMING_SCALE), ue8m0=False)
            for _ in range(n)
        ]
        for mlp in mlps:
            mlp.prepare(DECODE_TOKENS)
        row["path"] = mlps[0].path(1)

        def run() -> None:
            for mlp in mlps:
                mlp(x)

        times = graph_times(run, args.mlp_replays, 10)
        row["mlpjit_us"] = statistics.median(times) * 1e3 / n
        row["floor_ratio"] = row["mlpjit_us"] / row["floor_us"]

    def bf16_chain() -> None:
        def weight(rows: int, k: int) -> torch.Tensor:
            w = torch.randn(rows, k, generator=gen, device=DEVICE) / k**0.5
            return w.to(torch.bfloat16)

        layers = [
            (weight(inter, hidden), weight(inter, hidden), weight(hidden, inter)) for _ in range(n)
        ]
        F = torch.nn.functional

        def run() -> None:
            for gate, up, down in layers:
                F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)

        times = graph_times(run, args.mlp_replays, 10)
        row["bf16_us"] = statistics.median(times) * 1e3 / n

    attempt(f"mlp {hidden}x{inter} mlpjit", errors, fp8_chain)
    torch.cuda.empty_cache()
    attempt(f"mlp {hidden}x{inter} bf16", errors, bf16_chain)
    torch.cuda.empty_cache()
    if "mlpjit_us" in row and "bf16_us" in row:
        row["speedup_vs_bf16"] = row["bf16_us"] / row["mlpjit_us"]
    if not errors:
        del row["errors"]
    return row


# ---- one model ------------------------------------------------------------------------------


def hf_fp8_status(model: torch.nn.Module, prefix: str) -> str | None:
    """None where transformers' own FP8Linear runs (one call of an unpatched FP8 MLP),
    else "not available: <reason>"."""
    try:
        module = model.get_submodule(prefix)
        hidden = module.down_proj.weight.shape[0]
        x = torch.randn(1, 1, hidden, device=DEVICE, dtype=torch.bfloat16)
        with torch.no_grad():
            y = module(x)
        torch.cuda.synchronize()
    except Exception as exc:  # ImportError (no kernels package), the Hub unreachable, ...
        return f"not available: {describe(exc)}"
    if not bool(torch.isfinite(y).all()):
        return "not available: non-finite output"
    return None


def bench_variant(
    name: str,
    variant: str,
    model: torch.nn.Module,
    args: argparse.Namespace,
    reference: dict[int, torch.Tensor],
    info: dict,
    bw: float,
) -> list[dict]:
    """The decode-step rows of one variant of one model, every context and mode."""
    rows = []
    floor_us = step_bytes(model) / bw * 1e6
    info.setdefault("step_bytes", {})[variant] = step_bytes(model)
    for context in args.context_list:
        label = f"{name} ctx={context} {variant}"
        step = attempt(
            f"{label} prefill", info["errors"], DecodeStep, model, context, seed=args.seed
        )
        if step is None:
            rows.append(_row(name, context, variant, "-", error="prefill failed"))
            continue
        modes = list(args.mode_list)
        eager_logits = None
        for mode in modes:
            log(f"{label} {mode}")
            try:
                summary, logits = measure_mode(step, mode, args)
            except Exception as exc:
                message = describe(exc)
                log(f"{label} {mode}: FAILED: {message}")
                traceback.print_exc(file=sys.stderr)
                info["errors"].append({"section": f"{label} {mode}", "error": message})
                rows.append(_row(name, context, variant, mode, error=message))
                _recover()
                if mode == "graph" and "compiled" not in modes and not args.no_compile_fallback:
                    log(f"{label}: graph capture failed, trying transformers' compile path")
                    modes.append("compiled")
                continue
            row = _row(name, context, variant, mode, **summary)
            row["floor_us"] = floor_us
            row["floor_ratio"] = summary["step_us"] / floor_us
            if variant == "bf16" and context not in reference:
                reference[context] = logits  # eager's, or the first mode's that ran
            if mode == "eager":
                eager_logits = logits
            elif eager_logits is not None:
                row["logits_rel_l2_vs_eager"] = rel_l2(logits, eager_logits)
            if variant != "bf16" and context in reference:
                row["logits_rel_l2_vs_bf16"] = rel_l2(logits, reference[context])
            rows.append(row)
            log(f"{label} {mode}: {summary['step_us']:.1f} us (floor {floor_us:.1f} us)")
        del step
        torch.cuda.empty_cache()
    return rows


def _row(name: str, context: int, variant: str, mode: str, **values: Any) -> dict:
    return {"model": name, "context": context, "variant": variant, "mode": mode, **values}


def _recover() -> None:
    """After a failed capture or compile: let the device settle (errors ignored)."""
    try:
        torch.cuda.synchronize()
    except Exception as exc:
        log(f"synchronize after the failure: {describe(exc)}")
    gc.collect()


def bench_model(
    name: str, args: argparse.Namespace, bw: float, results: dict, save: Callable[[], None]
) -> None:
    """One model's decode-step rows into ``results["steps"]`` and its info into
    ``results["models"][name]``, saved after each variant; every section guarded."""
    from mlpjit import ops
    from mlpjit.integrations import transformers as mlpjit_hf

    arch, hidden, dense, shared = MODELS[name]
    info: dict[str, Any] = {
        "arch": arch,
        "hidden": hidden,
        "dense": dense,
        "shared": shared,
        "errors": [],
    }
    results["models"][name] = info

    def add(rows: list[dict]) -> None:
        results["steps"] += rows
        add_speedups(results["steps"])
        save()

    log(f"{name}: building ({arch}, hidden {hidden}, dense {dense}, shared expert {shared})")
    pair = attempt(
        f"{name} build",
        info["errors"],
        build_pair,
        arch,
        hidden,
        dense,
        shared,
        device=DEVICE,
        positions=positions_for(args.context_list),
        seed=args.seed,
        experts_implementation=args.experts_implementation,
    )
    if pair is None:
        save()
        return
    fp8, bf16 = pair
    info["fp8"] = "replace_with_fp8_linear + Fp8Quantize"
    info["experts_implementation"] = getattr(bf16.config, "_experts_implementation", None)
    info["converted"] = fp8_linears(fp8)
    expected = routed_prefixes(bf16.config.num_hidden_layers, bf16.config.first_k_dense_replace)
    reference: dict[int, torch.Tensor] = {}  # context -> the bf16 model's eager logits
    try:
        if "bf16" in args.variant_list:  # first: the others compare their logits with these
            add(bench_variant(name, "bf16", bf16, args, reference, info, bw))
        else:
            for context in args.context_list:
                label = f"{name} ctx={context} bf16 reference"
                step = attempt(label, info["errors"], DecodeStep, bf16, context, seed=args.seed)
                if step is not None:
                    reference[context] = step().float().cpu()
        if "mlpjit" in args.variant_list:
            routed = attempt(f"{name} apply", info["errors"], mlpjit_hf.apply, fp8, DECODE_TOKENS)
            info["routed"] = routed
            if routed is not None and routed != expected:
                info["errors"].append(
                    {"section": f"{name} apply", "error": f"routed {routed}, expected {expected}"}
                )
            if routed:
                info["paths"] = {
                    n: fp8.get_submodule(n).forward.__self__.mlp.path(1) for n in routed
                }
                add(bench_variant(name, "mlpjit", fp8, args, reference, info, bw))
            mlpjit_hf.remove(fp8)
        if "hf_fp8" in args.variant_list:
            # the same model object unpatched: no compiled call of the routed one may be reused
            fp8.__dict__.pop("_compiled_call", None)
            _reset_compiler()
            log(f"{name}: probing transformers' own FP8 path (its kernel comes from the Hub)")
            status = hf_fp8_status(fp8, expected[0])
            info["hf_fp8"] = status or "available"
            if status is None:
                add(bench_variant(name, "hf_fp8", fp8, args, reference, info, bw))
            else:
                log(f"{name}: transformers' FP8 path {status}")
                save()
    finally:
        mlpjit_hf.remove(fp8)
        ops.clear_registry()  # it holds the routed weights
        del fp8, bf16, pair
        _reset_compiler()
        gc.collect()
        torch.cuda.empty_cache()


def _reset_compiler() -> None:
    try:
        torch._dynamo.reset()
    except Exception as exc:
        log(f"torch._dynamo.reset: {describe(exc)}")


# ---- run ------------------------------------------------------------------------------------


def _meta(args: argparse.Namespace, argv: Sequence[str]) -> dict:
    import transformers

    import mlpjit

    meta = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "mlpjit": mlpjit.__version__,
        "python": platform.python_version(),
        "models": args.model_list,
        "contexts": args.context_list,
        "modes": args.mode_list,
        "variants": args.variant_list,
        "steps": args.steps,
        "warmup": args.warmup,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python3 scripts/bench_transformers.py " + " ".join(argv),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        meta["gpu"] = props.name
        meta["l2_bytes"] = device_l2_bytes()
    return meta


def dry_run(args: argparse.Namespace) -> int:
    from mlpjit.dense_mlp import kernel_supported

    print("dry run: nothing measured")
    for name in args.model_list:
        arch = MODELS[name][0]
        shapes = ", ".join(
            f"{s['module']} {s['hidden']}x{s['intermediate']} x{s['count']} "
            f"({'kernel' if kernel_supported(s['hidden'], s['intermediate'], 1) else 'stock'})"
            for s in mlp_shapes(name)
        )
        print(f"{name}: {arch}; {shapes}")
    print(
        f"contexts {args.context_list} (static cache +{CACHE_SLACK}, max_position_embeddings "
        f"{positions_for(args.context_list)}); variants {args.variant_list}; modes "
        f"{args.mode_list}; {args.steps} steps after {args.warmup} warm-up"
    )
    print(f"kernels needed: {len(kernel_requests('sm_90a', args.model_list))}")
    return 0


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """Report saved results (--report-from), plan (--dry-run), or measure on the GPU."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv, description)
    if args.report_from:
        parts = [json.loads(path.read_text()) for path in args.report_from]
        print(markdown_report(merge_results(parts)))
        return 0
    if args.dry_run:
        return dry_run(args)
    if not torch.cuda.is_available():
        print("error: no CUDA device (use --dry-run to check arguments)", file=sys.stderr)
        return 2
    from mlpjit.testing.layers import copy_bandwidth

    results: dict[str, Any] = {
        "meta": _meta(args, argv),
        "steps": [],
        "mlps": [],
        "models": {},
        "errors": [],
    }
    meta = results["meta"]
    log(f"{meta['gpu']}, torch {meta['torch']}, transformers {meta['transformers']}")
    bw = attempt("copy bandwidth", results["errors"], copy_bandwidth)
    if bw is None:
        print(markdown_report(results))
        return 1
    results["meta"]["copy_bandwidth_gbs"] = bw / 1e9
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    l2_bytes = results["meta"]["l2_bytes"]

    def save() -> None:
        if args.json is not None:
            attempt("write json", results["errors"], write_json, results, args.json)

    for name in args.model_list:
        attempt(name, results["errors"], bench_model, name, args, bw, results, save)
        if args.mlp_replays:  # the per-MLP chains of this model's shapes
            for shape in mlp_shapes(name):
                log(f"{name}: {shape['module']} {shape['hidden']}x{shape['intermediate']} alone")
                label = f"{name} {shape['module']}"
                row = attempt(label, results["errors"], bench_mlp, shape, args, l2_bytes, bw)
                if row is not None:
                    results["mlps"].append({"model": name, **row})
        save()
    print(markdown_report(results))
    if args.json is not None:
        print(f"\njson: {args.json}")
    return 0
