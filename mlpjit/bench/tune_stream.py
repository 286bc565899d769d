"""The fp8_stream / fp8_layer sweep behind scripts/tune_fp8_stream.py (its docstring: the
variants and how to run it): variant names, the requests of each layer, timing and traces on
the GPU, the plot of a --json file."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from mlpjit.bench.cli_args import add_norm_between, add_rounds
from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels.fp8_gemv import plan as gemv_plan
from mlpjit.kernels.fp8_gemv import tuning
from mlpjit.kernels.fp8_layer import plan as layer_plan
from mlpjit.kernels.fp8_stream import plan as stream_plan
from mlpjit.testing.layers import (
    GRID_SHAPES,
    device_l2_bytes,
    layer_bytes,
    layer_shapes,
)

ARCH = "sm_90a"
DEFAULT_SHAPES = (
    "glm5-tp8", "glm4.5-tp8", "deepseek-v3-tp8", "qwen3-32b-tp8", "glm5-tp4", "glm5-tp1",
    "deepseek-v3-shared-tp8", "deepseek-v3-shared-tp1",
)  # fmt: skip


_VARIANT = re.compile(
    r"^(\d+)x(\d+)(?:b(\d))?(?:c(\d))?(?:k(\d|a)(s)?)?(t(?:p)?)?([gd])?(?:-(x|mma|x\+mma))?$"
)
CLUSTER_AUTO = -1  # a WxR variant's 'ka': fp8_stream's planner chooses the cluster size


class StreamVariant(NamedTuple):
    """A WxR variant: fp8_stream's knobs (0: the planner's) and options."""

    warps: int
    stages: int
    blocks_per_warp: int
    ctas_per_sm: int
    half: str  # '' both halves stream, 'g' / 'd' only gate_up / down
    cluster: int  # 0 the grid-wide form, CLUSTER_AUTO the planner's cluster size
    share_x: bool
    ablate: str
    tma: bool = False
    step_sums: bool = False

_ALTERNATIVE = re.compile(r"^([gd])(\d+)$")
_LAYER = re.compile(r"^L(?:(\d+)b(\d)(?:s(\d+)x(\d+))?)?$")
# Decompositions a gN / dN variant draws from: the planner model's best of each (K splits,
# slice size, slices per warp), in the model's order.
ALTERNATIVES = 16


def parse_variant(text: str) -> tuple | None:
    """'gemv' -> None; 'L[WbB[sGxD]]' -> ('L', warps, blocks_per_warp, gate_up stages,
    down stages) (0: the planner's); 'WxR[bB][cC]' -> (warps, stages,
    blocks_per_warp, ctas_per_sm)
    (R 0: the planner's; B and C default to 1; W 0, without B: the planner's stage shape,
    fp8_stream.plan.stage_shape): '16x0', '8x0b2c2', '0x0ka'; 'gN' / 'dN' -> ('g', N) /
    ('d', N): fp8_gemv with gate_up (g) or down (d) on the N-th of
    ``gemv_alternatives`` and the other half as planned. A trailing g or d on a WxR variant
    ('8x0b2g', '8x0b2d') takes fp8_stream for that half only (gate_up or down) and
    fp8_gemv's planned kernel for the other; 'kN' before it takes fp8_stream's cluster form
    with clusters of N CTAs ('ka': the size choose_cluster picks), and 'kNs' / 'kas' with x
    quantized once per cluster (share_x; 'kas': clusters of at least 2); 't' before the half
    takes TMA tensor copies and wgmma by descriptor ('0x0kat'; StreamParams.tma), 'tp' with
    each 32-K step's sums added in fp32 (StreamParams.step_sums); a trailing
    '-x', '-mma' or '-x+mma' compiles fp8_stream with that part of the work left out
    (ablate: '0x0ka-mma'): a StreamVariant."""
    if text == "gemv":
        return None
    layer = _LAYER.match(text)
    if layer is not None:
        return ("L", *(int(v) if v else 0 for v in layer.groups()))
    alternative = _ALTERNATIVE.match(text)
    if alternative is not None:
        return alternative.group(1), int(alternative.group(2))
    match = _VARIANT.match(text)
    if match is None:
        raise ValueError(
            f"variant must be 'gemv', gN, dN, L[WbB[sGxD]] or "
            f"WxR[bB][cC][kN[s]|ka[s]][t[p]][g|d][-x|-mma|-x+mma] (g0, L, L8b1s3x4, 16x0, "
            f"8x0b2c2, 8x0b2k2, 8x0b2kad, 8x3b2k2s, 0x0kat, 0x0ka-mma), got {text!r}"
        )
    warps, stages, bpw, cps, cluster, share, tma, half, ablate = match.groups()
    if warps == "0" and bpw:
        raise ValueError(f"variant {text!r}: 0 warps takes the planner's stage shape; drop b{bpw}")
    if share and cluster == "1":
        raise ValueError(f"variant {text!r}: share_x ('s') needs clusters of 2 or more")
    if share and ablate and "x" in ablate.split("+"):
        raise ValueError(f"variant {text!r}: '-x' leaves x out, so there is none to share ('s')")
    if cluster is None:
        cluster = 0
    elif cluster == "a":
        cluster = CLUSTER_AUTO
    else:
        cluster = int(cluster)
    bpw = int(bpw or (0 if warps == "0" else 1))
    return StreamVariant(
        int(warps), int(stages), bpw, int(cps or 1), half or "", cluster, bool(share),
        ablate or "", bool(tma), tma == "tp",
    )  # fmt: skip


def variant_label(variant: tuple | None) -> str:
    if variant is None:
        return "gemv"
    if _is_layer(variant):
        _, warps, bpw, sg, sd = variant
        return "L" + (f"{warps}b{bpw}" if warps else "") + (f"s{sg}x{sd}" if sg else "")
    if isinstance(variant[0], str):
        return f"{variant[0]}{variant[1]}"
    v = StreamVariant(*variant)
    kind = {0: "", CLUSTER_AUTO: "ka"}.get(v.cluster, f"k{v.cluster}")
    kind += ("s" if v.share_x else "") + ("t" if v.tma else "") + ("p" if v.step_sums else "")
    shape = f"b{v.blocks_per_warp}" if v.warps else ""
    left_out = f"-{v.ablate}" if v.ablate else ""
    return f"{v.warps}x{v.stages}{shape}c{v.ctas_per_sm}{kind}{v.half}{left_out}"


def gemv_alternatives(rows: int, k: int, tokens: int, swiglu: bool) -> list:
    """fp8_gemv decompositions other than the planner's pick for one kernel: the model's
    best of each (splits, slice_k, slices_per_warp), in the model's order."""
    picked = tuning.choose_config(rows, k, tokens, swiglu)
    seen = {(picked.splits, picked.slice_k, picked.slices_per_warp)}
    found = []
    for config in tuning.spread_configs(rows, k, tokens, count=100_000):
        shape = (config.splits, config.slice_k, config.slices_per_warp)
        if shape not in seen:
            seen.add(shape)
            found.append(config)
    return found[:ALTERNATIVES]


