#!/usr/bin/env python3
"""Time fp8_gemv configs on the GPU, per kernel or per layer, to choose TUNED_H200's entries.

  kernel  one kernel type repeated in a chain, per shape and token count: choose_config's
          pick and the other (tiles, in_regs, ctas_per_sm) that fit, optionally with
          several 512-K slices per warp (--slices-per-warp) and in clusters (--clusters).
  layer   gate_up and down alternating in one PDL chain, as in a model. How two kernels
          hand over (the PDL trigger point, SMs shared while one drains and the next
          streams) only shows in this order. choose_config's pair with every combination of
          early_launch (PDL trigger at kernel entry or after the wait), extra configs crossed
          with it (--gate-up-configs, --down-configs), and the pair in clusters (--clusters).

The GPU machine has no compiler, so compile the variants here first, then time them there
from the carried cache (nothing compiles on the GPU):

    python3 scripts/tune_fp8_gemv.py kernel --emit /tmp/tune.jsonl
    MLPJIT_CACHE_DIR=.gpu-cache mlpjit warm --from /tmp/tune.jsonl --arch sm_90a --jobs 2
    MLPJIT_CACHE_DIR=$PWD/.gpu-cache python3 scripts/tune_fp8_gemv.py kernel --json tune.json

and the same with ``layer``; ``--dry-run`` lists the variants (no GPU needed). Each variant
runs over a chain of distinct weights totalling >= --l2-multiple x the L2 size (so weights
stream from HBM), captured in one CUDA graph: the time per launch (kernel) or per layer
(layer) is the median replay divided by the chain length. The floor of the kernel mode is
the weight bytes (FP8 + float32 scales) over the device-to-device copy bandwidth (bytes read
+ written per second). What the sweeps found: docs/KERNEL_NOTES.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv import plan, tuning
from mlpjit.kernels.fp8_gemv.params import CLUSTER_SIZES, MAX_TOKENS, GemvConfig, smem_bytes
from mlpjit.testing.layers import (
    DENSE_SHAPES,
    GEMV_SHAPES,
    TIMING_SCALE,
    chain_length,
    copy_bandwidth,
    graph_times,
    layers_needed,
    random_fp8_weight,
    weight_bytes,
)


def _kernel_takes(rows: int, k: int) -> bool:
    """Whether fp8_gemv takes a launch at every token count: only those have variants to
    sweep (the others run the stock path)."""
    return all(tuning.kernel_supports(rows, k, m) for m in range(1, MAX_TOKENS + 1))


# "glm5-tp8-gate_up" -> (rows, k, swiglu), every preset launch the kernel takes.
KERNEL_SHAPES = {name: s for name, s in GEMV_SHAPES.items() if _kernel_takes(s.rows, s.k)}
# The kernel sweep's shapes unless --shapes says otherwise: every GLM-5 shard and GLM-4.5 TP8.
DEFAULT_KERNEL_SHAPES = (
    *(f"glm5-tp{tp}-{kind}" for tp in (8, 4, 2, 1) for kind in ("gate_up", "down")),
    "glm4.5-tp8-gate_up",
    "glm4.5-tp8-down",
)
# "glm5-tp8" -> (hidden, intermediate per rank), every preset shard whose two launches the
# kernel takes; the layer sweep's default is the GLM dense shards.
LAYER_SHAPES = {
    name: (hidden, inter)
    for name, (hidden, inter) in DENSE_SHAPES.items()
    if _kernel_takes(2 * inter, hidden) and _kernel_takes(hidden, inter)
}
DEFAULT_LAYER_SHAPES = tuple(
    f"{model}-tp{tp}" for model in ("glm5", "glm4.5") for tp in (8, 4, 2, 1)
)
KERNEL_TOKENS = (1, 8)
LAYER_TOKENS = (1, 2, 4, 8)
TILES = (1, 2, 4)
IN_REGS = (2, 3, 5, 7)
MAX_VARIANTS = 12  # per shape and token count, before the --slices-per-warp and --clusters ones
SPW_IN_REGS = (0, 1, 2, 3)
L2_BYTES_H200 = 60 * 1024 * 1024  # used when the device does not report its L2 size
ARCH = "sm_90a"


def label(config: GemvConfig) -> str:
    """'t4/r3/c2' (tiles, in_regs, ctas_per_sm), with '/s3' for 3 slices per warp, '/n2'
    for clusters of 2 CTAs, '/k256' for 256-K slices, '/x4' for 4 K splits and '/early'
    for the PDL trigger at kernel entry."""
    c = config
    spw = f"/s{c.slices_per_warp}" if c.slices_per_warp != 1 else ""
    cluster = f"/n{c.cluster}" if c.cluster != 1 else ""
    slice_k = f"/k{c.slice_k}" if c.slice_k != 512 else ""
    splits = f"/x{c.splits}" if c.splits != 1 else ""
    early = "/early" if c.early_launch else ""
    return f"t{c.tiles}/r{c.in_regs}/c{c.ctas_per_sm}{spw}{cluster}{slice_k}{splits}{early}"


def parse_config(text: str) -> GemvConfig:
    """'t4/r3/c2' (tiles, in_regs, ctas_per_sm), then optionally, in any order, '/s2'
    (slices_per_warp), '/n2' (CTAs per cluster), '/k256' (slice_k) and '/x4' (K splits)
    -> GemvConfig, trigger after the wait. ValueError otherwise."""
    form = "t4/r3/c2, t1/r0/c2/s3, t1/r3/c1/s2/n4 or t2/r1/c2/k256/x4"
    parts = text.split("/")
    optional = {"s": "slices_per_warp", "n": "cluster", "k": "slice_k", "x": "splits"}
    if len(parts) < 3 or [x[:1] for x in parts[:3]] != ["t", "r", "c"]:
        raise ValueError(f"config must look like {form}, got {text!r}")
    try:
        tiles, in_regs, cps = (int(x[1:]) for x in parts[:3])
        extra = {}
        for part in parts[3:]:
            name = optional[part[:1]]
            if name in extra:
                raise KeyError(name)
            extra[name] = int(part[1:])
    except (KeyError, ValueError):
        raise ValueError(f"config must look like {form}, got {text!r}") from None
    spw = extra.get("slices_per_warp", 1)
    if min(tiles, cps, spw) < 1 or in_regs < 0:
        raise ValueError(f"config needs tiles, ctas_per_sm, slices >= 1 and in_regs >= 0: {text!r}")
    if extra.get("cluster", 1) not in CLUSTER_SIZES:
        raise ValueError(f"config's cluster (/n) must be one of {CLUSTER_SIZES}: {text!r}")
    return GemvConfig(tiles, in_regs, cps, **extra)


def gemv_request(
    rows: int, k: int, swiglu: bool, tokens: int, config: GemvConfig, arch: str = ARCH
) -> KernelRequest:
    """The compile request of one timed launch (UE8M0 activation scales, no SwiGLU clamp)."""
    return plan.gemv_request(
        rows, k, tokens, swiglu=swiglu, limit=None, ue8m0=True, arch=arch, config=config
    )


# ---- kernel mode: the variants of one kernel -------------------------------------------------


def default_config(rows: int, k: int, tokens: int, swiglu: bool) -> GemvConfig:
    """choose_config's pick with the PDL trigger after the wait (see ``variants``)."""
    return dataclasses.replace(tuning.choose_config(rows, k, tokens, swiglu), early_launch=False)


