#!/usr/bin/env python3
"""Sweep fp8_gemv configs (tiles, in_regs, ctas_per_sm[, slices_per_warp]) per GLM shape and
token count.

The GPU machine has no compiler, so the variants are compiled here into a cache first:

    python3 scripts/tune_fp8_gemv.py --emit /tmp/tune.jsonl
    MLPJIT_CACHE_DIR=.gpu-cache mlpjit warm --requests /tmp/tune.jsonl --arch sm_90a --jobs 2

and then timed on the GPU from that cache (nothing compiles there):

    MLPJIT_CACHE_DIR=$PWD/.gpu-cache python3 scripts/tune_fp8_gemv.py --json $OUT/tune.json

Each variant runs over a chain of distinct weight matrices totalling >= --l2-multiple x the
L2 size (so weights stream from HBM), L launches captured in one CUDA graph; the per-launch
time is the median replay / L. The floor is the weight bytes (FP8 + float32 scales) over the
device-to-device copy bandwidth (bytes read + written per second). ``--dry-run`` only lists
the variants (no GPU needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mlpjit.kernels import plan  # noqa: E402  (no cutlass import; cheap)
from scripts.gpu_timing import (  # noqa: E402
    config_label,
    copy_bandwidth,
    graph_times,
    random_fp8_matrix,
)

# name -> (rows, k, swiglu): GLM-5 (hidden 6144, intermediate 12288) per TP shard, and
# GLM-4.5 (hidden 5120) at TP 8.
SHAPES: dict[str, tuple[int, int, bool]] = {
    "tp8-gate_up": (3072, 6144, True),
    "tp8-down": (6144, 1536, False),
    "tp4-gate_up": (6144, 6144, True),
    "tp4-down": (6144, 3072, False),
    "tp2-gate_up": (12288, 6144, True),
    "tp2-down": (6144, 6144, False),
    "tp1-gate_up": (24576, 6144, True),
    "tp1-down": (6144, 12288, False),
    "glm4.5-tp8-gate_up": (3072, 5120, True),
    "glm4.5-tp8-down": (5120, 1536, False),
}
DEFAULT_TOKENS = (1, 8)
TILES = (1, 2, 4)
IN_REGS = (2, 3, 5, 7)
MAX_VARIANTS = 12
SPW_IN_REGS = (0, 1, 2, 3)
L2_BYTES_H200 = 60 * 1024 * 1024  # used when the device does not report its L2 size


def default_config(rows: int, k: int, tokens: int, swiglu: bool) -> plan.GemvConfig:
    """choose_config's pick with the PDL trigger after the wait (see ``variants``)."""
    return dataclasses.replace(plan.choose_config(rows, k, tokens, swiglu), early_launch=False)


def variants(
    rows: int,
    k: int,
    tokens: int,
    swiglu: bool,
    cap: int = MAX_VARIANTS,
    spws: Sequence[int] = (),
    spw_tiles: Sequence[int] = (1,),
    clusters: Sequence[int] = (),
) -> list[plan.GemvConfig]:
    """Valid configs of one shape, choose_config's default first, at most ``cap`` of them.

    (tiles, ctas_per_sm) pairs come from plan's candidates (tiles in TILES); in_regs takes
    each IN_REGS value up to the pair's register fit whose shared memory fits the budget.
    Order: every pair at its largest in_regs (plan's own pick) by plan's score, then the
    smaller in_regs values, so a cap drops the least likely configs. All with the PDL
    trigger after the wait: where to trigger depends on the next kernel, so it is swept per
    layer (scripts/pair_sweep.py), not in a chain of one kernel type.

    ``spws``: slices_per_warp values > 1 to add beyond the cap: ``spw_tiles`` tiles per CTA,
    ctas_per_sm 1, 2 and 4, in_regs SPW_IN_REGS where the config fits.

    ``clusters``: cluster sizes to add, each applied to every config above where it fits.
    """
    default = default_config(rows, k, tokens, swiglu)
    pairs = sorted((score, c) for score, c in plan._candidates(rows, k, tokens) if c.tiles in TILES)
    first: list[plan.GemvConfig] = []
    rest: list[plan.GemvConfig] = []
    for _, c in pairs:
        fits = [
            r
            for r in sorted(set(IN_REGS) | {c.in_regs}, reverse=True)
            if r <= c.in_regs
            and plan.smem_bytes(k, tokens, c.tiles, r) <= plan.smem_budget(c.ctas_per_sm)
        ]
        fits = [r for r in fits if r in IN_REGS or r == c.in_regs]
        for i, r in enumerate(fits):
            (first if i == 0 else rest).append(plan.GemvConfig(c.tiles, r, c.ctas_per_sm))
    ordered = [default]
    for c in first + rest:
        if c not in ordered:
            ordered.append(c)
    ordered = ordered[:cap]
    for spw in spws:
        for tiles in spw_tiles:
            for cps in (1, 2, 4):
                for r in SPW_IN_REGS:
                    c = plan.GemvConfig(tiles, r, cps, slices_per_warp=spw)
                    if spw > 1 and plan._fits(rows, k, tokens, c) and c not in ordered:
                        ordered.append(c)
    for c in list(ordered):
        for n in clusters:
            clustered = dataclasses.replace(c, cluster=n)
            if plan._fits(rows, k, tokens, clustered) and clustered not in ordered:
                ordered.append(clustered)
    return ordered