def shapes_of(args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    names = args.shapes.split(",") if args.shapes else list(DEFAULT_SHAPES)
    if names == ["grid"]:
        return dict(GRID_SHAPES)
    try:
        shapes = layer_shapes(names)
    except ValueError as err:
        raise SystemExit(f"--shapes: {err}") from None
    if args.grid:
        shapes.update(GRID_SHAPES)
    return shapes


def layer_requests(
    hidden: int,
    inter: int,
    tokens: int,
    variant: tuple[int, int] | None,
    arch: str = ARCH,
    trace: bool = False,
) -> list[KernelRequest]:
    """(gate_up, down) requests of one variant (UE8M0 scales, no clamp; one request for a
    one-kernel layer); ``trace``: the builds that record timestamps."""
    if _is_layer(variant):
        _, warps, bpw, sg, sd = variant
        return [
            layer_plan.layer_request(
                hidden, inter, tokens, limit=None, ue8m0=True, arch=arch,
                warps=warps or None, blocks_per_warp=bpw or None,
                stages=(sg, sd) if sg else None, trace=trace,
            )
        ]  # fmt: skip
    if variant is None or isinstance(variant[0], str):
        configs = [None, None]
        if variant is not None:
            half, rank = variant
            rows, k = (2 * inter, hidden) if half == "g" else (hidden, inter)
            found = gemv_alternatives(rows, k, tokens, half == "g")
            if rank >= len(found):
                raise ValueError(f"{half}{rank}: only {len(found)} alternatives")
            configs[half == "d"] = found[rank]
        return [
            gemv_plan.gemv_request(2 * inter, hidden, tokens, swiglu=True, limit=None,
                                   ue8m0=True, arch=arch, config=configs[0], trace=trace),
            gemv_plan.gemv_request(hidden, inter, tokens, swiglu=False, limit=None, ue8m0=True,
                                   arch=arch, config=configs[1], trace=trace),
        ]  # fmt: skip
    v = StreamVariant(*variant)
    half, cluster, share = v.half, v.cluster, v.share_x
    options = dict(
        limit=None,
        ue8m0=True,
        arch=arch,
        warps=v.warps or None,
        stages=v.stages or None,
        trace=trace,
        blocks_per_warp=v.blocks_per_warp or None,
        ctas_per_sm=v.ctas_per_sm,
        ablate=v.ablate,
        tma=v.tma,
        step_sums=v.step_sums,
    )
    requests = []
    for name, rows, k, swiglu in (("g", 2 * inter, hidden, True), ("d", hidden, inter, False)):
        if half in ("", name):
            size = stream_plan.choose_cluster(rows, k) if cluster == CLUSTER_AUTO else cluster
            if share:
                size = max(size, 2)
            requests.append(
                stream_plan.stream_request(
                    rows, k, tokens, swiglu=swiglu, cluster=size, share_x=share, **options
                )
            )
        else:  # the other half: fp8_gemv as planned
            requests.append(gemv_plan.gemv_request(rows, k, tokens, swiglu=swiglu, limit=None,
                                                   ue8m0=True, arch=arch))  # fmt: skip
    return requests


def _streamed(variant: tuple | None) -> tuple[bool, bool]:
    """Whether (gate_up, down) of a two-kernel variant are fp8_stream's (a workspace each)."""
    if variant is None or isinstance(variant[0], str):
        return False, False
    half = variant[4]
    return half != "d", half != "g"


def _is_layer(variant: tuple | None) -> bool:
    return variant is not None and variant[0] == "L"


def _is_gemv(variant: tuple | None) -> bool:
    """Whether both halves of a variant are fp8_gemv's ('gemv', gN, dN)."""
    return variant is None or isinstance(variant[0], str) and not _is_layer(variant)


def _traced_pair(variant: tuple | None) -> bool:
    """Whether --trace has trace builds of a two-kernel variant: both halves fp8_gemv's or
    both fp8_stream's (a one-kernel layer has its own)."""
    return _is_gemv(variant) or _streamed(variant) == (True, True)


def all_requests(args: argparse.Namespace) -> list[KernelRequest]:
    seen: list[KernelRequest] = []
    for hidden, inter in shapes_of(args).values():
        for tokens in args.tokens:
            for variant in args.variants:
                try:
                    reqs = layer_requests(hidden, inter, tokens, variant)
                    if args.trace and _traced_pair(variant):
                        reqs += layer_requests(hidden, inter, tokens, variant, trace=True)
                    for r in reqs:
                        if r not in seen:
                            seen.append(r)
                except ValueError as err:
                    print(f"skip h{hidden} i{inter} t{tokens} {variant}: {err}", file=sys.stderr)
    return seen


def run(args: argparse.Namespace) -> list[dict[str, Any]]:  # pragma: no cover - GPU only
    import torch

    from mlpjit import reference as ref
    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager
    from mlpjit.kernels.fp8_layer.params import LayerParams
    from mlpjit.testing.layers import (
        between_layers,
        chain_length,
        copy_bandwidth,
        graph_rounds,
        norms_alone,
        random_fp8_layer,
        rel_l2,
    )

    device = torch.device("cuda", 0)
    l2 = device_l2_bytes()
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.3f} TB/s (read + write)", flush=True)
    manager = default_manager()
    between = between_layers(args.norm_between)
    rows_out = []
    for name, (hidden, inter) in shapes_of(args).items():
        nbytes = layer_bytes(hidden, inter)
        n_layers = chain_length(nbytes, l2, args.l2_multiple)
        gen = torch.Generator(device="cuda").manual_seed(hidden + inter)
        layers = [random_fp8_layer(hidden, inter, gen) for _ in range(n_layers)]
        floor_us = nbytes / bandwidth * 1e6
        for tokens in args.tokens:
            x = torch.randn(tokens, hidden, generator=gen, device="cuda").to(torch.bfloat16)
            act = torch.empty(tokens, inter, dtype=torch.bfloat16, device="cuda")
            out = torch.empty(tokens, hidden, dtype=torch.bfloat16, device="cuda")
            want_act = ref.gemv_reference(x, layers[0]["w13"], layers[0]["w13_scale"],
                                          swiglu=True, ue8m0=True)  # fmt: skip
            want = ref.gemv_reference(want_act, layers[0]["w2"], layers[0]["w2_scale"],
                                      swiglu=False, ue8m0=True)  # fmt: skip
            pending = []  # (row without its time, the chain to time), timed in rounds below
            for variant in args.variants:
                label = variant_label(variant)
                try:
                    reqs = layer_requests(hidden, inter, tokens, variant)
                except ValueError as err:
                    print(f"{name} t{tokens} {label}: skipped ({err})", flush=True)
                    continue
                kernels = [load_kernel(manager.get(r), device) for r in reqs]
                if _is_layer(variant):
                    work = torch.zeros(LayerParams(**reqs[0].params).workspace_bytes,
                                       dtype=torch.uint8, device="cuda")  # fmt: skip

                    def launch(layer, x=x, act=act, out=out, fused=kernels[0], work=work):
                        fused.launch([out, act, x, layer["w13"], layer["w13_scale"],
                                      layer["w2"], layer["w2_scale"], work])  # fmt: skip
                else:
                    launch = _pair_launcher(kernels, reqs, _streamed(variant), hidden, inter, x,
                                            act, out)  # fmt: skip

                def chain(launch=launch, layers=layers, x=x):
                    for layer in layers:
                        between(x)
                        launch(layer)

                if args.trace and _is_layer(variant):
                    print_layer_trace(
                        name, tokens, label, manager, device,
                        layer_requests(hidden, inter, tokens, variant, trace=True)[0],
                        [out, act, x, layers[0]["w13"], layers[0]["w13_scale"],
                         layers[0]["w2"], layers[0]["w2_scale"]],
                    )  # fmt: skip
                elif args.trace and _is_gemv(variant):
                    print_gemv_trace(
                        name, tokens, label, manager, device,
                        layer_requests(hidden, inter, tokens, variant, trace=True),
                        [x, layers[0]["w13"], layers[0]["w13_scale"]],
                        [layers[0]["w2"], layers[0]["w2_scale"]],
                    )  # fmt: skip
                elif args.trace and _streamed(variant) == (True, True):
                    print_trace(
                        name, tokens, label, manager, device,
                        layer_requests(hidden, inter, tokens, variant, trace=True),
                        [act, x, layers[0]["w13"], layers[0]["w13_scale"]],
                        [out, act, layers[0]["w2"], layers[0]["w2_scale"]],
                    )  # fmt: skip
                act.fill_(float("nan"))
                out.fill_(float("nan"))
                launch(layers[0])
                torch.cuda.synchronize()
                err_act, err_out = rel_l2(act, want_act), rel_l2(out, want)
                row = dict(
                    shape=name, hidden=hidden, inter=inter, tokens=tokens, variant=label,
                    floor_us=round(floor_us, 3), err_act=err_act, err_out=err_out,
                    layers=n_layers, mbytes=round(nbytes / 1e6, 2),
                    gate_up=dict(reqs[0].params), down=dict(reqs[-1].params),
                )  # fmt: skip
                pending.append((row, chain))
            chains = [chain for _, chain in pending]
            if args.norm_between:
                chains.append(norms_alone(x, n_layers))
            timings = graph_rounds(chains, args.rounds, args.replays, args.warmup,
                                   scale=1e3 / n_layers)  # fmt: skip
            norm_us = timings.pop()["us"] if args.norm_between else None
            for (row, _), timed in zip(pending, timings, strict=True):
                us = timed["us"]
                row.update(us=round(us, 3), x_floor=round(us / floor_us, 3),
                           round_us=timed["round_us"])  # fmt: skip
                if norm_us is not None:
                    row["norm_us"] = round(norm_us, 3)
                rows_out.append(row)
                print(f"{name:24s} t{tokens} {row['variant']:6s} {us:8.2f} us  "
                      f"x{us / floor_us:5.2f} floor {floor_us:7.2f} us  "
                      f"err act {row['err_act']:.1e} out {row['err_out']:.1e}"
                      + (f"  norm {norm_us:.2f} us" if norm_us is not None else ""),
                      flush=True)  # fmt: skip
    return rows_out