def variants(
    rows: int,
    k: int,
    tokens: int,
    swiglu: bool,
    cap: int = MAX_VARIANTS,
    spws: Sequence[int] = (),
    spw_tiles: Sequence[int] = (1,),
    clusters: Sequence[int] = (),
) -> list[GemvConfig]:
    """Valid configs of one shape, choose_config's default first, at most ``cap`` of them.

    (tiles, ctas_per_sm) pairs come from tuning.one_wave_candidates (tiles in TILES); in_regs
    takes each IN_REGS value up to the pair's register fit whose shared memory fits the
    budget. Order: every pair at its largest in_regs (the heuristic's own pick) by its score,
    then the smaller in_regs values, so a cap drops the least likely configs. All with the
    PDL trigger after the wait: where to trigger depends on the next kernel, so it is swept
    per layer (the layer mode), not in a chain of one kernel type.

    ``spws``: slices_per_warp values > 1 to add beyond the cap: ``spw_tiles`` tiles per CTA,
    ctas_per_sm 1, 2 and 4, in_regs SPW_IN_REGS where the config fits.
    ``clusters``: cluster sizes to add, each applied to every config above where it fits.
    """
    default = default_config(rows, k, tokens, swiglu)
    candidates = sorted(
        (score, c) for score, c in tuning.one_wave_candidates(rows, k, tokens) if c.tiles in TILES
    )
    first: list[GemvConfig] = []
    rest: list[GemvConfig] = []
    for _, c in candidates:
        fits = [
            r
            for r in sorted(set(IN_REGS) | {c.in_regs}, reverse=True)
            if r <= c.in_regs
            and smem_bytes(k, tokens, c.tiles, r) <= hopper.smem_budget(c.ctas_per_sm)
        ]
        fits = [r for r in fits if r in IN_REGS or r == c.in_regs]
        for i, r in enumerate(fits):
            (first if i == 0 else rest).append(GemvConfig(c.tiles, r, c.ctas_per_sm))
    ordered = [default]
    spread = tuning.spread_config(rows, k, tokens)
    if spread is not None and spread != default:
        ordered.append(spread)  # the K-split / any-tiles pick, even where the table decides
    for c in first + rest:
        if c not in ordered:
            ordered.append(c)
    ordered = ordered[:cap]
    for spw, tiles, cps, r in itertools.product(spws, spw_tiles, (1, 2, 4), SPW_IN_REGS):
        c = GemvConfig(tiles, r, cps, slices_per_warp=spw)
        if spw > 1 and tuning.config_fits(rows, k, tokens, c) and c not in ordered:
            ordered.append(c)
    for c, n in itertools.product(list(ordered), clusters):
        clustered = dataclasses.replace(c, cluster=n)
        if tuning.config_fits(rows, k, tokens, clustered) and clustered not in ordered:
            ordered.append(clustered)
    return ordered


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