def sweep(
    shapes: Sequence[str],
    tokens: Sequence[int],
    spws: Sequence[int] = (),
    spw_tiles: Sequence[int] = (1,),
    clusters: Sequence[int] = (),
) -> list[tuple[str, int, plan.GemvConfig]]:
    """(shape name, tokens, config) for every variant of the sweep, in run order."""
    out = []
    for name in shapes:
        rows, k, swiglu = SHAPES[name]
        for m in tokens:
            found = variants(rows, k, m, swiglu, spws=spws, spw_tiles=spw_tiles, clusters=clusters)
            out += [(name, m, c) for c in found]
    return out


def request_of(name: str, tokens: int, config: plan.GemvConfig, arch: str = "sm_90a"):
    """The KernelRequest of one variant (UE8M0 activation scales, no SwiGLU clamp)."""
    rows, k, swiglu = SHAPES[name]
    return plan.gemv_request(
        rows, k, tokens, swiglu=swiglu, limit=None, ue8m0=True, arch=arch, config=config
    )


def kernel_requests(
    arch: str = "sm_90a",
    shapes: Sequence[str] = tuple(SHAPES),
    tokens: Sequence[int] = DEFAULT_TOKENS,
    spws: Sequence[int] = (),
    spw_tiles: Sequence[int] = (1,),
    clusters: Sequence[int] = (),
) -> list:
    """Every variant's compile request (warm a cache with them on a CPU box)."""
    found = sweep(shapes, tokens, spws, spw_tiles, clusters)
    return [request_of(name, m, c, arch) for name, m, c in found]