def _pair_launcher(kernels, reqs, streamed, hidden, inter, x, act, out):  # pragma: no cover
    """One layer as two launches (fp8_gemv's or fp8_stream's gate_up, then down; streamed:
    which of the two are fp8_stream's, with a workspace; tma builds take the weight's
    tensor map too, made once per layer and kept in the layer's dict)."""
    import torch

    from mlpjit.kernels.fp8_stream.params import StreamParams, workspace_bytes
    from mlpjit.kernels.tensor_map import weight_block_map

    gate_up, down = kernels
    extra: tuple[list, list] = ([], [])
    maps: list[tuple[str, int] | None] = [None, None]
    for half, (rows, k) in enumerate(((2 * inter, hidden), (hidden, inter))):
        if streamed[half]:
            nbytes = workspace_bytes(rows, k)
            extra[half].append(torch.zeros(nbytes, dtype=torch.uint8, device="cuda"))
            params = StreamParams(**reqs[half].params)
            if params.tma:
                maps[half] = (("w13", "w2")[half], params.tma_box_rows)

    def map_of(layer, half):
        if maps[half] is None:
            return []
        name, box_rows = maps[half]
        key = f"{name}_map{box_rows}"
        if key not in layer:
            layer[key] = weight_block_map(layer[name].view(torch.uint8), box_rows, 1)
        return [layer[key]]

    def launch(layer):
        gate_up.launch([act, x, layer["w13"], layer["w13_scale"], *extra[0], *map_of(layer, 0)])
        down.launch([out, act, layer["w2"], layer["w2_scale"], *extra[1], *map_of(layer, 1)])

    return launch