def kernel_requests(
    arch: str = ARCH,
    shapes: Sequence[str] = DEFAULT_KERNEL_SHAPES,
    tokens: Sequence[int] = KERNEL_TOKENS,
    spws: Sequence[int] = (),
    spw_tiles: Sequence[int] = (1,),
    clusters: Sequence[int] = (),
) -> list[KernelRequest]:
    """Every variant's compile request, in run order (warm a cache with them on a CPU box)."""
    requests = []
    for name in shapes:
        rows, k, swiglu = KERNEL_SHAPES[name]
        for m in tokens:
            for c in variants(
                rows, k, m, swiglu, spws=spws, spw_tiles=spw_tiles, clusters=clusters
            ):
                requests.append(gemv_request(rows, k, swiglu, m, c, arch))
    return requests


# ---- layer mode: (gate_up, down) pairs -------------------------------------------------------


def pairs(
    hidden: int,
    inter: int,
    m: int,
    extra_down: Sequence[GemvConfig] = (),
    extra_gate_up: Sequence[GemvConfig] = (),
    clusters: Sequence[int] = (),
    spread: int = 0,
) -> list[tuple[GemvConfig, GemvConfig]]:
    """choose_config's (gate_up, down) with each early_launch combination, then every
    (gate_up, down) of the defaults, tuning.spread_config's picks and the extra configs
    that fit (and the ``spread`` best picks of tuning.spread_configs), with gate_up's trigger
    at entry and after the wait (down's after the wait); then, per cluster size in
    ``clusters``, the default pair with gate_up, down and both set to that cluster size
    (where it fits)."""
    gate_up = tuning.choose_config(2 * inter, hidden, m, True)
    down = tuning.choose_config(hidden, inter, m, False)
    found = [
        (dataclasses.replace(gate_up, early_launch=g), dataclasses.replace(down, early_launch=d))
        for g, d in itertools.product((False, True), repeat=2)
    ]
    # The model's spread picks (K splits, any tiles) beside the defaults, where they differ.
    if spread:
        spread_g = tuning.spread_configs(2 * inter, hidden, m, count=spread)
        spread_d = tuning.spread_configs(hidden, inter, m, count=spread)
        extra_gate_up = [*extra_gate_up, *(c for c in spread_g if c != gate_up)]
        extra_down = [*extra_down, *(c for c in spread_d if c != down)]
    gate_ups = [gate_up] + [c for c in extra_gate_up if tuning.config_fits(2 * inter, hidden, m, c)]
    downs = [down] + [c for c in extra_down if tuning.config_fits(hidden, inter, m, c)]
    for g, d, early in itertools.product(gate_ups, downs, (False, True)):
        pair = (
            dataclasses.replace(g, early_launch=early),
            dataclasses.replace(d, early_launch=False),
        )
        if pair not in found:
            found.append(pair)
    for n in clusters:
        g = dataclasses.replace(gate_up, cluster=n)
        d = dataclasses.replace(down, cluster=n)
        g_fits = tuning.config_fits(2 * inter, hidden, m, g)
        d_fits = tuning.config_fits(hidden, inter, m, d)
        for pair, ok in (((g, down), g_fits), ((gate_up, d), d_fits), ((g, d), g_fits and d_fits)):
            if ok and pair not in found:
                found.append(pair)
    return found


