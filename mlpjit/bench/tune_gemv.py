"""The fp8_gemv tuning sweep behind scripts/tune_fp8_gemv.py (its docstring: the modes and
how to run them): arguments, timing the variants of mlpjit.bench.gemv_sweep over chains of
weights on the GPU, and the report.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlpjit.bench import sweep_compare
from mlpjit.bench.cli_args import add_norm_between, add_rounds
from mlpjit.bench.gemv_sweep import (
    ARCH,
    DEFAULT_KERNEL_SHAPES,
    DEFAULT_LAYER_SHAPES,
    GRID_LAYER_NAMES,
    KERNEL_SHAPES,
    KERNEL_TOKENS,
    LAYER_SHAPES,
    LAYER_TOKENS,
    default_config,
    gemv_request,
    kernel_requests,
    label,
    layer_requests,
    layer_shape,
    pair_requests,
    pairs,
    parse_config,
    variants,
)
from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels.fp8_gemv import tuning
from mlpjit.kernels.fp8_gemv.params import CLUSTER_SIZES, MAX_TOKENS, GemvConfig
from mlpjit.testing.layers import (
    TIMING_SCALE,
    between_layers,
    chain_length,
    copy_bandwidth,
    device_l2_bytes,
    graph_rounds,
    layers_needed,
    norms_alone,
    random_fp8_weight,
    weight_bytes,
)

__all__ = ["dry_run", "main", "markdown_table", "parse_args"]


def _kernel_variants(args: argparse.Namespace, name: str, m: int) -> list[GemvConfig]:
    rows, k, swiglu = KERNEL_SHAPES[name]
    return variants(
        rows,
        k,
        m,
        swiglu,
        spws=args.spw_list,
        spw_tiles=args.spw_tiles_list,
        clusters=args.cluster_list,
    )


def _layer_pairs(args: argparse.Namespace, name: str, m: int) -> list:
    hidden, inter = layer_shape(name)
    return pairs(
        hidden, inter, m, args.extra_down, args.extra_gate_up, args.cluster_list, args.spread,
        args.send_x, args.late_list, args.paced_list, args.paced_down_list,
        args.paced_regs_list,
    )  # fmt: skip


# ---- arguments -------------------------------------------------------------------------------


def _ints(text: str, flag: str, p: argparse.ArgumentParser) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        p.error(f"{flag} must be a comma list of ints, got {text!r}")


def _check(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Parse the comma lists into args.*_list and check them (p.error exits 2)."""
    args.shape_list = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if args.mode == "kernel":
        unknown = [s for s in args.shape_list if s not in KERNEL_SHAPES]
        allowed = ", ".join(KERNEL_SHAPES)
    else:
        if "grid" in args.shape_list:
            at = args.shape_list.index("grid")
            args.shape_list[at : at + 1] = GRID_LAYER_NAMES
        unknown = [s for s in args.shape_list if layer_shape(s) is None]
        allowed = (
            f"{', '.join(LAYER_SHAPES)}, 'grid' (the off-table grid's shapes fp8_gemv takes) "
            "or h<hidden>-i<intermediate> (multiples of 128)"
        )
    if unknown or not args.shape_list:
        p.error(f"--shapes: unknown {unknown or args.shapes!r}; allowed: {allowed}")
    args.token_list = _ints(args.tokens, "--tokens", p)
    if not args.token_list or not all(1 <= t <= MAX_TOKENS for t in args.token_list):
        p.error(f"--tokens must be in 1..{MAX_TOKENS}, got {args.tokens!r}")
    args.cluster_list = _ints(args.clusters, "--clusters", p)
    if any(n not in CLUSTER_SIZES for n in args.cluster_list):
        p.error(f"--clusters values must be in {CLUSTER_SIZES}, got {args.clusters!r}")
    if args.replays < 1 or args.warmup < 0 or not args.l2_multiple > 0:
        p.error("--replays must be >= 1, --warmup >= 0 and --l2-multiple > 0")
    if args.mode == "kernel":
        args.spw_list = _ints(args.slices_per_warp, "--slices-per-warp", p)
        if any(v < 2 for v in args.spw_list):
            p.error(f"--slices-per-warp values must be >= 2, got {args.slices_per_warp!r}")
        args.spw_tiles_list = _ints(args.spw_tiles, "--spw-tiles", p)
        if not args.spw_tiles_list or any(v < 1 for v in args.spw_tiles_list):
            p.error(f"--spw-tiles must be ints >= 1, got {args.spw_tiles!r}")
    else:
        # staged-step counts; a pace of 0 times a paced pick without its pacing
        for knob, low in (("late", 1), ("paced", 0), ("paced_down", 0), ("paced_regs", 0)):
            flag = "--" + knob.replace("_", "-")
            counts = _ints(getattr(args, knob), flag, p)
            if any(n < low for n in counts):
                p.error(f"{flag} values must be >= {low}, got {getattr(args, knob)!r}")
            setattr(args, f"{knob}_list", counts)
        try:
            args.extra_down = [parse_config(c) for c in args.down_configs.split(",") if c]
            args.extra_gate_up = [parse_config(c) for c in args.gate_up_configs.split(",") if c]
        except ValueError as exc:
            p.error(f"--down-configs / --gate-up-configs: {exc}")