TRACE_LAUNCHES = 3  # trace launches of a pair, each after an idle GPU


def print_trace(name, tokens, label, manager, device, reqs, gate_up_args, down_args):
    """TRACE_LAUNCHES launches of a gate_up + down pair of trace builds, each after an idle
    GPU. For the first: per kernel and stamp, the median and the latest CTA in microseconds
    from gate_up's first CTA start. Then where the spread between CTAs comes from: per
    kernel, each CTA's time from its start to its last consumer warp's end (p10 / median /
    p90 / max over CTAs, first launch), how that time follows the CTA's blocks, and whether
    the same SMs are slow in every launch (correlation of per-SM rates between launches);
    and how many of down's CTAs started beside a running gate_up CTA (_beside_line)."""
    import torch

    from mlpjit.jit.launcher import load_kernel
    from mlpjit.kernels.fp8_stream.params import TRACE_POINTS, StreamParams

    kernels = []
    for r, args in zip(reqs, (gate_up_args, down_args), strict=True):
        params = StreamParams(**r.params)
        work = torch.zeros(params.workspace_bytes, dtype=torch.uint8, device=device)
        kernels.append((params, work, load_kernel(manager.get(r), device), [*args, work]))

    def launch():
        for _, _, kernel, args in kernels:
            kernel.launch(args)

    def read():
        return [
            work[params.trace_offset :]
            .view(torch.int64)[: params.ctas * TRACE_POINTS]
            .view(params.ctas, TRACE_POINTS)
            .cpu()
            for params, work, _, _ in kernels
        ]

    launches = _after_idle(launch, read)  # per launch: per kernel, (ctas, TRACE_POINTS) int64
    first = launches[0]
    origin = first[0][:, 0].min()
    for half, t in zip(("gate_up", "down"), first, strict=True):
        cells = _stamp_cells(t, origin, _TRACE_NAMES)
        print(f"trace {name} t{tokens} {label} {half}: {cells}", flush=True)
    for k, half in enumerate(("gate_up", "down")):
        params = kernels[k][0]
        blocks = torch.tensor([b1 - b0 for b0, b1 in params.cta_ranges()], dtype=torch.float64)
        print(f"spread {name} t{tokens} {label} {half}: " + _spread_line(
            [launch[k] for launch in launches], blocks), flush=True)  # fmt: skip
    print(f"beside {name} t{tokens} {label}: " + _beside_line(*first), flush=True)