def pair_requests(
    hidden: int, inter: int, m: int, pair: tuple[GemvConfig, GemvConfig], arch: str = ARCH
) -> tuple[KernelRequest, KernelRequest]:
    """The (gate_up, down) compile requests of one timed pair."""
    g, d = pair
    return (
        gemv_request(2 * inter, hidden, True, m, g, arch),
        gemv_request(hidden, inter, False, m, d, arch),
    )


def _layer_pairs(args: argparse.Namespace, name: str, m: int) -> list:
    hidden, inter = LAYER_SHAPES[name]
    return pairs(
        hidden, inter, m, args.extra_down, args.extra_gate_up, args.cluster_list, args.spread
    )


def layer_requests(
    shapes: Sequence[str],
    tokens: Sequence[int],
    extra_down: Sequence[GemvConfig] = (),
    extra_gate_up: Sequence[GemvConfig] = (),
    arch: str = ARCH,
    clusters: Sequence[int] = (),
    spread: int = 0,
) -> list[KernelRequest]:
    """The distinct compile requests of every pair the layer sweep times."""
    out: list[KernelRequest] = []
    for name in shapes:
        hidden, inter = LAYER_SHAPES[name]
        for m in tokens:
            for pair in pairs(hidden, inter, m, extra_down, extra_gate_up, clusters, spread):
                out += [r for r in pair_requests(hidden, inter, m, pair, arch) if r not in out]
    return out


# ---- arguments -------------------------------------------------------------------------------


def _ints(text: str, flag: str, p: argparse.ArgumentParser) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        p.error(f"{flag} must be a comma list of ints, got {text!r}")


