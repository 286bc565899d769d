"""The DenseMlp benchmark behind scripts/bench_dense_mlp.py (its docstring: the methods and
how to run it): arguments, the timed chains of each shape, the report table and JSON."""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from mlpjit.bench.cli_args import add_norm_between
from mlpjit.testing.layers import (
    DENSE_SHAPES,
    GRID_SHAPES,
    L2_BYTES_H200,
    TIMING_SCALE,
    between_layers,
    copy_bandwidth,
    device_l2_bytes,
    graph_times,
    layer_bytes,
    layer_shapes,
    layers_needed,
    norms_alone,
    random_fp8_layer,
)

# The checkout (the scripts run from one: pip install -e .): --out-dir's default is in it.
REPO = Path(__file__).resolve().parents[2]
# The default shapes, name -> (hidden, intermediate per TP shard); --shapes takes any
# DENSE_SHAPES name (every preset's dense and shared-expert shards).
SHAPES = {
    name: DENSE_SHAPES[name]
    for name in (
        "glm5-tp8",
        "glm5-tp4",
        "glm5-tp1",
        "glm4.5-tp8",
        "deepseek-v3-tp8",
        "deepseek-v3-shared-tp8",
        "deepseek-v3-shared-tp1",
        "qwen3-32b-tp8",
    )
}
DEFAULT_TOKENS = (1, 2, 4, 8)
# --l2-resident: calls of one layer in a chain (weights of the largest benchmark shape below
# 60 MB stay in the H200's L2).
L2_RESIDENT_CALLS = 40
METHODS = ("mlpjit", "mlpjit_nopdl", "stock", "scaled_mm", "bf16")


def kernel_requests(arch: str = "sm_90a", shapes: Sequence[str] = tuple(SHAPES)) -> list:
    """The compile requests the benchmark needs (warm a cache with them on a CPU box)."""
    from mlpjit.dense_mlp import kernel_requests as layer_requests

    requests = []
    for hidden, inter in layer_shapes(shapes).values():
        requests += layer_requests(hidden, inter, DEFAULT_TOKENS, arch, limit=None, ue8m0=True)
    return requests


# ---- arguments --------------------------------------------------------------------------------