def print_gemv_trace(name, tokens, label, manager, device, reqs, gate_up_args, down_args):
    """TRACE_LAUNCHES launches of an fp8_gemv gate_up + down pair of trace builds, each
    after an idle GPU (their act and out buffers hold the stamps after the values). For the
    first: per kernel and stamp, the median and the latest CTA in microseconds from gate_up's
    first CTA start; then per kernel, where a CTA's time after the PDL wait goes
    (gemv_spread_line, over every launch)."""
    import torch

    from mlpjit.jit.launcher import load_kernel
    from mlpjit.kernels.fp8_gemv.params import TRACE_NAMES, TRACE_POINTS, GemvParams

    params = [GemvParams(**r.params) for r in reqs]
    kernels = [load_kernel(manager.get(r), device) for r in reqs]
    act, out = (torch.zeros(p.out_bytes, dtype=torch.uint8, device=device) for p in params)

    def launch():
        kernels[0].launch([act, *gate_up_args])
        kernels[1].launch([out, act, *down_args])

    def read():
        return [
            buf[p.trace_offset : p.out_bytes].view(torch.int64).view(p.ctas, TRACE_POINTS).cpu()
            for p, buf in zip(params, (act, out), strict=True)
        ]

    launches = _after_idle(launch, read)  # per launch: per kernel, (ctas, TRACE_POINTS) int64
    origin = launches[0][0][:, 0].min()
    for k, half in enumerate(("gate_up", "down")):
        cells = _stamp_cells(launches[0][k], origin, TRACE_NAMES)
        print(f"trace {name} t{tokens} {label} {half}: {cells}", flush=True)
        stamps = torch.cat([launch[k] for launch in launches])
        print(f"spread {name} t{tokens} {label} {half}: {gemv_spread_line(stamps)}", flush=True)