def parse_args(
    argv: Sequence[str] | None = None, description: str | None = None
) -> argparse.Namespace:
    """The sweep's arguments, checked (argparse exits 2); ``description``: the --help text
    (the script's docstring)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--tokens", help="comma list of token counts (1..8)")
    common.add_argument("--arch", default=ARCH, help="target arch of --emit (default sm_90a)")
    common.add_argument("--emit", type=Path, help="write the compile requests as JSON lines, exit")
    common.add_argument("--dry-run", action="store_true", help="list the variants and exit")
    common.add_argument("--json", type=Path, help="write the results as JSON")
    common.add_argument("--l2-multiple", type=float, default=4.0, help="chain weights / L2 size")
    common.add_argument("--replays", type=int, default=100)
    common.add_argument("--warmup", type=int, default=10)
    add_rounds(common)
    common.add_argument("--seed", type=int, default=0)

    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    modes = p.add_subparsers(dest="mode", required=True)
    kernel = modes.add_parser("kernel", parents=[common], help="sweep one kernel's configs")
    kernel.add_argument(
        "--shapes",
        default=",".join(DEFAULT_KERNEL_SHAPES),
        help=f"comma list of {', '.join(KERNEL_SHAPES)}",
    )
    kernel.add_argument(
        "--slices-per-warp",
        default="",
        help="comma list of slices_per_warp values > 1 to add (e.g. 2,3,4)",
    )
    kernel.add_argument(
        "--spw-tiles",
        default="1",
        help="comma list of tiles per CTA of the --slices-per-warp variants",
    )
    kernel.add_argument(
        "--clusters",
        default="",
        help="comma list of cluster sizes (1, 2, 4, 8) to add to every variant",
    )
    layer = modes.add_parser("layer", parents=[common], help="sweep (gate_up, down) pairs")
    layer.add_argument(
        "--shapes",
        default=",".join(DEFAULT_LAYER_SHAPES),
        help=f"comma list of {', '.join(LAYER_SHAPES)}, 'grid' (the off-table grid's shapes "
        "fp8_gemv takes) or h<hidden>-i<intermediate> names (multiples of 128)",
    )
    layer.add_argument(
        "--down-configs", default="", help="extra down configs, e.g. t4/r3/c2,t4/r1/c2/s3"
    )
    layer.add_argument("--gate-up-configs", default="", help="extra gate_up configs, same form")
    add_norm_between(layer)
    layer.add_argument(
        "--clusters",
        default="",
        help="cluster sizes to try on the default pair, e.g. 1,2,4 (1: none)",
    )
    layer.add_argument(
        "--late",
        default="",
        help="staged steps the default pair's gate_up requests after x, e.g. 1,2 (late_steps)",
    )
    layer.add_argument(
        "--paced",
        default="",
        help="staged steps the default pair's gate_up keeps in flight until its PDL wait "
        "returns, the rest requested after x, e.g. 1,2 (paced; 0: a paced pick without it)",
    )
    layer.add_argument(
        "--paced-down",
        default="",
        help="the same for the default pair's down projection, e.g. 0,2",
    )
    layer.add_argument(
        "--paced-regs",
        default="",
        help="64-K steps in registers for the default pair's gate_up, then its down, each "
        "paced (its own pace, else tuning.PACED), e.g. 0,1: fewer bytes ahead of x",
    )
    layer.add_argument(
        "--spread",
        type=int,
        default=0,
        metavar="N",
        help="also time the N best picks of tuning.spread_configs (K splits, any tiles)",
    )
    layer.add_argument(
        "--send-x",
        action="store_true",
        help="also time the default pair with the x sharing of its clustered kernels switched "
        "(send_x: st.async instead of a fenced cluster barrier, or back)",
    )
    compare = modes.add_parser(
        "compare",
        help="a layer sweep's pairs against the planned pair, and which pass the table's rule",
    )
    compare.add_argument("chain", type=Path, help="--json of a layer sweep, back to back")
    compare.add_argument(
        "--norm", type=Path, help="--json of the same sweep with --norm-between"
    )
    compare.add_argument(
        "--min-gain",
        type=float,
        default=sweep_compare.MIN_GAIN,
        help="a pair passes if faster than the planned one by more than this in every round "
        "(and, with --norm, not slower there); default 0.03",
    )
    compare.add_argument("--passing", action="store_true", help="list only the pairs that pass")
    args = p.parse_args(argv)
    if args.mode == "compare":
        if not 0 <= args.min_gain < 1:
            compare.error(f"--min-gain must be in [0, 1), got {args.min_gain}")
        return args
    if args.tokens is None:
        args.tokens = ",".join(map(str, KERNEL_TOKENS if args.mode == "kernel" else LAYER_TOKENS))
    _check(args, kernel if args.mode == "kernel" else layer)
    return args


# ---- GPU timing ------------------------------------------------------------------------------


def _load(request: KernelRequest, device: Any) -> Any:
    """The request's kernel from the cache, loaded (before capture: a load cannot be captured)."""
    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager

    return load_kernel(default_manager().get(request), device)


