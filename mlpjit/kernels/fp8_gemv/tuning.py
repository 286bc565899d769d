"""Which shapes fp8_gemv takes, and its tuning knobs per shape: a measured table for the
GLM shapes on the H200 and heuristics for every other shape.

What the sweeps behind the table and the heuristics found is in docs/KERNEL_NOTES.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from mlpjit.kernels import hopper
from mlpjit.kernels.checks import check_bool, check_int
from mlpjit.kernels.fp8_gemv.params import (
    GROUP,
    MAX_K,
    MAX_PENDING_GROUPS,
    MAX_ROWS,
    MAX_TOKENS,
    MAX_WARPS,
    SLICE,
    SLICE_SIZES,
    SPLITS_MAX,
    STEP,
    GemvConfig,
    GemvParams,
    cta_threads,
    grid_ctas,
    is_persistent,
    smem_bytes,
)

__all__ = [
    "TUNED_H200",
    "choose_config",
    "config_fits",
    "kernel_supports",
    "max_in_regs",
    "spread_config",
    "spread_configs",
]

# Registers the kernel needs besides the in-register weights (8 per in_regs step), measured
# with ptxas 13.0 under launch bounds: in_regs=3 fits the 80-register bound (768 threads per
# SM) without spilling for every GLM-5 shape and token count.
BASE_REGS = 56
# Grids meant as one wave must be resident at once (hopper.resident_ctas). A persistent
# grid with x shared over clusters uses clusters of at most 2 (they fill every slot).
MAX_PERSISTENT_CLUSTER = hopper.MAX_FULL_CLUSTER


def max_in_regs(
    k: int,
    tokens: int,
    tiles: int,
    ctas_per_sm: int,
    slices_per_warp: int = 1,
    *,
    slice_k: int = SLICE,
    splits: int = 1,
) -> int | None:
    """The most 64-K steps in registers that fit the register and shared-memory budgets
    of this tiling and launch bound, or None if none does."""
    threads = cta_threads(k, tiles, slices_per_warp, slice_k=slice_k, splits=splits)
    if threads * ctas_per_sm > hopper.THREADS_PER_SM:
        return None
    regs = hopper.reg_budget(threads, ctas_per_sm)
    # At most steps-1: with no cp.async at all, ptxas 13.0 hoists griddepcontrol.wait
    # (ACQBULK) above every weight load, losing the PDL overlap; a committed cp.async group
    # keeps the loads before it (tests/test_fp8_gemv_compile.py checks the order).
    in_regs = min(slice_k // STEP - 1, (regs - BASE_REGS) // (8 * slices_per_warp))
    smem = smem_bytes(k, tokens, tiles, in_regs, slices_per_warp, slice_k=slice_k, splits=splits)
    if in_regs < 0 or smem > hopper.smem_budget(ctas_per_sm):
        return None
    return in_regs


def _config(
    tiles: int,
    in_regs: int,
    ctas_per_sm: int,
    *,
    early: bool = False,
    spw: int = 1,
    cluster: int = 1,
    slice_k: int = SLICE,
    splits: int = 1,
) -> GemvConfig:
    return GemvConfig(tiles, in_regs, ctas_per_sm, early, spw, cluster, slice_k, splits)


# The fastest config per GLM shape on one H200 (132 SMs), from per-kernel sweeps
# (`scripts/tune_fp8_gemv.py kernel`) and layer-level pair sweeps (`... layer`) at 1-8
# tokens; docs/KERNEL_NOTES.md has the variants and numbers. (rows, k, swiglu) ->
# ((up to tokens, config), ...): a token count takes the first entry whose bound covers it;
# shapes not listed, an entry of None, or one that does not fit a token count, use the
# heuristic.
# early=True (PDL trigger at kernel entry, so the down kernel starts streaming while gate_up
# still runs) only where it won >= 0.25 us per layer, and only on gate_up: after down a
# server runs no mlpjit kernel. cluster=2 where clusters of 2 won >= 0.2 us per layer in two
# sweeps; spw = slices per warp, mostly with persistent grids (TP 4, 2, 1).
TUNED_H200: dict[tuple[int, int, bool], tuple[tuple[int, GemvConfig | None], ...]] = {
    # GLM-5 (hidden 6144, intermediate 12288) TP 8
    (3072, 6144, True): (
        (1, _config(1, 3, 2)),
        (4, _config(1, 3, 1)),
        (8, _config(1, 3, 1, cluster=2)),
    ),
    (6144, 1536, False): (
        (1, _config(4, 3, 2)),
        (4, _config(4, 1, 2, spw=3)),
        (8, _config(4, 1, 2, spw=3, cluster=2)),
    ),
    # GLM-5 TP 4
    (6144, 6144, True): (
        (1, _config(1, 0, 2, spw=2)),
        (2, _config(1, 0, 2, spw=3)),
        (3, _config(1, 2, 2, spw=3)),
        (4, _config(1, 2, 2, spw=3, cluster=2)),
        (5, _config(1, 3, 1)),
        (8, _config(1, 3, 1, cluster=2)),
    ),
    (6144, 3072, False): (
        (2, _config(4, 0, 1, spw=2)),
        (4, _config(2, 2, 2)),
        (5, _config(4, 0, 1, spw=2)),
        (7, _config(4, 0, 1, spw=2, cluster=2)),
        (8, _config(4, 0, 1, spw=2)),
    ),
    # GLM-5 TP 2
    (12288, 6144, True): (
        (1, _config(1, 2, 2, spw=3)),
        (2, _config(1, 0, 2, spw=3)),
        (4, _config(1, 2, 2, spw=3)),
        (7, _config(1, 3, 1)),
        (8, _config(1, 3, 1, cluster=2)),
    ),
    (6144, 6144, False): (
        (2, _config(1, 0, 2, spw=2)),
        (4, _config(1, 2, 1)),
        (8, _config(1, 0, 1, spw=2)),
    ),
    # GLM-5 TP 1
    (24576, 6144, True): (
        (2, _config(1, 0, 2, spw=3)),
        (3, _config(1, 0, 1, spw=3)),
        (4, _config(1, 0, 1, spw=3, cluster=2)),
        (8, _config(1, 3, 1, cluster=2)),
    ),
    # At 8 tokens spw 3 in clusters of 2 beat the unclustered spw 2 pick by 1.3 us per layer
    # (spw 2 in clusters spills; spw 2 unclustered spills at 5-7 tokens).
    (6144, 12288, False): (
        (1, _config(1, 0, 1, spw=3)),
        (2, _config(1, 0, 1, spw=2)),
        (6, _config(1, 2, 1, spw=3, cluster=2)),
        (8, _config(1, 3, 1, spw=3, cluster=2)),
    ),
    # GLM-4.5 (hidden 5120) TP 8
    (3072, 5120, True): (
        (1, _config(1, 3, 2)),
        (2, _config(1, 2, 2)),
        (4, _config(1, 3, 1)),
        (8, _config(2, 2, 1, early=True)),
    ),
    (5120, 1536, False): (
        (1, _config(2, 2, 2)),
        (4, _config(4, 0, 2, spw=3)),
        (8, _config(2, 2, 2)),
    ),
    # GLM-4.5 TP 4 gate_up: at 1 token the one-wave heuristic's pick beat the wide persistent
    # one (16.54 vs 17.57 us per layer), at 2-8 tokens the wide one won by 1.08-1.15x; at 8
    # tokens clusters of 2 by 0.2-0.6 us.
    (6144, 5120, True): (
        (1, _config(2, 3, 1)),
        (7, _config(1, 0, 1, spw=2)),
        (8, _config(1, 0, 1, spw=2, cluster=2)),
    ),
    # From the layer sweeps of the K-granularity-128 kernels (`tune_fp8_gemv.py layer
    # --spread 3`), where a pair beat the planner's by >= 2%; token counts not listed keep
    # the planner's pick (an entry of None). DeepSeek-V3 (hidden 7168) TP 8: the down
    # projection's K-split pick (7 tiles x 2 splits) lost 1-2 us to 4 whole-K tiles.
    (7168, 2304, False): (
        (2, _config(4, 3, 1, spw=3, slice_k=256)),
        (8, None),
    ),
    # DeepSeek-V3 shared expert TP 8 (512 gate_up rows split 4 or 7 ways along K).
    (512, 7168, True): (
        (1, None),
        (4, None),
        (8, _config(2, 3, 2, slice_k=256, splits=7)),
    ),
    (7168, 256, False): (
        (1, _config(4, 1, 2, slice_k=128)),
        (8, None),
    ),
    # DeepSeek-V3 shared expert TP 1.
    (7168, 2048, False): ((8, _config(7, 3, 1, splits=2)),),
    (4096, 7168, True): (
        (1, None),
        (2, _config(2, 3, 1, spw=2)),
        (4, _config(2, 1, 1)),
        (8, _config(4, 2, 1, spw=7, slice_k=256, splits=2)),
    ),
    # Where the old whole-K cost model's pick beat modeled_us's by more than 3% in the
    # validation of variant 29 (same run, side by side): Qwen3-14B TP 8 down (17 K blocks)
    # 15.91 vs 17.03 us per layer at 1 token, GLM-4.5 TP 1 down 58.00 vs 60.16 at 8.
    (5120, 2176, False): ((8, _config(4, 0, 1, spw=17, slice_k=128)),),
    (5120, 12288, False): (
        (4, None),
        (8, _config(1, 1, 1, spw=3, slice_k=256, splits=2)),
    ),
    # Qwen3-32B (hidden 5120) TP 8.
    (6400, 5120, True): (
        (1, _config(1, 3, 1)),
        (4, None),
        (8, _config(1, 3, 1)),
    ),
    (5120, 3200, False): (
        (1, _config(1, 1, 3, spw=5, slice_k=128)),
        (8, _config(8, 0, 2, spw=5, slice_k=128, splits=5)),
    ),
}
# Heuristic picks keep at most this many steps in registers: 2-3 beat more in the sweeps
# (more registers cost occupancy, and ptxas may sink register loads below the PDL wait).
HEURISTIC_MAX_IN_REGS = 3
# From this many tokens on, heuristic picks run in clusters of 2 (where the grid allows):
# at 8 tokens that won 0.4-2.3 us per layer on every untuned GLM-4.5 shape (TP4/TP2/TP1),
# at 4 tokens it won at TP1 only and lost up to 0.4 us elsewhere.
HEURISTIC_CLUSTER_MIN_TOKENS = 5


def config_fits(rows: int, k: int, tokens: int, config: GemvConfig, sms: int = hopper.SMS) -> bool:
    """Whether ``config`` compiles for this shape (GemvParams takes it) AND runs as planned:
    registers within the launch bound (no spills) and a cluster grid meant as one wave
    resident at once."""
    try:
        p = _launch(rows, k, tokens, config, sms)
    except ValueError:
        return False
    slots = sms * p.ctas_per_sm
    if p.cluster_ctas > MAX_PERSISTENT_CLUSTER and (
        slots >= p.ctas > hopper.resident_ctas(slots, p.cluster_ctas)
    ):
        return False  # meant as one wave, but not resident at once
    geometry = {"slice_k": p.slice_k, "splits": p.splits}
    fit = max_in_regs(k, tokens, p.tiles, p.ctas_per_sm, p.spw, **geometry)
    return fit is not None and p.in_regs <= fit


def _tuned(rows: int, k: int, tokens: int, swiglu: bool, sms: int) -> GemvConfig | None:
    if sms != hopper.SMS:
        return None  # measured on 132 SMs: grids and pairings need not carry over
    for bound, config in TUNED_H200.get((rows, k, swiglu), ()):
        if tokens <= bound:
            return config if config is not None and config_fits(rows, k, tokens, config) else None
    return None


def _check_shape(rows: int, k: int, tokens: int) -> None:
    """Ints >= 1, rows and k at most MAX_ROWS and MAX_K: the searches below grow with the
    sizes, so a huge one is refused here instead of never finishing."""
    check_int("rows", rows, 1, MAX_ROWS)
    check_int("k", k, 1, MAX_K)
    check_int("tokens", tokens, 1)


def one_wave_candidates(
    rows: int, k: int, tokens: int, sms: int = hopper.SMS
) -> list[tuple[tuple, GemvConfig]]:
    """(score, config) of every one-CTA-per-tile tiling of whole-K 512-K slices that fits,
    lower score better (none when 512 does not divide k)."""
    slices = k // SLICE
    found = []
    if k % SLICE:
        return found
    tiles = 1
    while tiles * slices <= MAX_WARPS:
        if rows % (16 * tiles) == 0:
            ctas = rows // (16 * tiles)
            for cps in range(1, 9):
                in_regs = max_in_regs(k, tokens, tiles, cps)
                if in_regs is None:
                    continue
                waves = math.ceil(ctas / (sms * cps))
                # Fewest waves; then use as many SMs as possible (bandwidth per SM is
                # limited); then fewer CTAs (each one re-quantizes all of x); then the
                # lightest launch bound.
                score = (waves, -min(ctas, sms), ctas, cps)
                found.append((score, GemvConfig(tiles, in_regs, cps)))
        tiles *= 2
    return found


def kernel_supports(rows: int, k: int, tokens: int, sms: int = hopper.SMS) -> bool:
    """True when fp8_gemv can run this shape on a GPU of ``sms`` SMs; otherwise callers use
    the stock path."""
    _check_shape(rows, k, tokens)
    hopper.check_sms(sms)
    if tokens > MAX_TOKENS or k % GROUP or rows % 16:
        return False
    if k % SLICE == 0 and one_wave_candidates(rows, k, tokens, sms):
        return True
    return _spread(rows, k, tokens, sms) is not None


# The model _spread ranks decompositions with: the busiest SM's bytes, where a CTA costs its
# weight bytes plus X_COST per byte of the bf16 x part it reads and quantizes (from L2, but
# on the critical path after the PDL wait; with fewer than QUANT_WARPS warps proportionally
# more), and a K split SPLIT_COST bytes per row tile, SPLIT_STEP more per split past two
# (its cluster barrier, whose release waits for every memory access in flight, and the
# partials through distributed shared memory at the kernel's tail). A pick replaces the
# whole-K heuristics' only if it models SPREAD_GAIN faster. SPLIT_COST from the H200 layer
# sweeps (docs/KERNEL_NOTES.md): at 8 KB the model split DeepSeek-V3 TP 8's gate_up in two
# in a persistent grid (5.3 us slower than whole K) and preferred splits that lost 1-2 us.
X_COST = 1.0
QUANT_WARPS = 8
SPLIT_COST = 16 * 1024
SPLIT_STEP = 2 * 1024
SPREAD_GAIN = 0.9
# ... and only where the whole-K pick leaves the busiest SM this far above the mean: the
# whole-K heuristics were measured best on the evenly spread GLM shapes (persistent grids
# of many row tiles per CTA, one-wave grids that fill the SMs).
SPREAD_BELOW_BALANCE = 0.85
# Where the rules above pick a _spread decomposition, it is the one modeled_us rates fastest
# among those that fit (kernels of RERANK_MIN_BYTES of weights or more, or fewer than
# HEURISTIC_CLUSTER_MIN_TOKENS tokens; below that the cost model above ranks them): an
# estimate of the kernel's time in microseconds fitted to layer sweeps of the off-table grid
# on the H200 (docs/KERNEL_NOTES.md, variant 29): the busiest SM's weight bytes at
# HBM_KB_PER_US (4.1 TB/s over 132 SMs), PERSISTENT_US for a persistent grid, ROUND_US per
# row tile (or K split) a CTA takes in turn, SPLIT_US per K split past the first. K splits in
# persistent grids are left out (variant 20: each round's cluster barrier waits for the next
# tile's weights in flight).
RERANK_MIN_BYTES = 4 * 1024 * 1024
HBM_KB_PER_US = 31.0
PERSISTENT_US = 2.0
ROUND_US = 0.25
SPLIT_US = 0.4
SPREAD_MAX_CTAS_PER_SM = 4
# Where no one-wave decomposition fits (more weights than one wave's shared memory and
# registers hold, and no persistent form: Qwen3-14B's TP-1 down projection, 5 waves), at
# most this many waves of one CTA per (tile, split); larger shapes run the stock path.
SPREAD_MAX_WAVES = 8
# _spread_regs' bases: BASE_REGS and WIDE_BASE_REGS less the weight scales of the 512-K
# slices they were measured with (8 per slice, 2-3 slices per warp for the latter).
# The K splits' extra (their reduction, and the split's offsets) from the spills of
# ptxas 13.0 at the bounds just below these.
SPREAD_BASE_REGS = 56
SPREAD_PERSISTENT_BASE_REGS = 124
SPREAD_SPLIT_REGS = 16
SPREAD_PERSISTENT_SPLIT_REGS = 48


def spread_config(rows: int, k: int, tokens: int, sms: int = hopper.SMS) -> GemvConfig | None:
    """The best decomposition of any tiles, K splits and slice size by the model below (see
    _spread), whether or not choose_config would take it; None if nothing fits. Tuning
    sweeps measure it beside the table's and the whole-K heuristics' picks."""
    found = spread_configs(rows, k, tokens, sms, 1)
    return found[0] if found else None


def spread_configs(
    rows: int, k: int, tokens: int, sms: int = hopper.SMS, count: int = 4
) -> list[GemvConfig]:
    """The ``count`` best decompositions by the model, best first (for tuning sweeps)."""
    return [config for _, config in _spread_ranked(rows, k, tokens, sms)[:count]]


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _modeled_cost(
    rows: int, k: int, tokens: int, tiles: int, ctas: int, splits: int, warps: int, sms: int
) -> float:
    """Bytes the busiest SM moves, in the model above (``ctas`` CTAs, one resident wave; a
    persistent grid's CTAs take several row tiles in turn)."""
    kc = k // splits
    rounds = math.ceil(rows // (16 * tiles) * splits / ctas)
    quant = X_COST * tokens * kc * 2 * max(1.0, QUANT_WARPS / warps)
    split = SPLIT_COST + SPLIT_STEP * (splits - 2) if splits > 1 else 0
    return math.ceil(ctas / sms) * (rounds * (16 * tiles * kc + split) + quant)


def modeled_us(
    rows: int, k: int, tokens: int, config: GemvConfig, sms: int = hopper.SMS
) -> tuple[int, float]:
    """(waves, estimated microseconds) of a config in the model above."""
    p = _launch(rows, k, tokens, config, sms)
    return _modeled_us(rows, k, config, p.ctas, sms)


def _modeled_us(rows: int, k: int, config: GemvConfig, ctas: int, sms: int) -> tuple[int, float]:
    units = rows // (16 * config.tiles) * config.splits  # (row tile, K split) pairs
    cluster = max(config.cluster, config.splits)
    waves = math.ceil(ctas / hopper.resident_ctas(sms * config.ctas_per_sm, cluster))
    per_sm = math.ceil(ctas / sms)  # CTAs on the busiest SM
    rounds = per_sm * math.ceil(units / ctas)  # units it takes in turn
    weight_kb = rounds * 16 * config.tiles * (k // config.splits) / 1e3
    us = (
        weight_kb / HBM_KB_PER_US
        + PERSISTENT_US * is_persistent(rows, config.tiles, config.splits, ctas)
        + ROUND_US * rounds
        + SPLIT_US * (config.splits - 1)
    )
    return waves, us


@functools.lru_cache(maxsize=4096)
def _spread_pick(rows: int, k: int, tokens: int, sms: int) -> GemvConfig:
    """The _spread decomposition choose_config takes: by modeled_us where it applies
    (RERANK_MIN_BYTES), else the cost model's best."""
    ranked = _spread_ranked(rows, k, tokens, sms)
    if rows * k < RERANK_MIN_BYTES and tokens >= HEURISTIC_CLUSTER_MIN_TOKENS:
        return ranked[0][1]
    best = None
    for order, (rank, config) in enumerate(ranked):
        ctas = rank[-1]
        if config.splits > 1 and is_persistent(rows, config.tiles, config.splits, ctas):
            continue  # a persistent grid split along K
        rating = (*_modeled_us(rows, k, config, ctas, sms), order)
        if best is None or rating < best[0]:
            best = (rating, config)
    return best[1] if best is not None else ranked[0][1]


def _spread(rows: int, k: int, tokens: int, sms: int) -> tuple[float, GemvConfig] | None:
    """(modeled cost, config) of the best decomposition over tiles per CTA, K splits (1-8
    CTAs of a cluster), slice size, slices per warp and launch bound that fits the register,
    shared-memory and residency budgets: one CTA per (tile, split) in one resident wave, or
    a persistent grid of one wave (several waves only where neither fits); None if nothing
    fits."""
    ranked = _spread_ranked(rows, k, tokens, sms)
    return (ranked[0][0][1], ranked[0][1]) if ranked else None


@functools.lru_cache(maxsize=4096)
def _spread_ranked(
    rows: int, k: int, tokens: int, sms: int
) -> tuple[tuple[tuple, GemvConfig], ...]:
    """Every _spread decomposition that fits, as (rank, config), best first: those of one
    wave, or where there are none (more weights than one wave's shared memory and registers
    hold, and no persistent form fits: Qwen3-14B's TP-1 down projection), those of several
    waves of one CTA per (tile, split), fewest waves first."""
    ranked = _spread_candidates(rows, k, tokens, sms, waves_ok=False)
    if not ranked:
        ranked = _spread_candidates(rows, k, tokens, sms, waves_ok=True)
    return tuple(sorted(ranked, key=lambda item: item[0]))


def _spread_candidates(
    rows: int, k: int, tokens: int, sms: int, waves_ok: bool
) -> list[tuple[tuple, GemvConfig]]:
    ranked = []
    row_tiles = rows // 16
    for splits in _divisors(k // GROUP, SPLITS_MAX):
        kc = k // splits
        for slice_k in SLICE_SIZES:
            if kc % slice_k:
                continue
            slices = kc // slice_k
            for tiles in _divisors(row_tiles, MAX_WARPS):
                for spw in _divisors(slices, slices):
                    warps = tiles * slices // spw
                    if warps > MAX_WARPS:
                        continue
                    for cps in range(1, SPREAD_MAX_CTAS_PER_SM + 1):
                        found = _spread_config(
                            rows, k, tokens, tiles, spw, cps, slice_k, splits, sms, waves_ok
                        )
                        if found is None:
                            continue
                        config, ctas = found
                        waves = math.ceil(ctas / hopper.resident_ctas(sms * cps, splits))
                        cost = _modeled_cost(rows, k, tokens, tiles, ctas, splits, warps, sms)
                        # Then: fewer splits, longer slices, fewer warps, lighter launch bound
                        # (the grid last: what _spread_pick's model reads).
                        rank = (waves, cost, splits, -slice_k, warps, cps, ctas)
                        ranked.append((rank, config))
    return ranked


def _spread_config(
    rows: int, k: int, tokens: int, tiles: int, spw: int, cps: int, slice_k: int, splits: int,
    sms: int, waves_ok: bool = False,
) -> tuple[GemvConfig, int] | None:  # fmt: skip
    """The config (and its grid) of one _spread decomposition, with the fewest register
    steps that fit (at most HEURISTIC_MAX_IN_REGS where shared memory allows), or None."""
    geometry = {"slice_k": slice_k, "splits": splits}
    fit = max_in_regs(k, tokens, tiles, cps, spw, **geometry)
    if fit is None or hopper.resident_ctas(sms * cps, splits) == 0:
        return None  # nothing fits, or not even one cluster of the splits is resident
    cap = min(fit, HEURISTIC_MAX_IN_REGS)
    for in_regs in [*range(cap, -1, -1), *range(cap + 1, fit + 1)]:
        ctas = _spread_grid(rows, k, tokens, tiles, spw, cps, in_regs, geometry, sms, waves_ok)
        if ctas is not None:
            break
    else:
        return None
    config = GemvConfig(tiles, in_regs, cps, slices_per_warp=spw, slice_k=slice_k, splits=splits)
    return config, ctas


def _spread_grid(
    rows: int, k: int, tokens: int, tiles: int, spw: int, cps: int, in_regs: int,
    geometry: dict, sms: int, waves_ok: bool = False,
) -> int | None:  # fmt: skip
    """The grid of a _spread decomposition with ``in_regs`` register steps, or None where
    it does not fit shared memory, the cp.async groups, or the persistent kernel's
    registers, or is more than one wave."""
    slice_k, splits = geometry["slice_k"], geometry["splits"]
    if smem_bytes(k, tokens, tiles, in_regs, spw, **geometry) > hopper.smem_budget(cps):
        return None
    if spw * (slice_k // STEP - in_regs) > MAX_PENDING_GROUPS:
        return None
    ctas = grid_ctas(rows, k, tiles, in_regs, cps, spw, sms, **geometry)
    persistent = is_persistent(rows, tiles, splits, ctas)
    if persistent and tiles > 1:
        return None  # persistent grids were only measured with one tile per CTA
    waves = math.ceil(ctas / hopper.resident_ctas(sms * cps, splits))
    if not persistent and waves > (SPREAD_MAX_WAVES if waves_ok else 1):
        return None
    threads = cta_threads(k, tiles, spw, **geometry)
    if _spread_regs(spw, in_regs, slice_k, splits, persistent) > hopper.reg_budget(threads, cps):
        return None
    return ctas


def _spread_regs(spw: int, in_regs: int, slice_k: int, splits: int, persistent: bool) -> int:
    """Registers a thread of a _spread config needs (ptxas 13.0, no spills): a base, and
    per slice of the warp its register steps (8 each), weight scales (2 rows x
    slice_k/128) and addresses; the persistent form holds the next tile's addresses and
    refill state too, and its K splits their reduction's."""
    per_slice = 8 * in_regs + 2 * (slice_k // GROUP)
    if not persistent:
        split = SPREAD_SPLIT_REGS if splits > 1 else 0
        return SPREAD_BASE_REGS + split + spw * (per_slice + 4)
    split = SPREAD_PERSISTENT_SPLIT_REGS if splits > 1 else 0
    return SPREAD_PERSISTENT_BASE_REGS + split + spw * (per_slice + 11)


def choose_config(
    rows: int, k: int, tokens: int, swiglu: bool, sms: int = hopper.SMS
) -> GemvConfig:
    """Default config for a shape: the H200-measured best where TUNED_H200 has one (GLM,
    DeepSeek-V3 TP 8 and its shared expert, Qwen3-32B TP 8); elsewhere the whole-K
    heuristics (for k a multiple of 512: a persistent grid with several slices per warp for
    many rows and large k, _wide_persistent, else about one wave of resident CTAs over all
    SMs; at most HEURISTIC_MAX_IN_REGS steps in registers, in clusters of 2 from
    HEURISTIC_CLUSTER_MIN_TOKENS tokens on), unless they leave SMs unevenly loaded and
    _spread's search over tiles, K splits and slice sizes models faster, or they do not
    apply (k not a multiple of 512); a _spread pick is then the fastest by modeled_us (see
    RERANK_MIN_BYTES). No register spills either way.

    ``swiglu`` takes the same tiling (a CTA's 16-row tile is 8 gate + 8 up rows). ``sms``:
    the target GPU's SM count; TUNED_H200 only applies at hopper.SMS (132).
    ValueError if the kernel cannot take the shape (see kernel_supports).
    """
    hopper.check_sms(sms)
    check_bool("swiglu", swiglu)
    if swiglu and rows % 2:
        raise ValueError(f"rows must be even with swiglu, got {rows}")
    if not kernel_supports(rows, k, tokens, sms):
        raise ValueError(
            f"fp8_gemv cannot take rows={rows}, k={k}, tokens={tokens}: needs k % {GROUP} == 0, "
            f"rows % 16 == 0 and 1 <= tokens <= {MAX_TOKENS}, within the shared-memory and "
            "register limits"
        )
    tuned = _tuned(rows, k, tokens, swiglu, sms)
    if tuned is not None:
        return tuned
    pick = _whole_k_pick(rows, k, tokens, sms)
    spread = _spread(rows, k, tokens, sms)
    if pick is None and spread is None:
        raise ValueError(
            f"fp8_gemv has no decomposition of rows={rows}, k={k}, tokens={tokens} that fits "
            f"a {sms}-SM GPU"
        )
    if pick is None:
        return _spread_pick(rows, k, tokens, sms)
    launch = _launch(rows, k, tokens, pick, sms)
    uneven = _balance(launch) < SPREAD_BELOW_BALANCE
    if spread is not None and uneven and spread[0] < SPREAD_GAIN * _launch_cost(launch):
        return _spread_pick(rows, k, tokens, sms)
    if tokens >= HEURISTIC_CLUSTER_MIN_TOKENS:
        clustered = replace(pick, cluster=2)
        if config_fits(rows, k, tokens, clustered, sms):
            return clustered
    return pick


def _whole_k_pick(rows: int, k: int, tokens: int, sms: int) -> GemvConfig | None:
    """The whole-K heuristic (512-K slices): a wide persistent grid, else the best
    one-wave tiling; None if k is not a multiple of 512 or nothing fits."""
    if k % SLICE:
        return None
    pick = _wide_persistent(rows, k, tokens, sms)
    if pick is not None:
        return pick
    candidates = one_wave_candidates(rows, k, tokens, sms)
    if not candidates:
        return None
    best = min(candidates, key=lambda c: c[0])[1]
    return GemvConfig(best.tiles, min(best.in_regs, HEURISTIC_MAX_IN_REGS), best.ctas_per_sm)


def _launch(rows: int, k: int, tokens: int, config: GemvConfig, sms: int) -> GemvParams:
    """The launch geometry of a config (the epilogue does not change it: plain kernel)."""
    return GemvParams.of(rows, k, tokens, config, swiglu=False, limit=None, ue8m0=False, sms=sms)


def _balance(p: GemvParams) -> float:
    """Mean weight bytes per SM over the busiest SM's, for a launch (1: even)."""
    units = p.row_tiles * p.splits
    busiest = math.ceil(p.ctas / p.sms) * math.ceil(units / p.ctas)
    return units / p.sms / busiest


def _launch_cost(p: GemvParams) -> float:
    """_modeled_cost of a launch (persistent grids included)."""
    return _modeled_cost(p.rows, p.k, p.tokens, p.tiles, p.ctas, p.splits, p.warps, p.sms)


# Heuristic for shapes with at least two waves of 16-row tiles and k >= WIDE_MIN_K: the
# measured GLM picks at TP1/TP2/TP4 were persistent grids with 2-3 slices per warp and as
# little as possible in registers. Fewest register steps first, then (ctas_per_sm,
# slices_per_warp) in WIDE_ORDER. A persistent thread needs about WIDE_BASE_REGS registers
# besides its register steps: ptxas 13.0 spilled 2 slices per warp at 168 registers with 2
# steps each.
WIDE_MIN_K = 4096
WIDE_ORDER = ((2, 3), (1, 2), (1, 3), (2, 2))
WIDE_MAX_IN_REGS = 3
WIDE_BASE_REGS = 140


def _wide_persistent(rows: int, k: int, tokens: int, sms: int = hopper.SMS) -> GemvConfig | None:
    slices = k // SLICE
    tiles_total = rows // 16
    if k < WIDE_MIN_K or k % SLICE or tiles_total < 2 * sms:
        return None
    for in_regs in range(WIDE_MAX_IN_REGS + 1):
        for cps, spw in WIDE_ORDER:
            if slices % spw or grid_ctas(rows, k, 1, in_regs, cps, spw, sms) >= tiles_total:
                continue  # not persistent: too few registers at this bound, or too few tiles
            threads = cta_threads(k, 1, spw)
            if threads * cps > hopper.THREADS_PER_SM:
                continue
            regs = hopper.reg_budget(threads, cps)
            fits_regs = WIDE_BASE_REGS + 8 * in_regs * spw <= regs
            if fits_regs and smem_bytes(k, tokens, 1, in_regs, spw) <= hopper.smem_budget(cps):
                return GemvConfig(1, in_regs, cps, slices_per_warp=spw)
    return None