def gemv_spread_line(stamps) -> str:
    """Where fp8_gemv's CTAs spend their time after the PDL wait, from trace stamps (a
    (ctas, TRACE_POINTS) int64 tensor, launches stacked): per phase (x: waited to x ready;
    sums: x ready to the last tile's partial sums; store: to done; busy: waited to done),
    the p10 / median / p90 / max over CTAs in microseconds; and the most CTAs one SM ran."""
    import torch

    from mlpjit.kernels.fp8_gemv.params import TRACE_NAMES

    at = {n: stamps[:, i].double() for i, n in enumerate(TRACE_NAMES)}
    phases = {
        "x": at["x ready"] - at["waited"],
        "sums": at["sums last"] - at["x ready"],
        "store": at["done"] - at["sums last"],
        "busy": at["done"] - at["waited"],
    }
    cells = [f"{n} {_quantiles(ns / 1e3)}" for n, ns in phases.items()]
    per_sm = torch.bincount(stamps[:, -1].long()).max().item()
    return "  ".join(cells) + f"  (p10/p50/p90/max us)  CTAs per SM <= {per_sm}"


def _after_idle(launch, read, times: int = TRACE_LAUNCHES) -> list:  # pragma: no cover
    """``times`` x: wait for an idle GPU, queue ``launch()`` behind a GPU spin (as in a
    busy stream), wait for it, and keep ``read()``."""
    import torch
    from torch.cuda import _sleep  # torch's private helper: a GPU spin of N cycles

    out = []
    for _ in range(times):
        torch.cuda.synchronize()
        _sleep(1_000_000)
        launch()
        torch.cuda.synchronize()
        out.append(read())
    return out


def _stamp_cells(stamps, origin, names, points=None) -> str:
    """'name median/latest ...' in microseconds from ``origin`` (ns), for each stamp of
    ``names`` (or those at ``points``): a (ctas, slots) int64 tensor of one launch."""
    rel = (stamps - origin).double() / 1e3
    points = range(len(names)) if points is None else points
    return "  ".join(f"{names[i]} {rel[:, i].median():.2f}/{rel[:, i].max():.2f}" for i in points)


def _quantiles(v) -> str:
    """'p10/p50/p90/max' of a float tensor, two decimals."""
    import torch

    q = torch.quantile(v, torch.tensor([0.1, 0.5, 0.9], dtype=v.dtype))
    return "/".join(f"{x:.2f}" for x in [*q.tolist(), v.max().item()])