def _timed_in_rounds(
    runs: list[Callable[[], None]], items: int, args: argparse.Namespace
) -> list[dict]:
    """Each run's us per item (round_summary: us, p10_us, round_us) over --rounds rounds
    of alternating order."""
    return graph_rounds(runs, args.rounds, args.replays, args.warmup, scale=1e3 / items)


def time_kernels(name: str, args: argparse.Namespace, gpu: dict) -> list[dict]:
    """Time every variant of one kernel shape over one chain of weights (freed on return)."""
    import torch

    rows, k, swiglu = KERNEL_SHAPES[name]
    nbytes = weight_bytes(rows, k)
    count = chain_length(nbytes, gpu["l2_bytes"], args.l2_multiple)
    floor_us = nbytes / gpu["copy_bytes_per_s"] * 1e6
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    weights = [random_fp8_weight(rows, k, gen, scale=TIMING_SCALE) for _ in range(count)]
    device = torch.device("cuda", torch.cuda.current_device())
    results = []
    for m in args.token_list:
        x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        out_cols = rows // 2 if swiglu else rows
        outs = [torch.empty(m, out_cols, dtype=torch.bfloat16, device="cuda") for _ in weights]
        default = default_config(rows, k, m, swiglu)
        configs = _kernel_variants(args, name, m)
        runs = []
        for config in configs:
            kernel = _load(gemv_request(rows, k, swiglu, m, config), device)

            def run(kernel=kernel, x=x, outs=outs) -> None:
                for (w, s), out in zip(weights, outs, strict=True):
                    kernel.launch((out, x, w, s))

            runs.append(run)
        for config, timed in zip(configs, _timed_in_rounds(runs, count, args), strict=True):
            us = timed["us"]
            row = {
                "shape": name,
                "rows": rows,
                "k": k,
                "swiglu": swiglu,
                "tokens": m,
                "config": label(config),
                **dataclasses.asdict(config),
                "default": config == default,
                **timed,
                "floor_us": floor_us,
                "x_floor": us / floor_us,
                "layers": count,
            }
            del row["early_launch"]
            results.append(row)
            print(
                f"{name} m={m} {row['config']}: {us:.2f} us ({row['x_floor']:.2f}x floor)",
                file=sys.stderr,
                flush=True,
            )
    weights.clear()
    torch.cuda.empty_cache()
    return results