def _check(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Parse the comma lists into args.*_list and check them (p.error exits 2)."""
    shapes = KERNEL_SHAPES if args.mode == "kernel" else LAYER_SHAPES
    args.shape_list = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in args.shape_list if s not in shapes]
    if unknown or not args.shape_list:
        p.error(f"--shapes: unknown {unknown or args.shapes!r}; allowed: {', '.join(shapes)}")
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
        try:
            args.extra_down = [parse_config(c) for c in args.down_configs.split(",") if c]
            args.extra_gate_up = [parse_config(c) for c in args.gate_up_configs.split(",") if c]
        except ValueError as exc:
            p.error(f"--down-configs / --gate-up-configs: {exc}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--tokens", help="comma list of token counts (1..8)")
    common.add_argument("--arch", default=ARCH, help="target arch of --emit (default sm_90a)")
    common.add_argument("--emit", type=Path, help="write the compile requests as JSON lines, exit")
    common.add_argument("--dry-run", action="store_true", help="list the variants and exit")
    common.add_argument("--json", type=Path, help="write the results as JSON")
    common.add_argument("--l2-multiple", type=float, default=4.0, help="chain weights / L2 size")
    common.add_argument("--replays", type=int, default=100)
    common.add_argument("--warmup", type=int, default=10)
    common.add_argument("--seed", type=int, default=0)

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
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
        help=f"comma list of {', '.join(LAYER_SHAPES)}",
    )
    layer.add_argument(
        "--down-configs", default="", help="extra down configs, e.g. t4/r3/c2,t4/r1/c2/s3"
    )
    layer.add_argument("--gate-up-configs", default="", help="extra gate_up configs, same form")
    layer.add_argument(
        "--clusters",
        default="",
        help="cluster sizes to try on the default pair, e.g. 1,2,4 (1: none)",
    )
    layer.add_argument(
        "--spread",
        type=int,
        default=0,
        metavar="N",
        help="also time the N best picks of tuning.spread_configs (K splits, any tiles)",
    )
    args = p.parse_args(argv)
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


def _per_item_us(run: Callable[[], None], items: int, args: argparse.Namespace) -> list[float]:
    return [t * 1e3 / items for t in graph_times(run, args.replays, args.warmup)]


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
        for config in _kernel_variants(args, name, m):
            kernel = _load(gemv_request(rows, k, swiglu, m, config), device)

            def run(kernel=kernel, x=x, outs=outs) -> None:
                for (w, s), out in zip(weights, outs, strict=True):
                    kernel.launch((out, x, w, s))

            per_launch = _per_item_us(run, count, args)
            us = statistics.median(per_launch)
            row = {
                "shape": name,
                "rows": rows,
                "k": k,
                "swiglu": swiglu,
                "tokens": m,
                "config": label(config),
                **dataclasses.asdict(config),
                "default": config == default,
                "us": us,
                "p10_us": sorted(per_launch)[len(per_launch) // 10],
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

    hidden, inter = LAYER_SHAPES[name]
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
    results = []
    for m in args.token_list:
        x = torch.randn(m, hidden, generator=gen, device="cuda").to(torch.bfloat16)
        acts = [torch.empty(m, inter, dtype=torch.bfloat16, device="cuda") for _ in layers]
        outs = [torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda") for _ in layers]
        default = (
            tuning.choose_config(2 * inter, hidden, m, True),
            tuning.choose_config(hidden, inter, m, False),
        )
        for pair in _layer_pairs(args, name, m):
            kg, kd = (_load(r, device) for r in pair_requests(hidden, inter, m, pair))

            def run(kg=kg, kd=kd, x=x, acts=acts, outs=outs) -> None:
                for ((w13, s13), (w2, s2)), act, out in zip(layers, acts, outs, strict=True):
                    kg.launch((act, x, w13, s13))
                    kd.launch((out, act, w2, s2))

            per_layer = _per_item_us(run, count, args)
            row = {
                "shape": name,
                "hidden": hidden,
                "intermediate": inter,
                "tokens": m,
                "gate_up": label(pair[0]),
                "down": label(pair[1]),
                "default": pair == default,
                "us": statistics.median(per_layer),
                "p10_us": sorted(per_layer)[len(per_layer) // 10],
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
                hidden, inter = LAYER_SHAPES[name]
                found = _layer_pairs(args, name, m)
                text = ", ".join(f"{label(g)} + {label(d)}" for g, d in found)
                lines.append(f"{name} (hidden={hidden}, intermediate={inter}) m={m}: {text}")
            total += len(found)
    if args.mode == "kernel":
        lines.append(f"{total} variants (* = choose_config default)")
    else:
        lines.append(f"{total} (gate_up + down) pairs, the first of each line choose_config's")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
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
        "l2_bytes": int(getattr(props, "L2_cache_size", 0) or L2_BYTES_H200),
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
            "l2_multiple": args.l2_multiple,
            "command": "python3 scripts/tune_fp8_gemv.py " + " ".join(argv),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
