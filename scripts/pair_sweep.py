#!/usr/bin/env python3
"""Layer-level sweep: gate_up and down configs timed together in an alternating PDL chain.

Per-kernel sweeps (scripts/tune_fp8_gemv.py) time one kernel type repeated; how two kernels
hand over (the PDL trigger point, SMs shared while one drains and the next streams) only
shows in the layer's real order. This sweep times, per shape and token count, plan's
default pair with every combination of the ``early_launch`` flag (PDL trigger at kernel
entry vs after the dependency wait) on gate_up and down, plus any extra config pairs given.

The GPU machine has no compiler, so compile here first, then time there from the cache:

    python3 scripts/pair_sweep.py --emit /tmp/pairs.jsonl
    MLPJIT_CACHE_DIR=.gpu-cache mlpjit warm --from /tmp/pairs.jsonl --arch sm_90a --jobs 2
    MLPJIT_CACHE_DIR=$PWD/.gpu-cache python3 scripts/pair_sweep.py --json $OUT/pairs.json

Per-layer time = median CUDA-graph replay of L layers (distinct weights, >= 4x L2) / L.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlpjit.kernels import plan  # noqa: E402
from scripts.gpu_timing import config_label, graph_times, random_fp8_matrix  # noqa: E402

SHAPES = {  # name -> (hidden, intermediate per rank)
    "glm5-tp8": (6144, 1536),
    "glm5-tp4": (6144, 3072),
    "glm5-tp2": (6144, 6144),
    "glm5-tp1": (6144, 12288),
    "glm4.5-tp8": (5120, 1536),
    "glm4.5-tp4": (5120, 3072),
    "glm4.5-tp2": (5120, 6144),
    "glm4.5-tp1": (5120, 12288),
}
L2_BYTES = 60 * 2**20


def pairs(
    hidden: int,
    inter: int,
    m: int,
    extra_down: Sequence[plan.GemvConfig] = (),
    extra_gate_up: Sequence[plan.GemvConfig] = (),
    clusters: Sequence[int] = (),
) -> list[tuple[plan.GemvConfig, plan.GemvConfig]]:
    """plan's default (gate_up, down) configs with each early_launch combination, then every
    (gate_up, down) of the defaults and the extra configs that fit, with gate_up's trigger
    at entry and after the wait (down's after the wait); then, per cluster size in
    ``clusters``, the default pair with gate_up, down and both set to that cluster size
    (where it fits)."""
    gate_up = plan.choose_config(2 * inter, hidden, m, True)
    down = plan.choose_config(hidden, inter, m, False)
    found = [
        (dataclasses.replace(gate_up, early_launch=g), dataclasses.replace(down, early_launch=d))
        for g, d in itertools.product((False, True), repeat=2)
    ]
    gate_ups = [gate_up] + [c for c in extra_gate_up if plan._fits(2 * inter, hidden, m, c)]
    downs = [down] + [c for c in extra_down if plan._fits(hidden, inter, m, c)]
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
        g_fits = plan._fits(2 * inter, hidden, m, g)
        d_fits = plan._fits(hidden, inter, m, d)
        for pair, ok in (((g, down), g_fits), ((gate_up, d), d_fits), ((g, d), g_fits and d_fits)):
            if ok and pair not in found:
                found.append(pair)
    return found


def parse_config(text: str) -> plan.GemvConfig:
    """'t4/r3/c2' (tiles, in_regs, ctas_per_sm), optionally '/s2' (slices_per_warp) and
    '/n2' (CTAs per cluster) -> GemvConfig, trigger after the wait."""
    form = "t4/r3/c2, t1/r0/c2/s3 or t1/r3/c1/s2/n4"
    parts = text.split("/")
    if len(parts) >= 3 and (len(parts) == 3 or parts[3][:1] != "s"):
        parts.insert(3, "s1")
    if len(parts) == 4:
        parts.append("n1")
    if len(parts) != 5 or [x[:1] for x in parts] != ["t", "r", "c", "s", "n"]:
        raise ValueError(f"config must look like {form}, got {text!r}")
    try:
        tiles, in_regs, cps, spw, cluster = (int(x[1:]) for x in parts)
    except ValueError:
        raise ValueError(f"config must look like {form}, got {text!r}") from None
    if min(tiles, cps, spw) < 1 or in_regs < 0:
        raise ValueError(f"config needs tiles, ctas_per_sm, slices >= 1 and in_regs >= 0: {text!r}")
    if cluster not in plan.CLUSTER_SIZES:
        raise ValueError(f"config's cluster (/n) must be one of {plan.CLUSTER_SIZES}: {text!r}")
    return plan.GemvConfig(tiles, in_regs, cps, slices_per_warp=spw, cluster=cluster)


def requests(
    shapes: Sequence[str],
    tokens: Sequence[int],
    extra_down: Sequence[plan.GemvConfig] = (),
    extra_gate_up: Sequence[plan.GemvConfig] = (),
    arch: str = "sm_90a",
    clusters: Sequence[int] = (),
) -> list:
    out = []
    for name in shapes:
        hidden, inter = SHAPES[name]
        for m in tokens:
            for g, d in pairs(hidden, inter, m, extra_down, extra_gate_up, clusters):
                for rows, k, swiglu, config in (
                    (2 * inter, hidden, True, g),
                    (hidden, inter, False, d),
                ):
                    request = plan.gemv_request(
                        rows, k, m, swiglu=swiglu, limit=None, ue8m0=True, arch=arch, config=config
                    )
                    if request not in out:
                        out.append(request)
    return out


def label(config: plan.GemvConfig) -> str:
    c = config
    return config_label(
        c.tiles, c.in_regs, c.ctas_per_sm, c.slices_per_warp, c.early_launch, c.cluster
    )


def sweep_shape(
    name: str,
    tokens: Sequence[int],
    replays: int,
    extra_down: Sequence[plan.GemvConfig] = (),
    extra_gate_up: Sequence[plan.GemvConfig] = (),
    clusters: Sequence[int] = (),
) -> list[dict]:
    import torch

    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager

    hidden, inter = SHAPES[name]
    manager, device = default_manager(), torch.device("cuda", 0)
    layer_bytes = 3 * inter * hidden
    n_layers = max(2, math.ceil(4 * L2_BYTES / layer_bytes))
    gen = torch.Generator(device="cuda").manual_seed(0)

    layers = [
        (random_fp8_matrix(2 * inter, hidden, gen), random_fp8_matrix(hidden, inter, gen))
        for _ in range(n_layers)
    ]
    rows = []
    for m in tokens:
        x = torch.randn(m, hidden, generator=gen, device="cuda").to(torch.bfloat16)
        acts = [torch.empty(m, inter, dtype=torch.bfloat16, device="cuda") for _ in layers]
        outs = [torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda") for _ in layers]
        for g, d in pairs(hidden, inter, m, extra_down, extra_gate_up, clusters):
            kg, kd = (
                load_kernel(manager.get(r), device)
                for r in (
                    plan.gemv_request(2 * inter, hidden, m, swiglu=True, limit=None, ue8m0=True,
                                      arch="sm_90a", config=g),
                    plan.gemv_request(hidden, inter, m, swiglu=False, limit=None, ue8m0=True,
                                      arch="sm_90a", config=d),
                )
            )  # fmt: skip

            def run(kg=kg, kd=kd, x=x, acts=acts, outs=outs) -> None:
                for ((w13, s13), (w2, s2)), act, out in zip(layers, acts, outs, strict=True):
                    kg.launch((act, x, w13, s13))
                    kd.launch((out, act, w2, s2))

            per_layer = [t * 1e3 / n_layers for t in graph_times(run, replays, 10)]
            row = {"shape": name, "tokens": m, "layers": n_layers, "gate_up": label(g),
                   "down": label(d), "us": statistics.median(per_layer)}  # fmt: skip
            rows.append(row)
            print(f"{name} m={m}  gate_up {row['gate_up']:16s} down {row['down']:16s} "
                  f"{row['us']:7.2f} us", flush=True)  # fmt: skip
    layers.clear()
    torch.cuda.empty_cache()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {list(SHAPES)}")
    p.add_argument("--tokens", default="1,2,4,8", help="comma list")
    p.add_argument(
        "--down-configs", default="", help="extra down configs, e.g. t4/r3/c2,t4/r1/c2/s3"
    )
    p.add_argument("--gate-up-configs", default="", help="extra gate_up configs, same form")
    p.add_argument(
        "--clusters",
        default="",
        help="cluster sizes to try on the default pair, e.g. 1,2,4 (1: without a cluster)",
    )
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--emit", type=Path, help="write the compile requests as JSON lines, exit")
    p.add_argument("--json", type=Path, help="write the results as JSON")
    args = p.parse_args(argv)
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        p.error(f"--shapes: unknown {unknown}; allowed: {list(SHAPES)}")
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        p.error(f"--tokens must be a comma list of ints, got {args.tokens!r}")
    if not all(1 <= t <= plan.MAX_TOKENS for t in tokens):
        p.error(f"--tokens must be in 1..{plan.MAX_TOKENS}, got {tokens}")
    try:
        extra_down = [parse_config(c) for c in args.down_configs.split(",") if c]
        extra_gate_up = [parse_config(c) for c in args.gate_up_configs.split(",") if c]
    except ValueError as exc:
        p.error(f"--down-configs / --gate-up-configs: {exc}")
    try:
        clusters = [int(n) for n in args.clusters.split(",") if n]
    except ValueError:
        p.error(f"--clusters must be a comma list of ints, got {args.clusters!r}")
    if any(n not in plan.CLUSTER_SIZES for n in clusters):
        p.error(f"--clusters values must be in {plan.CLUSTER_SIZES}, got {args.clusters!r}")
    if args.emit is not None:
        lines = [
            r.to_json_line()
            for r in requests(shapes, tokens, extra_down, extra_gate_up, clusters=clusters)
        ]
        args.emit.write_text("\n".join(lines) + "\n")
        print(f"{len(lines)} requests -> {args.emit}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device (use --emit on a machine without one)", file=sys.stderr)
        return 2
    rows = [
        row
        for name in shapes
        for row in sweep_shape(name, tokens, args.replays, extra_down, extra_gate_up, clusters)
    ]
    if args.json is not None:
        args.json.write_text(
            json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