def time_layers(name: str, args: argparse.Namespace, gpu: dict) -> list[dict]:
    """Time every pair of one dense shard over one chain of layers (freed on return)."""
    import torch

    hidden, inter = layer_shape(name)
    count = layers_needed(hidden, inter, gpu["l2_bytes"], args.l2_multiple)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    layers = [
        (
            random_fp8_weight(2 * inter, hidden, gen, scale=TIMING_SCALE),
            random_fp8_weight(hidden, inter, gen, scale=TIMING_SCALE),
        )
        for _ in range(count)
    ]
    device = torch.device("cuda", torch.cuda.current_device())
    between = between_layers(args.norm_between)
    results = []
    for m in args.token_list:
        x = torch.randn(m, hidden, generator=gen, device="cuda").to(torch.bfloat16)
        acts = [torch.empty(m, inter, dtype=torch.bfloat16, device="cuda") for _ in layers]
        outs = [torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda") for _ in layers]
        default = (
            tuning.choose_config(2 * inter, hidden, m, True),
            tuning.choose_config(hidden, inter, m, False),
        )
        pairs_m = _layer_pairs(args, name, m)
        runs = []
        for pair in pairs_m:
            kg, kd = (_load(r, device) for r in pair_requests(hidden, inter, m, pair))

            def run(kg=kg, kd=kd, x=x, acts=acts, outs=outs) -> None:
                for ((w13, s13), (w2, s2)), act, out in zip(layers, acts, outs, strict=True):
                    between(x)
                    kg.launch((act, x, w13, s13))
                    kd.launch((out, act, w2, s2))

            runs.append(run)
        if args.norm_between:
            runs.append(norms_alone(x, count))
        timings = _timed_in_rounds(runs, count, args)
        norm = {"norm_us": timings.pop()["us"]} if args.norm_between else {}
        for pair, timed in zip(pairs_m, timings, strict=True):
            row = {
                "shape": name,
                "hidden": hidden,
                "intermediate": inter,
                "tokens": m,
                "gate_up": label(pair[0]),
                "down": label(pair[1]),
                "default": pair == default,
                **timed,
                **norm,
                "layers": count,
            }
            results.append(row)
            print(
                f"{name} m={m}  gate_up {row['gate_up']:16s} down {row['down']:16s} "
                f"{row['us']:7.2f} us",
                file=sys.stderr,
                flush=True,
            )
    layers.clear()
    torch.cuda.empty_cache()
    return results


# ---- report ----------------------------------------------------------------------------------


def markdown_table(rows: list[dict], mode: str) -> str:
    """One line per variant; 'default' marks choose_config's pick, **best** the fastest of
    its shape and token count."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["shape"], r["tokens"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    if mode == "kernel":
        head = [
            "shape",
            "tokens",
            "config (tiles/in_regs/ctas_per_sm[/sN slices][/nN cluster])",
            "us",
            "x floor",
            "",
        ]
    else:
        head = ["shape", "tokens", "gate_up", "down", "us per layer", ""]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        marks = ("default " if r["default"] else "") + (
            "**best**" if best[(r["shape"], r["tokens"])] is r else ""
        )
        if mode == "kernel":
            cells = [r["config"], f"{r['us']:.2f}", f"{r['x_floor']:.2f}"]
        else:
            cells = [r["gate_up"], r["down"], f"{r['us']:.2f}"]
        lines.append(
            "| " + " | ".join([r["shape"], str(r["tokens"]), *cells, marks.strip()]) + " |"
        )
    return "\n".join(lines)


def dry_run(args: argparse.Namespace) -> list[str]:
    """What the sweep would time, one line per shape and token count."""
    lines, total = [], 0
    for name in args.shape_list:
        for m in args.token_list:
            if args.mode == "kernel":
                rows, k, swiglu = KERNEL_SHAPES[name]
                found = _kernel_variants(args, name, m)
                default = default_config(rows, k, m, swiglu)
                text = ", ".join(label(c) + ("*" if c == default else "") for c in found)
                lines.append(f"{name} (rows={rows}, k={k}, swiglu={swiglu}) m={m}: {text}")
            else:
                hidden, inter = layer_shape(name)
                found = _layer_pairs(args, name, m)
                text = ", ".join(f"{label(g)} + {label(d)}" for g, d in found)
                lines.append(f"{name} (hidden={hidden}, intermediate={inter}) m={m}: {text}")
            total += len(found)
    if args.mode == "kernel":
        lines.append(f"{total} variants (* = choose_config default)")
    else:
        lines.append(f"{total} (gate_up + down) pairs, the first of each line choose_config's")
    return lines


def _compare(args: argparse.Namespace) -> int:
    """Print the compare table; 2 with one line naming a file that cannot be read."""
    rows = {}
    for flag, path in (("chain", args.chain), ("--norm", args.norm)):
        if path is None:
            continue
        try:
            rows[flag] = json.loads(path.read_text())["results"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {flag} {path}: not a layer sweep's --json ({exc})", file=sys.stderr)
            return 2
    try:
        found = sweep_compare.compare(rows["chain"], rows.get("--norm", ()), args.min_gain)
    except (KeyError, ValueError) as exc:
        print(f"error: {args.chain}: {exc}", file=sys.stderr)
        return 2
    print(sweep_compare.markdown(found, only_passing=args.passing))
    return 0


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """Emit the requests, list the variants (--dry-run) or time them on the GPU."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv, description)
    if args.mode == "compare":
        return _compare(args)
    if args.emit is not None:
        if args.mode == "kernel":
            items = kernel_requests(
                args.arch,
                args.shape_list,
                args.token_list,
                args.spw_list,
                args.spw_tiles_list,
                args.cluster_list,
            )
        else:
            items = layer_requests(
                args.shape_list,
                args.token_list,
                args.extra_down,
                args.extra_gate_up,
                args.arch,
                args.cluster_list,
                args.spread,
                args.send_x,
                args.late_list,
                args.paced_list,
                args.paced_down_list,
                args.paced_regs_list,
            )
        args.emit.parent.mkdir(parents=True, exist_ok=True)
        args.emit.write_text("".join(r.to_json_line() + "\n" for r in items))
        print(f"{len(items)} requests -> {args.emit}")
        return 0
    if args.dry_run:
        print("\n".join(dry_run(args)))
        return 0

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: use --dry-run or --emit here", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    gpu = {
        "device": props.name,
        "l2_bytes": device_l2_bytes(),
        "copy_bytes_per_s": copy_bandwidth(),
    }
    print(
        f"{gpu['device']}: L2 {gpu['l2_bytes'] / 2**20:.0f} MiB, copy "
        f"{gpu['copy_bytes_per_s'] / 1e12:.2f} TB/s",
        file=sys.stderr,
    )
    timer = time_kernels if args.mode == "kernel" else time_layers
    results = [row for name in args.shape_list for row in timer(name, args, gpu)]
    print(markdown_table(results, args.mode))
    if args.json is not None:
        meta = {
            **gpu,
            "mode": args.mode,
            "replays": args.replays,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "l2_multiple": args.l2_multiple,
            "command": "python3 scripts/tune_fp8_gemv.py " + " ".join(argv),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    return 0