def parse_args(
    argv: Sequence[str] | None = None, description: str | None = None
) -> argparse.Namespace:
    """The benchmark's arguments, checked (argparse exits 2); ``description``: the --help
    text (the script's docstring)."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        help=f"comma list of {', '.join(DENSE_SHAPES)}, or of h<hidden>-i<intermediate> names "
        f"(multiples of 128, e.g. the grid's h6144-i2816; default: {', '.join(SHAPES)})",
    )
    p.add_argument(
        "--grid",
        action="store_true",
        help="add the off-table grid: hidden 2048-8192 x intermediate shard 256-4864 (36 "
        "shapes no preset has, planned without a table entry)",
    )
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="e.g. 1,2,4,8")
    p.add_argument("--replays", type=int, default=200, help="timed graph replays (>= 1)")
    p.add_argument("--warmup", type=int, default=10, help="untimed replays first")
    p.add_argument("--l2-multiple", type=float, default=4.0, help="chain weights / L2 size")
    p.add_argument(
        "--l2-resident",
        action="store_true",
        help=f"chain {L2_RESIDENT_CALLS} calls of one layer instead (its weights stay in "
        "L2): what the kernels take without HBM",
    )
    add_norm_between(p)
    p.add_argument("--host-calls", type=int, default=100, help="eager calls per host batch")
    p.add_argument("--fp32-scales", action="store_true", help="activation scales not ue8m0")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {METHODS}")
    p.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--json", type=Path, default=None, help="exact JSON path (else in --out-dir)")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    p.add_argument("--plot-from", type=Path, default=None, help="plot/table an existing JSON")
    p.add_argument("--quick", action="store_true", help="glm5-tp8, tokens 1,8, 30 replays")
    p.add_argument("--dry-run", action="store_true", help="check arguments and plan; no GPU")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.tokens, args.replays, args.warmup = "glm5-tp8", "1,8", 30, 3
        args.host_calls = 50
    args.shape_list = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if not args.shape_list:
        p.error(f"--shapes: no shape in {args.shapes!r}")
    if args.grid:
        args.shape_list += [name for name in GRID_SHAPES if name not in args.shape_list]
    try:
        args.shape_dims = layer_shapes(args.shape_list)
    except ValueError as err:
        p.error(f"--shapes: {err}")
    args.method_list = _choices(args.methods, METHODS, "--methods", p)
    try:
        args.token_list = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        p.error(f"--tokens must be a comma list of ints >= 1, got {args.tokens!r}")
    if not args.token_list or min(args.token_list) < 1:
        p.error(f"--tokens must be a comma list of ints >= 1, got {args.tokens!r}")
    for name in ("replays", "host_calls"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if not args.l2_multiple > 0:
        p.error("--l2-multiple must be > 0")
    if args.plot_from is not None and not args.plot_from.is_file():
        p.error(f"--plot-from: no such file {args.plot_from}")
    return args


def _choices(text: str, allowed: Sequence[str], flag: str, p: argparse.ArgumentParser) -> list:
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        p.error(f"{flag}: unknown {bad or text!r}; allowed: {', '.join(allowed)}")
    return items


# ---- timing -----------------------------------------------------------------------------------


def host_overhead_us(call: Callable[[], object], calls: int, batches: int = 20) -> float:
    """Median host time per eager call (batches short enough not to fill the launch queue).

    The warm-up is long on purpose: on the H200 test host the first few thousand calls of a
    loop ran up to 1.5x slower than the rest (CPU clocks ramping up, presumably).
    """
    for _ in range(2000):
        call()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        per_call.append((time.perf_counter() - t0) / calls)
        torch.cuda.synchronize()
    return statistics.median(per_call) * 1e6


# ---- one shape --------------------------------------------------------------------------------


def bench_shape(name: str, args: argparse.Namespace, l2_bytes: int, bw: float) -> list[dict]:
    from mlpjit import DenseMlp, stock

    hidden, inter = args.shape_dims[name]
    n_layers = layers_needed(hidden, inter, l2_bytes, args.l2_multiple)
    distinct = n_layers  # weight sets; --l2-resident: one, called n_layers times
    if args.l2_resident:
        n_layers, distinct = L2_RESIDENT_CALLS, 1
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    ue8m0 = not args.fp32_scales
    fp8_layers = [random_fp8_layer(hidden, inter, gen, scale=TIMING_SCALE) for _ in range(distinct)]
    mlps = [DenseMlp(**w, ue8m0=ue8m0) for w in fp8_layers]
    for mlp in mlps:
        mlp.prepare(args.token_list)
    stock_scales = [
        (
            stock.weight_scale_operand(w["w13_scale"], 2 * inter, hidden),
            stock.weight_scale_operand(w["w2_scale"], hidden, inter),
        )
        for w in fp8_layers
    ]
    bf16_layers = []
    if "bf16" in args.method_list:
        # scaled by 1/sqrt(k) so a chain of layers neither overflows nor vanishes
        bf16_layers = [
            (
                (torch.randn(2 * inter, hidden, generator=gen, device="cuda") / hidden**0.5).to(
                    torch.bfloat16
                ),
                (torch.randn(hidden, inter, generator=gen, device="cuda") / inter**0.5).to(
                    torch.bfloat16
                ),
            )
            for _ in range(distinct)
        ]
    # The chain: each weight set called n_layers / distinct times in a row of sets.
    calls = n_layers // distinct
    fp8_layers, mlps, stock_scales, bf16_layers = (
        chain * calls for chain in (fp8_layers, mlps, stock_scales, bf16_layers)
    )
    floor_us = layer_bytes(hidden, inter) / bw * 1e6
    between = between_layers(args.norm_between)
    rows = []
    for m in args.token_list:
        x = (torch.randn(m, hidden, generator=gen, device="cuda")).to(torch.bfloat16)
        xq, xs = stock.quantize_operand(x, ue8m0)
        act = torch.randn(m, inter, generator=gen, device="cuda").to(torch.bfloat16)
        aq, as_ = stock.quantize_operand(act, ue8m0)

        def run_mlpjit(x: torch.Tensor = x) -> torch.Tensor:
            y = x
            for mlp in mlps:
                between(y)
                y = mlp(y)
            return y

        def run_stock(x: torch.Tensor = x) -> torch.Tensor:
            y = x
            for w, (s13, s2) in zip(fp8_layers, stock_scales, strict=True):
                between(y)
                y = stock.forward(y, w["w13"], w["w2"], s13, s2, ue8m0=ue8m0)[1]
            return y

        def run_scaled_mm(xq=xq, xs=xs, aq=aq, as_=as_, x=x) -> None:
            for w, (s13, s2) in zip(fp8_layers, stock_scales, strict=True):
                between(x)
                stock.gemm(xq, xs, w["w13"], s13)
                stock.gemm(aq, as_, w["w2"], s2)

        def run_bf16(x: torch.Tensor = x) -> torch.Tensor:
            y = x
            for w13, w2 in bf16_layers:
                between(y)
                gate_up = torch.mm(y, w13.t())
                act = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
                y = torch.mm(act, w2.t())
            return y

        runners = {
            "mlpjit": run_mlpjit,
            "mlpjit_nopdl": run_mlpjit,  # run with DenseMlp.pdl = False, see below
            "stock": run_stock,
            "scaled_mm": run_scaled_mm,
            "bf16": run_bf16,
        }
        row: dict = {
            "shape": name,
            "hidden": hidden,
            "intermediate": inter,
            "tokens": m,
            "layers": n_layers,
            "chain_mb": round(distinct * layer_bytes(hidden, inter) / 2**20, 1),
            "path": mlps[0].path(m),
            "floor_us": floor_us,
        }
        for method in args.method_list:
            if method == "mlpjit_nopdl":
                # PDL must be off while capturing: the flag is read at launch (capture) time.
                for mlp in mlps:
                    mlp.pdl = False
                try:
                    times = graph_times(run_mlpjit, args.replays, args.warmup)
                finally:
                    for mlp in mlps:
                        mlp.pdl = None
            else:
                times = graph_times(runners[method], args.replays, args.warmup)
            per_layer = [t * 1e3 / n_layers for t in times]
            row[f"{method}_us"] = statistics.median(per_layer)
            row[f"{method}_p10_us"] = _quantile(per_layer, 0.1)
            row[f"{method}_p90_us"] = _quantile(per_layer, 0.9)
        if args.norm_between:
            times = graph_times(norms_alone(x, n_layers), args.replays, args.warmup)
            row["norm_us"] = statistics.median(t * 1e3 / n_layers for t in times)
        if "mlpjit" in args.method_list:
            row["host_us"] = host_overhead_us(functools.partial(mlps[0], x), args.host_calls)
            # The same measure for one torch elementwise op right after: this CPU's scale.
            row["host_torch_op_us"] = host_overhead_us(functools.partial(x.mul, 1), args.host_calls)
            row["floor_ratio"] = (row["mlpjit_us"] - row.get("norm_us", 0.0)) / floor_us
            for other in ("stock", "scaled_mm", "bf16", "mlpjit_nopdl"):
                if f"{other}_us" in row:
                    row[f"speedup_vs_{other}"] = row[f"{other}_us"] / row["mlpjit_us"]
        rows.append(row)
        print(_row_line(row), flush=True)
    for held in (mlps, fp8_layers, bf16_layers, stock_scales):
        held.clear()  # free this shape's weights before the next one
    torch.cuda.empty_cache()
    return rows


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _row_line(row: dict) -> str:
    parts = [f"{row['shape']} m={row['tokens']} ({row['layers']} layers, {row['path']})"]
    parts += [f"{k[:-3]}={row[k]:.2f}us" for k in row if k.endswith("_us") and "_p" not in k]
    return "  ".join(parts)


# ---- report -----------------------------------------------------------------------------------


def _fmt(row: dict, key: str, spec: str = ".2f") -> str:
    value = row.get(key)
    return "-" if value is None else format(value, spec)


def markdown_table(rows: list[dict]) -> str:
    head = (
        "| shape | tokens | mlpjit us | floor us | x floor | PDL off us | stock us | "
        "2x _scaled_mm us | bf16 mm us | vs stock | vs _scaled_mm | host us/call | "
        "torch op host us | norm us |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['tokens']} | {_fmt(r, 'mlpjit_us')} | {_fmt(r, 'floor_us')} | "
            f"{_fmt(r, 'floor_ratio', '.3f')} | {_fmt(r, 'mlpjit_nopdl_us')} | "
            f"{_fmt(r, 'stock_us')} | {_fmt(r, 'scaled_mm_us')} | {_fmt(r, 'bf16_us')} | "
            f"{_fmt(r, 'speedup_vs_stock')}x | {_fmt(r, 'speedup_vs_scaled_mm')}x | "
            f"{_fmt(r, 'host_us', '.1f')} | {_fmt(r, 'host_torch_op_us', '.1f')} | "
            f"{_fmt(r, 'norm_us')} |"
        )
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """One panel per shape: per-layer time vs tokens for every method and the floor."""
    from mlpjit.bench import plots

    plots.dense_mlp(results, path, (*METHODS, "floor"))
    print(f"plot: {path}")


def _meta(args: argparse.Namespace, l2_bytes: int, bw: float, argv: Sequence[str]) -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "l2_bytes": l2_bytes,
        "copy_bandwidth_gbs": bw / 1e9,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "ue8m0": not args.fp32_scales,
        "replays": args.replays,
        "l2_multiple": args.l2_multiple,
        "l2_resident": args.l2_resident,
        "norm_between": args.norm_between,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python3 scripts/bench_dense_mlp.py " + " ".join(argv),
    }


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """Run the benchmark (or --dry-run / --plot-from); 2 without a GPU. ``description``: the
    --help text (the script's docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv, description)
    if args.plot_from is not None:
        results = json.loads(args.plot_from.read_text())
        print(markdown_table(results["results"]))
        if args.plot is not None:
            plot(results, args.plot)
        return 0
    if args.dry_run:
        from mlpjit.dense_mlp import kernel_supported

        print("dry run: nothing measured")
        for name in args.shape_list:
            hidden, inter = args.shape_dims[name]
            n = layers_needed(hidden, inter, L2_BYTES_H200, args.l2_multiple)
            paths = {
                m: "kernel" if kernel_supported(hidden, inter, m) else "stock"
                for m in args.token_list
            }
            chain = f"{n} layers x"
            if args.l2_resident:
                chain = f"{L2_RESIDENT_CALLS} calls of one layer (L2-resident) of"
            print(
                f"{name}: hidden {hidden}, intermediate {inter}, {chain} "
                f"{layer_bytes(hidden, inter) / 2**20:.1f} MiB; tokens -> path {paths}"
            )
        print(f"methods {args.method_list}; {args.replays} replays after {args.warmup} warm-up")
        if args.norm_between:
            print("a torch kernel (no PDL) before every layer, timed alone too (norm_us)")
        print(f"kernels needed: {len(kernel_requests('sm_90a', args.shape_list))}")
        return 0
    if not torch.cuda.is_available():
        print("error: no CUDA device (use --dry-run to check arguments)", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    l2_bytes = device_l2_bytes()
    bw = copy_bandwidth()
    print(f"{props.name}: L2 {l2_bytes / 2**20:.0f} MiB, copy bandwidth {bw / 1e12:.2f} TB/s")
    rows = []
    for name in args.shape_list:
        rows += bench_shape(name, args, l2_bytes, bw)
    results = {"meta": _meta(args, l2_bytes, bw, argv), "results": rows}
    path = args.json
    if path is None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = args.out_dir / f"dense_mlp-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{markdown_table(rows)}\n\njson: {path}")
    if args.plot is not None:
        plot(results, args.plot)
    return 0