def _beside_line(gate_up, down) -> str:
    """How many of down's CTAs started while a gate_up CTA still ran on the same SM (from
    its start to its epilogue warp's end), and while any gate_up CTA still ran: where the
    first count is 0, no down CTA shared an SM with gate_up. Each argument: a (ctas,
    TRACE_POINTS) int64 tensor of one launch (point 0: start, 7: epilogue done, last: the
    SM id)."""
    end = gate_up[:, _TRACE_NAMES.index("epilogue done")]
    beside = sum(
        bool(((gate_up[:, -1] == d[-1]) & (gate_up[:, 0] <= d[0]) & (d[0] < end)).any())
        for d in down
    )
    last_end = end.max()
    early = int((down[:, 0] < last_end).sum())
    return (
        f"{beside} of {len(down)} down CTAs started beside a running gate_up CTA, {early} "
        "before gate_up's last CTA ended"
    )


def _spread_line(stamps: list, blocks) -> str:
    """One kernel's CTA spread over launches (see print_trace): ``stamps`` per launch, a
    (ctas, TRACE_POINTS) int64 tensor (point 0: start, 4: last consumer warp done, last:
    the SM id); ``blocks``: each CTA's blocks."""
    import torch

    busy = [(t[:, 4] - t[:, 0]).double() / 1e3 for t in stamps]  # us per CTA
    has = blocks > 0
    rates = []
    for t, us in zip(stamps, busy, strict=True):
        per_sm = torch.full((int(t[:, -1].max()) + 1,), float("nan"), dtype=torch.float64)
        per_sm[t[has, -1].long()] = (blocks[has] / us[has]).double()
        rates.append(per_sm)
    n = min(len(r) for r in rates)
    both = torch.stack([r[:n] for r in rates])
    ok = ~torch.isnan(both).any(0)
    corr = [
        torch.corrcoef(torch.stack([both[0, ok], both[i, ok]]))[0, 1].item()
        for i in range(1, len(rates))
    ]
    with_blocks = torch.corrcoef(torch.stack([busy[0][has], blocks[has]]))[0, 1].item()
    slow = torch.argsort(both[0].nan_to_num(float("inf")))[:6].tolist()
    return (
        f"busy us p10/p50/p90/max {_quantiles(busy[0][has])}  blocks min/max "
        f"{int(blocks[has].min())}/{int(blocks.max())}  corr(busy, blocks) {with_blocks:.2f}  "
        f"corr(SM rate, launch 1 vs 2..) {' '.join(f'{c:.2f}' for c in corr)}  slowest SMs {slow}"
    )


def print_layer_trace(name, tokens, label, manager, device, req, args):  # pragma: no cover
    """One launch of a one-kernel layer's trace build after an idle GPU: the stamps of its
    gate_up and down phases, as print_trace prints them ("waited" of down: act ready)."""
    import torch

    from mlpjit.jit.launcher import load_kernel
    from mlpjit.kernels.fp8_layer.params import LayerParams
    from mlpjit.kernels.fp8_stream.params import TRACE_POINTS

    params = LayerParams(**req.params)
    work = torch.zeros(params.workspace_bytes, dtype=torch.uint8, device=device)
    kernel = load_kernel(manager.get(req), device)
    _after_idle(lambda: kernel.launch([*args, work]), lambda: None, times=1)
    times = []
    for base, phase in ((0, params.gate_up), (params.work_down, params.down)):
        start = base + phase.trace_offset
        raw = work[start : start + phase.ctas * TRACE_POINTS * 8].view(torch.int64)
        times.append(raw.view(phase.ctas, TRACE_POINTS).double())
    origin = times[0][:, 0].min()
    stamped = ((0, 1, 2, 3, 4, 5, 6, 7), (1, 2, 3, 4, 6, 7))  # down: no start, no copies
    for half, t, points in zip(("gate_up", "down"), times, stamped, strict=True):
        cells = _stamp_cells(t, origin, _TRACE_NAMES, points)
        print(f"trace {name} t{tokens} {label} {half}: {cells}", flush=True)


_TRACE_NAMES = ("start", "waited", "x ready", "warp0 done", "warpL done", "copies out",
                "1st piece", "epilogue done")  # fmt: skip


