"""The fp8_gemv configs a tuning sweep times (scripts/tune_fp8_gemv.py): per kernel, the
valid variants of one shape and token count (``variants``); per layer, (gate_up, down)
pairs with every PDL trigger combination (``pairs``); their compile requests, and the
config labels the sweep prints and parses ("t4/r3/c2/s3/n2/k256/x4/early").

No GPU, no torch: the lists are what ``--emit`` writes for warming a cache elsewhere.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv import plan, tuning
from mlpjit.kernels.fp8_gemv.params import (
    CLUSTER_SIZES,
    MAX_TOKENS,
    STEP,
    GemvConfig,
    smem_bytes,
)
from mlpjit.testing.layers import DENSE_SHAPES, GEMV_SHAPES, GRID_SHAPES, shape_by_name

__all__ = [
    "ARCH",
    "DEFAULT_KERNEL_SHAPES",
    "DEFAULT_LAYER_SHAPES",
    "GRID_LAYER_NAMES",
    "IN_REGS",
    "KERNEL_SHAPES",
    "KERNEL_TOKENS",
    "LAYER_SHAPES",
    "LAYER_TOKENS",
    "MAX_VARIANTS",
    "SPW_IN_REGS",
    "TILES",
    "default_config",
    "gemv_request",
    "kernel_requests",
    "label",
    "layer_requests",
    "layer_shape",
    "pair_requests",
    "pairs",
    "parse_config",
    "variants",
]


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


def layer_shape(name: str) -> tuple[int, int] | None:
    """(hidden, intermediate shard) of a layer the sweep can time: a preset of LAYER_SHAPES
    or any "h<hidden>-i<intermediate>" (the off-table grid's names among them) whose two
    launches fp8_gemv takes at every token count; None otherwise."""
    if name in LAYER_SHAPES:
        return LAYER_SHAPES[name]
    shape = None if name in DENSE_SHAPES else shape_by_name(name)
    if shape is None:
        return None
    hidden, inter = shape
    return shape if _kernel_takes(2 * inter, hidden) and _kernel_takes(hidden, inter) else None


GRID_LAYER_NAMES = tuple(name for name in dict(GRID_SHAPES) if layer_shape(name) is not None)
DEFAULT_LAYER_SHAPES = tuple(
    f"{model}-tp{tp}" for model in ("glm5", "glm4.5") for tp in (8, 4, 2, 1)
)
KERNEL_TOKENS = (1, 8)
LAYER_TOKENS = (1, 2, 4, 8)
TILES = (1, 2, 4)
IN_REGS = (2, 3, 5, 7)
MAX_VARIANTS = 12  # per shape and token count, before the --slices-per-warp and --clusters ones
SPW_IN_REGS = (0, 1, 2, 3)
ARCH = "sm_90a"


def label(config: GemvConfig) -> str:
    """'t4/r3/c2' (tiles, in_regs, ctas_per_sm), with '/s3' for 3 slices per warp, '/n2'
    for clusters of 2 CTAs, '/k256' for 256-K slices, '/x4' for 4 K splits, '/send' for x
    sent by st.async (send_x), '/l2' for 2 late steps (late_steps), '/p1' for staged steps
    paced one at a time before the wait (paced) and '/early' for the PDL trigger at kernel
    entry."""
    c = config
    spw = f"/s{c.slices_per_warp}" if c.slices_per_warp != 1 else ""
    cluster = f"/n{c.cluster}" if c.cluster != 1 else ""
    slice_k = f"/k{c.slice_k}" if c.slice_k != 512 else ""
    splits = f"/x{c.splits}" if c.splits != 1 else ""
    send = "/send" if c.send_x else ""
    late = f"/l{c.late_steps}" if c.late_steps else ""
    paced = f"/p{c.paced}" if c.paced else ""
    early = "/early" if c.early_launch else ""
    knobs = f"{spw}{cluster}{slice_k}{splits}{send}{late}{paced}{early}"
    return f"t{c.tiles}/r{c.in_regs}/c{c.ctas_per_sm}{knobs}"


def parse_config(text: str) -> GemvConfig:
    """'t4/r3/c2' (tiles, in_regs, ctas_per_sm), then optionally, in any order, '/s2'
    (slices_per_warp), '/n2' (CTAs per cluster), '/k256' (slice_k), '/x4' (K splits), '/l2'
    (late_steps), '/p1' (paced) and '/send' (send_x) -> GemvConfig, trigger after the wait.
    ValueError otherwise."""
    form = "t4/r3/c2, t1/r0/c2/s3, t1/r3/c1/s2/n4, t1/r3/c1/n2/send or t2/r1/c2/k256/x4"
    parts = text.split("/")
    send_x = "send" in parts[3:]
    if send_x:
        parts.remove("send")
    optional = {
        "s": "slices_per_warp", "n": "cluster", "k": "slice_k", "x": "splits", "l": "late_steps",
        "p": "paced",
    }
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
    later = min(extra.get("late_steps", 0), extra.get("paced", 0))
    if min(tiles, cps, spw) < 1 or in_regs < 0 or later < 0:
        raise ValueError(f"config needs tiles, ctas_per_sm, slices >= 1 and in_regs >= 0: {text!r}")
    if extra.get("cluster", 1) not in CLUSTER_SIZES:
        raise ValueError(f"config's cluster (/n) must be one of {CLUSTER_SIZES}: {text!r}")
    if send_x and extra.get("cluster", 1) == 1:
        raise ValueError(f"config's /send needs a cluster (/n2 or more): {text!r}")
    return GemvConfig(tiles, in_regs, cps, send_x=send_x, **extra)


def _with_cluster(config: GemvConfig, cluster: int) -> GemvConfig:
    """``config`` in clusters of ``cluster`` CTAs; send_x kept only while there is one."""
    return dataclasses.replace(config, cluster=cluster, send_x=config.send_x and cluster > 1)


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
        clustered = _with_cluster(c, n)
        if tuning.config_fits(rows, k, tokens, clustered) and clustered not in ordered:
            ordered.append(clustered)
    return ordered


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
    send_x: bool = False,
    late: Sequence[int] = (),
    paced: Sequence[int] = (),
    paced_down: Sequence[int] = (),
    paced_regs: Sequence[int] = (),
) -> list[tuple[GemvConfig, GemvConfig]]:
    """choose_config's (gate_up, down) with each early_launch combination, then every
    (gate_up, down) of the defaults, tuning.spread_config's picks and the extra configs
    that fit (and the ``spread`` best picks of tuning.spread_configs, paced as the planner
    would pace them: tuning.with_pace), with gate_up's trigger
    at entry and after the wait (down's after the wait); then, per cluster size in
    ``clusters``, the default pair with gate_up, down and both set to that cluster size
    (where it fits); with ``send_x``, the default pair with the way each of its clustered
    kernels shares x (GemvConfig.send_x) switched, and both; per count in ``late``, the
    default pair with gate_up requesting that many staged steps after x (GemvConfig.late_steps,
    at most the config's staged steps; where it fits); per count in ``paced``, the default
    pair with gate_up keeping that many staged steps in flight until the wait returns
    (GemvConfig.paced, instead of any late steps; 0: without pacing; where it fits); per
    count in ``paced_down``, the default pair with down paced so (where it fits); per count
    in ``paced_regs``, the default pair with gate_up, then down, holding that many steps in
    registers and paced (its own pace, else tuning.PACED; where it fits): fewer register
    steps put fewer bytes ahead of x."""
    gate_up = tuning.choose_config(2 * inter, hidden, m, True)
    down = tuning.choose_config(hidden, inter, m, False)
    found = [
        (dataclasses.replace(gate_up, early_launch=g), dataclasses.replace(down, early_launch=d))
        for g, d in itertools.product((False, True), repeat=2)
    ]
    # The model's spread picks (K splits, any tiles) beside the defaults, where they differ,
    # paced as the planner would pace them.
    if spread:
        spread_g = [
            tuning.with_pace(2 * inter, hidden, m, True, c)
            for c in tuning.spread_configs(2 * inter, hidden, m, count=spread)
        ]
        spread_d = [
            tuning.with_pace(hidden, inter, m, False, c)
            for c in tuning.spread_configs(hidden, inter, m, count=spread)
        ]
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
        g, d = _with_cluster(gate_up, n), _with_cluster(down, n)
        g_fits = tuning.config_fits(2 * inter, hidden, m, g)
        d_fits = tuning.config_fits(hidden, inter, m, d)
        for pair, ok in (((g, down), g_fits), ((gate_up, d), d_fits), ((g, d), g_fits and d_fits)):
            if ok and pair not in found:
                found.append(pair)
    if send_x:
        g = dataclasses.replace(gate_up, send_x=not gate_up.send_x and gate_up.cluster > 1)
        d = dataclasses.replace(down, send_x=not down.send_x and down.cluster > 1)
        for pair in ((g, down), (gate_up, d), (g, d)):
            if pair not in found:
                found.append(pair)
    for n in late:  # gate_up only: on the down projection late steps lost everywhere
        g = _with_late(gate_up, n)
        if g is not None and tuning.config_fits(2 * inter, hidden, m, g) and (g, down) not in found:
            found.append((g, down))
    for n in paced:
        g = dataclasses.replace(gate_up, late_steps=0, paced=n)
        if tuning.config_fits(2 * inter, hidden, m, g) and (g, down) not in found:
            found.append((g, down))
    for n in paced_down:
        d = dataclasses.replace(down, late_steps=0, paced=n)
        if tuning.config_fits(hidden, inter, m, d) and (gate_up, d) not in found:
            found.append((gate_up, d))
    for r in paced_regs:
        g, d = (
            dataclasses.replace(c, in_regs=r, late_steps=0, paced=c.paced or tuning.PACED)
            for c in (gate_up, down)
        )
        g_fits = tuning.config_fits(2 * inter, hidden, m, g)
        d_fits = tuning.config_fits(hidden, inter, m, d)
        for pair, ok in (((g, down), g_fits), ((gate_up, d), d_fits)):
            if ok and pair not in found:
                found.append(pair)
    return found


def _with_late(config: GemvConfig, n: int) -> GemvConfig | None:
    """``config`` with min(n, its staged steps) late steps instead of any pacing; None where
    it has several slices per warp or nothing staged (late_steps needs one slice per warp and
    a staged step)."""
    staged = config.slice_k // STEP - config.in_regs
    if config.slices_per_warp > 1 or staged < 1:
        return None
    return dataclasses.replace(config, late_steps=min(n, staged), paced=0)


def pair_requests(
    hidden: int, inter: int, m: int, pair: tuple[GemvConfig, GemvConfig], arch: str = ARCH
) -> tuple[KernelRequest, KernelRequest]:
    """The (gate_up, down) compile requests of one timed pair."""
    g, d = pair
    return (
        gemv_request(2 * inter, hidden, True, m, g, arch),
        gemv_request(hidden, inter, False, m, d, arch),
    )


def layer_requests(
    shapes: Sequence[str],
    tokens: Sequence[int],
    extra_down: Sequence[GemvConfig] = (),
    extra_gate_up: Sequence[GemvConfig] = (),
    arch: str = ARCH,
    clusters: Sequence[int] = (),
    spread: int = 0,
    send_x: bool = False,
    late: Sequence[int] = (),
    paced: Sequence[int] = (),
    paced_down: Sequence[int] = (),
    paced_regs: Sequence[int] = (),
) -> list[KernelRequest]:
    """The distinct compile requests of every pair the layer sweep times."""
    out: list[KernelRequest] = []
    for name in shapes:
        hidden, inter = layer_shape(name)
        for m in tokens:
            for pair in pairs(
                hidden, inter, m, extra_down, extra_gate_up, clusters, spread, send_x, late,
                paced, paced_down, paced_regs,
            ):  # fmt: skip
                out += [r for r in pair_requests(hidden, inter, m, pair, arch) if r not in out]
    return out