# ---- arguments --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {list(SHAPES)}")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="comma list")
    p.add_argument("--arch", default="sm_90a", help="target arch of --emit (default sm_90a)")
    p.add_argument("--emit", type=Path, default=None, help="write requests as JSON lines, exit")
    p.add_argument("--dry-run", action="store_true", help="list the variants and exit")
    p.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    p.add_argument("--l2-multiple", type=float, default=4.0, help="chain weights / L2 size")
    p.add_argument(
        "--slices-per-warp",
        default="",
        help="comma list of slices_per_warp values > 1 to sweep as well (e.g. 2,3,4)",
    )
    p.add_argument(
        "--spw-tiles",
        default="1",
        help="comma list of tiles per CTA for the --slices-per-warp variants (default 1)",
    )
    p.add_argument(
        "--clusters",
        default="",
        help="comma list of cluster sizes (1, 2, 4, 8) to add to every variant where they fit",
    )
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.shape_list = [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [s for s in args.shape_list if s not in SHAPES]
    if bad or not args.shape_list:
        p.error(f"--shapes must be a comma list of {', '.join(SHAPES)}, got {args.shapes!r}")
    try:
        args.token_list = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        p.error(f"--tokens must be a comma list of ints in [1, {plan.MAX_TOKENS}]")
    if not args.token_list or any(not 1 <= t <= plan.MAX_TOKENS for t in args.token_list):
        p.error(f"--tokens must be ints in [1, {plan.MAX_TOKENS}], got {args.tokens!r}")
    try:
        args.spw_list = [int(v) for v in args.slices_per_warp.split(",") if v.strip()]
    except ValueError:
        p.error(f"--slices-per-warp must be a comma list of ints, got {args.slices_per_warp!r}")
    try:
        spw_tiles = tuple(int(v) for v in args.spw_tiles.split(",") if v.strip())
    except ValueError:
        p.error(f"--spw-tiles must be a comma list of ints, got {args.spw_tiles!r}")
    if not spw_tiles or any(v < 1 for v in spw_tiles):
        p.error(f"--spw-tiles must be ints >= 1, got {args.spw_tiles!r}")
    args.spw_tiles_list = spw_tiles
    try:
        args.cluster_list = [int(v) for v in args.clusters.split(",") if v.strip()]
    except ValueError:
        p.error(f"--clusters must be a comma list of ints, got {args.clusters!r}")
    if any(v not in plan.CLUSTER_SIZES for v in args.cluster_list):
        p.error(f"--clusters values must be in {plan.CLUSTER_SIZES}, got {args.clusters!r}")
    if any(v < 2 for v in args.spw_list):
        p.error(f"--slices-per-warp values must be >= 2, got {args.slices_per_warp!r}")
    if args.replays < 1 or args.warmup < 0:
        p.error("--replays must be >= 1 and --warmup >= 0")
    return args


# ---- GPU timing -------------------------------------------------------------------------------


def matrix_bytes(rows: int, k: int) -> int:
    """FP8 weight bytes plus float32 block-scale bytes of one matrix."""
    return rows * k + (rows // 128) * (k // 128) * 4


def tune_shape(name: str, args: argparse.Namespace, l2_bytes: int, bw: float) -> list[dict]:
    """Time every variant of one shape over one chain of weights (freed on return)."""
    import torch

    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager

    rows, k, swiglu = SHAPES[name]
    nbytes = matrix_bytes(rows, k)
    layers = max(2, math.ceil(args.l2_multiple * l2_bytes / nbytes))
    floor_us = nbytes / bw * 1e6
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    weights = [random_fp8_matrix(rows, k, gen) for _ in range(layers)]
    out_cols = rows // 2 if swiglu else rows
    manager = default_manager()
    device = torch.device("cuda", torch.cuda.current_device())
    results = []
    for m in args.token_list:
        x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        outs = [torch.empty(m, out_cols, dtype=torch.bfloat16, device="cuda") for _ in weights]
        default = default_config(rows, k, m, swiglu)
        for config in variants(
            rows,
            k,
            m,
            swiglu,
            spws=args.spw_list,
            spw_tiles=args.spw_tiles_list,
            clusters=args.cluster_list,
        ):
            entry = manager.get(request_of(name, m, config))
            kernel = load_kernel(entry, device)  # before capture: a load cannot be captured

            def run(kernel=kernel, x=x, outs=outs) -> None:
                for (w, s), out in zip(weights, outs, strict=True):
                    kernel.launch((out, x, w, s))

            per_launch = [t * 1e3 / layers for t in graph_times(run, args.replays, args.warmup)]
            us = statistics.median(per_launch)
            row = {
                "shape": name,
                "rows": rows,
                "k": k,
                "swiglu": swiglu,
                "tokens": m,
                "tiles": config.tiles,
                "in_regs": config.in_regs,
                "ctas_per_sm": config.ctas_per_sm,
                "slices_per_warp": config.slices_per_warp,
                "cluster": config.cluster,
                "default": config == default,
                "us": us,
                "p10_us": sorted(per_launch)[len(per_launch) // 10],
                "floor_us": floor_us,
                "x_floor": us / floor_us,
                "layers": layers,
            }
            results.append(row)
            print(
                f"{name} m={m} {_cfg(row)}: {us:.2f} us ({row['x_floor']:.2f}x floor)",
                file=sys.stderr,
                flush=True,
            )
        del x, outs
    weights.clear()
    torch.cuda.empty_cache()
    return results


def _cfg(row: dict) -> str:
    return config_label(
        row["tiles"],
        row["in_regs"],
        row["ctas_per_sm"],
        row.get("slices_per_warp", 1),
        cluster=row.get("cluster", 1),
    )


def markdown_table(rows: list[dict]) -> str:
    """One line per variant; (default) marks choose_config's pick, **best** the fastest."""
    best = {}
    for r in rows:
        key = (r["shape"], r["tokens"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    lines = [
        "| shape | tokens | config (tiles/in_regs/ctas_per_sm[/sN slices][/nN cluster]) "
        "| us | x floor | |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        marks = []
        if r["default"]:
            marks.append("default")
        if best[(r["shape"], r["tokens"])] is r:
            marks.append("**best**")
        lines.append(
            f"| {r['shape']} | {r['tokens']} | {_cfg(r)} | {r['us']:.2f} | "
            f"{r['x_floor']:.2f} | {' '.join(marks)} |"
        )
    return "\n".join(lines)


# ---- main -------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.emit is not None:
        items = kernel_requests(
            args.arch,
            args.shape_list,
            args.token_list,
            args.spw_list,
            args.spw_tiles_list,
            args.cluster_list,
        )
        args.emit.parent.mkdir(parents=True, exist_ok=True)
        args.emit.write_text("".join(r.to_json_line() + "\n" for r in items))
        print(f"{len(items)} requests -> {args.emit}", file=sys.stderr)
        return 0
    if args.dry_run:
        total = 0
        for name in args.shape_list:
            rows, k, swiglu = SHAPES[name]
            for m in args.token_list:
                found = variants(
                    rows,
                    k,
                    m,
                    swiglu,
                    spws=args.spw_list,
                    spw_tiles=args.spw_tiles_list,
                    clusters=args.cluster_list,
                )
                total += len(found)
                default = default_config(rows, k, m, swiglu)
                cfgs = ", ".join(
                    _cfg(dataclasses.asdict(c)) + ("*" if c == default else "") for c in found
                )
                print(f"{name} (rows={rows}, k={k}, swiglu={swiglu}) m={m}: {cfgs}")
        print(f"{total} variants (* = choose_config default)")
        return 0

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: use --dry-run or --emit here", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or L2_BYTES_H200)
    bw = copy_bandwidth(1 << 30)
    print(
        f"{props.name}: L2 {l2_bytes / 2**20:.0f} MiB, copy {bw / 1e12:.2f} TB/s", file=sys.stderr
    )
    results = []
    for name in args.shape_list:
        results += tune_shape(name, args, l2_bytes, bw)
    print(markdown_table(results))
    if args.json is not None:
        meta = {"device": props.name, "l2_bytes": l2_bytes, "copy_bytes_per_s": bw}
        meta.update(replays=args.replays, warmup=args.warmup, l2_multiple=args.l2_multiple)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