# bench_dense_mlp's timed methods, as plot_rows names them.
_BENCH_METHODS = {"mlpjit": "DenseMlp", "scaled_mm": "2x _scaled_mm"}


def plot_rows(data: Any) -> list[dict[str, Any]]:
    """The (variant, tokens, mbytes, x_floor) rows of a results file: this script's --json
    (a list of rows, or {"meta", "rows"} as stored under bench/results), or
    scripts/bench_dense_mlp.py's --json ({"meta", "results"}: one row per timed method)."""
    if isinstance(data, list):
        return data
    if "rows" in data:
        return data["rows"]
    rows = []
    for r in data["results"]:
        mbytes = 3 * r["hidden"] * r["intermediate"] / 1e6  # FP8 weights, scales aside
        for method, name in _BENCH_METHODS.items():
            if r.get(f"{method}_us") is not None:
                x_floor = r[f"{method}_us"] / r["floor_us"]
                rows.append(dict(variant=name, tokens=r["tokens"], mbytes=mbytes, x_floor=x_floor))
    return rows


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """x floor against layer megabytes, one series per (variant, tokens)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    series: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault((r["variant"], r["tokens"]), []).append((r["mbytes"], r["x_floor"]))
    for (variant, tokens), points in sorted(series.items()):
        points.sort()
        name = {"gemv": "fp8_gemv"}.get(variant, variant)
        if re.match(r"^\d+x\d+", variant):
            name = f"fp8_stream {variant}"
        label = f"{name}, {tokens} token" + ("s" if tokens > 1 else "")
        marker = "o" if tokens == 1 else "x"
        ax.plot(*zip(*points, strict=True), marker=marker, linestyle="none", label=label)
    ax.set_xscale("log")
    ratios = [r["x_floor"] for r in rows]
    if max(ratios) > 8 * min(ratios):  # e.g. beside the stock GEMMs: keep the low end readable
        ax.set_yscale("log")
    ax.set_xlabel("layer weight bytes (MB, gate_up + down)")
    ax.set_ylabel("time per layer / copy-bandwidth floor")
    ax.axhline(1.0, color="gray", linewidth=0.5)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """Emit the requests, time the variants on the GPU or plot a --json file.
    ``description``: the --help text (the script's docstring, first line shown)."""
    parser = argparse.ArgumentParser(description=(description or "").split("\n")[0] or None)
    parser.add_argument(
        "--shapes",
        default="",
        help="DENSE_SHAPES or h<hidden>-i<intermediate> names (multiples of 128, e.g. the "
        "grid's h6144-i2816), comma-separated; 'grid': the grid alone",
    )
    parser.add_argument("--grid", action="store_true", help="add the off-table grid")
    parser.add_argument("--tokens", default="1,8", help="token counts, e.g. 1,8")
    parser.add_argument("--variants", default="gemv,4x0", help="gemv and WxR, e.g. gemv,4x6")
    parser.add_argument("--l2-multiple", type=float, default=4.0)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    add_rounds(parser)
    add_norm_between(parser)
    parser.add_argument(
        "--trace",
        action="store_true",
        help="also print per-CTA timestamps of one launch (trace builds)",
    )
    parser.add_argument("--emit", help="write the compile requests (JSON lines) and stop")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", help="with --from-json: draw that file's results into PNG")
    parser.add_argument(
        "--from-json",
        help="results of an earlier --json run or of bench_dense_mlp.py --json (for --plot)",
    )
    args = parser.parse_args(argv)
    if args.replays < 1 or args.warmup < 0:
        parser.error(
            f"--replays must be >= 1 and --warmup >= 0, got --replays {args.replays}, "
            f"--warmup {args.warmup}"
        )
    if args.plot:
        if not args.from_json:
            parser.error("--plot needs --from-json FILE")
        with open(args.from_json) as f:
            plot(plot_rows(json.load(f)), args.plot)
        return 0
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
        args.variants = [parse_variant(v) for v in args.variants.split(",")]
    except ValueError as err:
        parser.error(str(err))
    if args.emit:
        reqs = all_requests(args)
        with open(args.emit, "w") as f:
            for r in reqs:
                f.write(r.to_json_line() + "\n")
        print(f"{len(reqs)} requests -> {args.emit}")
        return 0
    rows = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
