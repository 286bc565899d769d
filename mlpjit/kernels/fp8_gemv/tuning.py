"""Which shapes fp8_gemv takes, and its tuning knobs per shape: a measured table for the
GLM shapes on the H200 and heuristics for every other shape.

What the sweeps behind the table and the heuristics found is in docs/KERNEL_NOTES.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import replace
from typing import NamedTuple

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
    "LATE_STEPS",
    "PACED",
    "PACE_PERSISTENT",
    "PACE_SLICES_PER_WARP",
    "UNPACED_GATE_UPS",
    "TUNED_H200",
    "choose_config",
    "config_fits",
    "kernel_supports",
    "max_in_regs",
    "spread_config",
    "spread_configs",
    "tuned",
    "with_pace",
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
    send_x: bool = False,
) -> int | None:
    """The most 64-K steps in registers that fit the register and shared-memory budgets
    of this tiling and launch bound, or None if none does."""
    threads = cta_threads(k, tiles, slices_per_warp, slice_k=slice_k, splits=splits)
    in_regs = _register_steps(threads, ctas_per_sm, slices_per_warp, slice_k)
    if in_regs is None:
        return None
    geometry = {"slice_k": slice_k, "splits": splits, "send_x": send_x}
    smem = smem_bytes(k, tokens, tiles, in_regs, slices_per_warp, **geometry)
    if smem > hopper.smem_budget(ctas_per_sm):
        return None
    return in_regs


def _register_steps(threads: int, ctas_per_sm: int, spw: int, slice_k: int) -> int | None:
    """The most 64-K steps in registers the register budget of ``threads`` per CTA at this
    launch bound allows (shared memory aside), or None if none or the threads do not fit."""
    if threads * ctas_per_sm > hopper.THREADS_PER_SM:
        return None
    regs = hopper.reg_budget(threads, ctas_per_sm)
    # At most steps-1: with no cp.async at all, ptxas 13.0 hoists griddepcontrol.wait
    # (ACQBULK) above every weight load, losing the PDL overlap; a committed cp.async group
    # keeps the loads before it (tests/test_fp8_gemv_compile.py checks the order).
    in_regs = min(slice_k // STEP - 1, (regs - BASE_REGS) // (8 * spw))
    return in_regs if in_regs >= 0 else None


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
    send_x: bool = False,
    paced: int = 0,
) -> GemvConfig:
    return GemvConfig(
        tiles, in_regs, ctas_per_sm, early, spw, cluster, slice_k, splits, send_x, paced=paced
    )


# The fastest config per GLM shape on one H200 (132 SMs), from per-kernel sweeps
# (`scripts/tune_fp8_gemv.py kernel`) and layer-level pair sweeps (`... layer`) at 1-8
# tokens; docs/KERNEL_NOTES.md has the variants and numbers. (rows, k, swiglu) ->
# ((up to tokens, config), ...): a token count takes the first entry whose bound covers it;
# shapes not listed, an entry of None, or one that does not fit a token count, use the
# heuristic.
# early=True (PDL trigger at kernel entry, so the down kernel starts streaming while gate_up
# still runs) only where it won >= 0.25 us per layer, and only on gate_up: after down a
# server runs no mlpjit kernel. cluster=2 where clusters of 2 won >= 0.2 us per layer in two
# sweeps; spw = slices per warp, mostly with persistent grids (TP 4, 2, 1). Entries marked
# "(variant 33)": pairs that beat the planner's by more than 3% in every round (two or three)
# of a layer sweep once K splits no longer met at a fenced cluster barrier
# (docs/KERNEL_NOTES.md). send_x ("variant 37": x sent by st.async instead of the fenced
# cluster barrier) on GLM-5's TP-8 and TP-4 gate_up at 6-8 tokens, where it won 1.5-3.2%
# per layer in two device runs; on other clustered kernels it was level or slower. The
# entries of Qwen3-32B TP 8 and of DeepSeek-V3's shared expert at TP 1 are gone: both layers
# now stream (layer_plan.stream_halves), 1-9% faster than their measured pairs at 1, 4, 6
# and 8 tokens and level at 2 (docs/KERNEL_NOTES.md, variant 40). Late weight steps on top
# of these picks and the planner's: LATE_STEPS; a pace on top of them: PACED. Entries marked
# "paced" ("variant 67": staged steps kept in flight N at a time until the PDL wait returns,
# the rest after x) beat the pick before them, paced, by more than 3% in every round of two H100
# layer sweeps back to back, and were no slower with a server's norm between the layers; where
# their pace is PACED's, the rule adds it. An entry also keeps its layer on fp8_gemv at its
# token counts (layer_plan.stream_halves: the table's picks beat the stream), so an entry the
# planner would pick by itself is not redundant.
TUNED_H200: dict[tuple[int, int, bool], tuple[tuple[int, GemvConfig | None], ...]] = {
    # GLM-5 (hidden 6144, intermediate 12288) TP 8
    (3072, 6144, True): (
        (1, _config(1, 3, 2)),  # paced by PACED (variant 67 measured it, H100)
        (4, _config(1, 3, 1)),
        (5, _config(1, 3, 1, cluster=2)),
        (8, _config(1, 3, 1, cluster=2, send_x=True)),  # variant 37
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
        (8, _config(1, 3, 1, cluster=2, send_x=True)),  # variant 37
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
        (1, _config(1, 0, 2, paced=2)),  # paced (H100)
        (2, _config(1, 2, 2)),
        (3, _config(1, 3, 1)),
        (4, _config(1, 1, 2)),  # measured paced by PACED (H100)
        (8, _config(2, 2, 1, early=True)),
    ),
    (5120, 1536, False): (
        (1, _config(2, 2, 2)),
        (4, _config(4, 0, 2, spw=3)),
        (7, _config(2, 2, 2)),
        (8, _config(5, 1, 1, spw=3, slice_k=128, splits=2)),  # variant 33
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
        (4, None),
        (7, _config(2, 3, 2, slice_k=256, splits=7)),
        (8, _config(2, 3, 1, slice_k=256, splits=7)),  # variant 33
    ),
    # Qwen3-8B (hidden 4096) TP 8 gate_up, paced (H100); 2-7 tokens keep the planner's pick.
    (3072, 4096, True): (
        (1, _config(1, 0, 2, paced=2)),
        (7, None),
        (8, _config(3, 3, 1, splits=2, paced=2)),
    ),
    (7168, 256, False): (
        (1, _config(4, 1, 2, slice_k=128)),
        (8, None),
    ),
    # Where the old whole-K cost model's pick beat modeled_us's by more than 3% in the
    # validation of variant 29 (same run, side by side): Qwen3-14B TP 8 down (17 K blocks)
    # 15.91 vs 17.03 us per layer at 1 token, GLM-4.5 TP 1 down 58.00 vs 60.16 at 8.
    (5120, 2176, False): ((8, _config(4, 0, 1, spw=17, slice_k=128)),),
    (5120, 12288, False): (
        (4, None),
        (8, _config(1, 1, 1, spw=3, slice_k=256, splits=2)),
    ),
}
# Late weight steps (GemvConfig.late_steps, "variant 60": the last staged steps of each
# slice requested after x's loads, so x waits behind fewer weight requests) on top of the
# pick, TUNED_H200's or the planner's, for the gate_up kernels and token counts where a
# layer sweep measured that pick with them more than 3% faster in every round: (rows, k)
# -> {tokens: late steps}. "H200": the H200's sweep; the others two H100 sweeps of 3 rounds
# each and a DenseMlp A/B on the H100 (the H200 has not timed them; where both GPUs timed
# late steps they agreed in direction). "norm": more than 3% faster in every round with a
# server's norm between the layers ("variant 65": a layer sweep and a DenseMlp A/B, H100)
# and within 0.5% back to back. On the down projections late steps lost everywhere.
LATE_STEPS: dict[tuple[int, int], dict[int, int]] = {
    (3072, 6144): {8: 4},  # GLM-5 TP 8 (norm)
    (6144, 6144): {8: 4},  # GLM-5 TP 4 (norm)
    (6144, 5120): {1: 3},  # GLM-4.5 TP 4
    (512, 7168): {1: 1, 2: 1, 8: 1},  # DeepSeek-V3 shared expert TP 8 (1 and 8: H200)
    (1024, 7168): {1: 1, 4: 1, 8: 1},  # ... TP 4
    (2048, 7168): {4: 3, 8: 3},  # ... TP 2
    (512, 6144): {4: 1, 8: 1},  # GLM-5 shared expert TP 8
    (2048, 6144): {4: 3, 8: 3},  # ... TP 2
    (768, 5120): {2: 1, 4: 1, 8: 1},  # GLM-4.5 shared expert TP 4
    (1536, 5120): {1: 3, 2: 3, 4: 3, 8: 3},  # ... TP 2
    # Qwen3-8B TP 8; at 1 token the sweeps' 0.92 did not carry through DenseMlp (1.01).
    (3072, 4096): {2: 3, 4: 2},
}
# Every pick, TUNED_H200's or the heuristics', keeps this many staged weight steps in flight
# until its PDL wait returns (GemvConfig.paced) where it can take that and has no late steps:
# x then queues behind fewer weight requests. Down projections ("variant 68"): in the H100
# layer sweeps and through DenseMlp every down that could take it was faster with it, back to
# back and with a server's norm between the layers. Gate_ups ("variant 69"): the planner's
# picks of the off-table grid took 0.87-0.99x the layer time in the layer sweep, and through
# DenseMlp 0.86-0.99x back to back and 0.92-1.02x with a server's norm between the layers,
# except where UNPACED_GATE_UPS keeps the pick as it was.
PACED = 1
# Gate_ups and token counts the pacing rule made more than 2% slower through DenseMlp in one
# of the two measures (H100): (rows, k) -> token counts. GLM-5's shared expert at TP 2, 1
# token: 0.915x back to back, 1.040x with the norm; hidden 4096 x 640 at 1 token: 1.026x and
# 0.962x.
UNPACED_GATE_UPS: dict[tuple[int, int], tuple[int, ...]] = {
    (2048, 6144): (1,),
    (1280, 4096): (1,),
}
# Whether PACED reaches persistent grids, and picks of several slices per warp. The kernel
# takes a pace in both (variant 70: a persistent grid's first tile is paced, the refills of
# later tiles follow as before; a warp paces its steps slice after slice), but no such pick
# has been timed paced through DenseMlp yet: the layer sweep's --paced and --paced-down
# time them.
PACE_PERSISTENT = False
PACE_SLICES_PER_WARP = False
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
    geometry = {"slice_k": p.slice_k, "splits": p.splits, "send_x": p.send_x}
    fit = max_in_regs(k, tokens, p.tiles, p.ctas_per_sm, p.spw, **geometry)
    return fit is not None and p.in_regs <= fit


def tuned(rows: int, k: int, tokens: int, swiglu: bool, sms: int = hopper.SMS) -> GemvConfig | None:
    """TUNED_H200's measured pick for this kernel and token count, where it has one that
    fits; None elsewhere (the heuristics plan it)."""
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
    return list(_one_wave_tilings(rows, k, tokens, sms))


def _one_wave_tilings(
    rows: int, k: int, tokens: int, sms: int
) -> Iterator[tuple[tuple, GemvConfig]]:
    """one_wave_candidates, one at a time (kernel_supports needs only the first)."""
    if k % SLICE:
        return
    slices = k // SLICE
    tiles = 1
    while tiles * slices <= MAX_WARPS:
        if rows % (16 * tiles) == 0:
            ctas = rows // (16 * tiles)
            for cps in range(1, 9):
                in_regs = max_in_regs(k, tokens, tiles, cps)
                if in_regs is None:
                    break  # nor at heavier bounds: fewer registers and less shared memory
                waves = math.ceil(ctas / (sms * cps))
                # Fewest waves; then use as many SMs as possible (bandwidth per SM is
                # limited); then fewer CTAs (each one re-quantizes all of x); then the
                # lightest launch bound.
                score = (waves, -min(ctas, sms), ctas, cps)
                yield score, GemvConfig(tiles, in_regs, cps)
        tiles *= 2


def kernel_supports(rows: int, k: int, tokens: int, sms: int = hopper.SMS) -> bool:
    """True when fp8_gemv can run this shape on a GPU of ``sms`` SMs; otherwise callers use
    the stock path."""
    _check_shape(rows, k, tokens)
    hopper.check_sms(sms)
    return _supports(rows, k, tokens, sms)


@functools.lru_cache(maxsize=4096)
def _supports(rows: int, k: int, tokens: int, sms: int) -> bool:
    """kernel_supports of checked arguments, memoized: planning a layer asks it of each
    launch three times (dense_mlp_requests for both launches, then choose_config)."""
    if tokens > MAX_TOKENS or k % GROUP or rows % 16:
        return False
    if next(_one_wave_tilings(rows, k, tokens, sms), None) is not None:
        return True
    return _spread_search_at(rows, k, tokens, sms) is not None


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


@functools.lru_cache(maxsize=1024)
def _divisors(n: int, limit: int) -> tuple[int, ...]:
    """The divisors of ``n`` up to ``limit``, ascending (memoized: _spread's loops ask the
    same ones many times)."""
    return tuple(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _modeled_cost(
    rows: int, k: int, tokens: int, tiles: int, ctas: int, splits: int, warps: int, sms: int
) -> float:
    """Bytes the busiest SM moves, in the model above (``ctas`` CTAs, one resident wave; a
    persistent grid's CTAs take several row tiles in turn)."""
    return _cost_at(tokens, _cost_terms(rows, k, tiles, ctas, splits, warps, sms))


def _cost_terms(
    rows: int, k: int, tiles: int, ctas: int, splits: int, warps: int, sms: int
) -> tuple[int, int, int, float]:
    """The token-independent terms of _modeled_cost: (CTAs on the busiest SM, the weight
    bytes of the row tiles one takes in turn plus their K splits' cost, its K, the factor
    of its x part for fewer than QUANT_WARPS warps)."""
    kc = k // splits
    rounds = math.ceil(rows // (16 * tiles) * splits / ctas)
    split = SPLIT_COST + SPLIT_STEP * (splits - 2) if splits > 1 else 0
    weight = rounds * (16 * tiles * kc + split)
    return math.ceil(ctas / sms), weight, kc, max(1.0, QUANT_WARPS / warps)


def _cost_at(tokens: int, terms: tuple[int, int, int, float]) -> float:
    """_modeled_cost at ``tokens`` from its _cost_terms. The cost grows with each term, also
    in floating point (each sum and product is rounded the same way, monotonically): with
    a smaller factor it is a lower bound."""
    per_sm, weight, kc, x_factor = terms
    return per_sm * (weight + X_COST * tokens * kc * 2 * x_factor)


def modeled_us(
    rows: int, k: int, tokens: int, config: GemvConfig, sms: int = hopper.SMS
) -> tuple[int, float]:
    """(waves, estimated microseconds) of a config in the model above."""
    p = _launch(rows, k, tokens, config, sms)
    c = config
    return _modeled_us(rows, k, c.tiles, c.splits, c.cluster, c.ctas_per_sm, p.ctas, sms)


def _modeled_us(
    rows: int, k: int, tiles: int, splits: int, cluster: int, cps: int, ctas: int, sms: int
) -> tuple[int, float]:
    """modeled_us of a grid of ``ctas`` CTAs (a config's tiles, splits, cluster and
    ctas_per_sm): it does not depend on the token count."""
    units = rows // (16 * tiles) * splits  # (row tile, K split) pairs
    cluster = max(cluster, splits)
    waves = math.ceil(ctas / hopper.resident_ctas(sms * cps, cluster))
    per_sm = math.ceil(ctas / sms)  # CTAs on the busiest SM
    rounds = per_sm * math.ceil(units / ctas)  # units it takes in turn
    weight_kb = rounds * 16 * tiles * (k // splits) / 1e3
    us = (
        weight_kb / HBM_KB_PER_US
        + PERSISTENT_US * is_persistent(rows, tiles, splits, ctas)
        + ROUND_US * rounds
        + SPLIT_US * (splits - 1)
    )
    return waves, us


@functools.lru_cache(maxsize=4096)
def _spread_pick(rows: int, k: int, tokens: int, sms: int) -> GemvConfig:
    """The _spread decomposition choose_config takes (where _spread finds one): the cost
    model's best (_spread's) for kernels of less than RERANK_MIN_BYTES at
    HEURISTIC_CLUSTER_MIN_TOKENS tokens or more; else of those modeled_us rates fastest
    (fewest waves, then least us; K splits in persistent grids left out) the one that ranks
    first, or _spread's where that leaves none."""
    found = _spread_search_at(rows, k, tokens, sms)
    if found is None:
        raise ValueError(f"_spread has no decomposition of rows={rows}, k={k}, tokens={tokens}")
    search, at = found
    if rows * k < RERANK_MIN_BYTES and tokens >= HEURISTIC_CLUSTER_MIN_TOKENS:
        return search.config(search.best(at)[1], at)
    pick = search.fastest(at)
    return search.config(pick if pick is not None else search.best(at)[1], at)


def _spread(rows: int, k: int, tokens: int, sms: int) -> tuple[float, GemvConfig] | None:
    """(modeled cost, config) of the best decomposition over tiles per CTA, K splits (1-8
    CTAs of a cluster), slice size, slices per warp and launch bound that fits the register,
    shared-memory and residency budgets: one CTA per (tile, split) in one resident wave, or
    a persistent grid of one wave (several waves only where neither fits); None if nothing
    fits."""
    found = _spread_search_at(rows, k, tokens, sms)
    if found is None:
        return None
    search, at = found
    rank, best = search.best(at)
    return rank[1], search.config(best, at)


@functools.lru_cache(maxsize=4096)
def _spread_ranked(
    rows: int, k: int, tokens: int, sms: int
) -> tuple[tuple[tuple, GemvConfig], ...]:
    """Every _spread decomposition that fits, as (rank, config), best first (see
    _SpreadSearch.ranked): those of one wave, or where there are none (more weights than
    one wave's shared memory and registers hold, and no persistent form fits: Qwen3-14B's
    TP-1 down projection), those of several waves of one CTA per (tile, split), fewest
    waves first. The planner reads only the first ones (_spread, _spread_pick); this whole
    list is for tuning sweeps (spread_configs) and tests."""
    found = _spread_search_at(rows, k, tokens, sms)
    if found is None:
        return ()
    search, at = found
    return search.ranked(at)


# The token counts _spread_search covers in one pass (ascending: see _Decomposition.fitting).
_TABLE_COUNTS = tuple(range(1, MAX_TOKENS + 1))


def _spread_search_at(rows: int, k: int, tokens: int, sms: int) -> tuple[_SpreadSearch, int] | None:
    """The search _spread reads for ``tokens`` and where ``tokens`` is in its counts: the
    one-wave search, or where nothing of it fits, the one of several waves; None if neither
    has a decomposition that fits. A layer plans 1-8 tokens, and all but shared memory and
    the cost model is the same for each of them: one search covers them all."""
    counts = _TABLE_COUNTS if tokens in _TABLE_COUNTS else (tokens,)
    at = counts.index(tokens)
    for waves_ok in (False, True):
        search = _spread_search(rows, k, sms, counts, waves_ok)
        if search.fits(at):
            return search, at
    return None


class _Decomposition(NamedTuple):
    """One _spread decomposition of a shape, all of it that does not depend on the token
    count: the grid, the register step counts to try and the token-independent parts of
    both cost models. Its config at a token count is ``tiles``, ``spw``, ``cps``,
    ``slice_k``, ``splits`` and the first of ``tried`` whose shared memory fits there."""

    # Its place in the search order: the loops over splits, slice sizes (SLICE_SIZES' order),
    # tiles, spw and cps, each ascending. Equal ranks keep it.
    order: tuple[int, int, int, int, int]
    splits: int
    slice_k: int
    tiles: int
    spw: int
    cps: int
    warps: int
    ctas: int
    waves: int  # waves of resident CTAs (of whole clusters of the splits)
    persistent: bool
    tried: tuple[int, ...]  # register step counts that fit all but shared memory, in order
    # How many of the search's counts (ascending) the decomposition fits: shared memory
    # grows with the token count and shrinks with the register steps, so it fits a count
    # when the most steps of ``tried`` fit it, and those are the first counts.
    fitting: int
    cost_terms: tuple[int, int, int, float]  # _cost_terms
    modeled: tuple[int, float]  # _modeled_us: (waves, us)


class _Grid(NamedTuple):
    """A grid some decompositions of a _Block can launch, and the parts of both cost models
    it sets: the least waves it can take, its CTAs, _cost_terms' CTAs per SM, weight part and
    K per CTA, and modeled_us's us (which depends on nothing else)."""

    least_waves: int
    ctas: int
    per_sm: int
    weight: int
    kc: int
    us: float


class _Block(NamedTuple):
    """The decompositions of one (K splits, slice size, tiles per CTA) of a shape, before
    they are found: the grids they can launch (one CTA per (tile, split), or a persistent
    grid), which bound their ranks from below."""

    splits: int
    slice_k: int
    tiles: int
    grids: tuple[_Grid, ...]


class _SpreadSearch:
    """Every decomposition _spread considers for one shape on ``sms`` SMs, for a tuple of
    token counts (ascending): one CTA per (tile, split) in one resident wave (or, with
    ``waves_ok``, at most SPREAD_MAX_WAVES of them), or a persistent grid of one wave.

    Each decomposition (splits, slice size, tiles, slices per warp, launch bound) takes the
    fewest register steps that fit (at most HEURISTIC_MAX_IN_REGS where shared memory
    allows). Whether a step count fits the registers, the cp.async groups and the grid rules
    does not depend on the token count; shared memory does, so each decomposition is found
    once (_block_decompositions) and only its shared memory and cost are asked per count.

    Ranks (``rank``): fewest waves, the cost model, then fewer splits, longer slices, fewer
    warps, lighter launch bound (the grid last: what _spread_pick's model reads); equal
    ranks keep the search order. ``ranked`` sorts every decomposition; the planner needs
    only the first (``best``) and the first of those modeled_us rates fastest
    (``fastest``). Those visit the (splits, slice size, tiles) blocks by a lower bound of
    what they compare and stop at the first block whose bound is past the best found, so
    most blocks' decompositions are never found (at start-up this search is most of
    planning).
    """

    def __init__(self, rows: int, k: int, sms: int, counts: tuple[int, ...], waves_ok: bool):
        self.rows, self.k, self.sms, self.counts = rows, k, sms, counts
        self._max_waves = SPREAD_MAX_WAVES if waves_ok else 1
        self._blocks = _blocks(rows, k, sms, self._max_waves)
        self._found: list[tuple[_Decomposition, ...] | None] = [None] * len(self._blocks)
        self._best: dict[int, tuple[tuple, _Decomposition] | None] = {}

    def decompositions(self, i: int) -> tuple[_Decomposition, ...]:
        """The decompositions of block ``i`` (of _blocks) that fit at least the first count,
        found once."""
        found = self._found[i]
        if found is None:
            rows, k, sms, counts, waves = self.rows, self.k, self.sms, self.counts, self._max_waves
            block = self._blocks[i]
            found = self._found[i] = tuple(
                _block_decompositions(rows, k, sms, counts, waves, block)
            )
        return found

    def fits(self, at: int) -> bool:
        """Whether some decomposition fits the token count ``counts[at]`` (the blocks are
        tried in the order ``fastest`` visits them, up to the first that has one)."""
        return any(
            d.fitting > at for _, i in self._by_modeled_bound for d in self.decompositions(i)
        )

    def rank(self, d: _Decomposition, at: int) -> tuple:
        """The rank of ``d`` at ``counts[at]``, lower better."""
        cost = _cost_at(self.counts[at], d.cost_terms)
        return (d.waves, cost, d.splits, -d.slice_k, d.warps, d.cps, d.ctas)

    def config(self, d: _Decomposition, at: int) -> GemvConfig:
        """The config of ``d`` at ``counts[at]`` (which it fits): the first register step
        count tried whose shared memory fits."""
        tokens, budget = self.counts[at], hopper.smem_budget(d.cps)
        geometry = {"slice_k": d.slice_k, "splits": d.splits}
        in_regs = next(
            in_regs
            for in_regs in d.tried
            if smem_bytes(self.k, tokens, d.tiles, in_regs, d.spw, **geometry) <= budget
        )
        return GemvConfig(d.tiles, in_regs, d.cps, slices_per_warp=d.spw, **geometry)

    def ranked(self, at: int) -> tuple[tuple[tuple, GemvConfig], ...]:
        """(rank, config) of every decomposition that fits ``counts[at]``, best first."""
        every = sorted(
            (d for i in range(len(self._blocks)) for d in self.decompositions(i)),
            key=lambda d: d.order,
        )
        found = [(self.rank(d, at), d) for d in every if d.fitting > at]
        found.sort(key=lambda item: item[0])  # stable: equal ranks keep the search order
        return tuple((rank, self.config(d, at)) for rank, d in found)

    def best(self, at: int) -> tuple[tuple, _Decomposition] | None:
        """(rank, decomposition) of ranked(at)'s first; None if nothing fits there.

        A decomposition ranks no better than (least waves, cost at its block's most warps)
        of its grid (_cost_at), its splits and slice size: the blocks are visited by that
        bound, and none from the first one past the best rank's first four on can rank
        before it.
        """
        if at in self._best:
            return self._best[at]
        x_tokens = X_COST * self.counts[at]  # _cost_at's first product
        bounds = sorted(
            [
                (waves, per_sm * (weight + x_tokens * kc * 2 * x_factor), splits, neg_slice, i)
                for waves, per_sm, weight, kc, x_factor, splits, neg_slice, i in self._cost_bounds
            ]
        )
        best: tuple[tuple, tuple, _Decomposition] | None = None
        seen = set()
        for bound in bounds:
            if best is not None and bound[:4] > best[0][:4]:
                break
            i = bound[4]
            if i in seen:
                continue  # visited by the bound of another of its grids
            seen.add(i)
            for d in self.decompositions(i):
                if d.fitting > at:
                    rank = self.rank(d, at)
                    if best is None or (rank, d.order) < best[:2]:
                        best = (rank, d.order, d)
        self._best[at] = found = None if best is None else (best[0], best[2])
        return found

    def fastest(self, at: int) -> _Decomposition | None:
        """Of the decompositions that fit ``counts[at]``, K splits in persistent grids left
        out, the one of fewest waves and least us by modeled_us that ranks first (the first
        of those in ranked(at)); None if none fits. Its us depends only on the grid, so the
        blocks are visited by the least (waves, us) of their grids."""
        fastest: tuple[tuple, tuple, tuple, _Decomposition] | None = None
        for bound, i in self._by_modeled_bound:
            if fastest is not None and bound > fastest[0]:
                break
            for d in self.decompositions(i):
                if d.fitting <= at or (d.splits > 1 and d.persistent):
                    continue  # it does not fit, or K splits in a persistent grid
                if fastest is None or d.modeled <= fastest[0]:
                    key = (d.modeled, self.rank(d, at), d.order)
                    if fastest is None or key < fastest[:3]:
                        fastest = (*key, d)
        return fastest[3] if fastest is not None else None

    @functools.cached_property
    def _cost_bounds(self) -> list[tuple[int, int, int, int, float, int, int, int]]:
        """For each grid of each block (``i``: its index in _blocks): its least waves, its
        _cost_terms at the block's most warps (one slice per warp, at most MAX_WARPS), the
        block's splits and -slice_k, and ``i``."""
        found = []
        for i, b in enumerate(self._blocks):
            warps = min(MAX_WARPS, b.tiles * (self.k // b.splits // b.slice_k))
            x_factor = max(1.0, QUANT_WARPS / warps)
            for g in b.grids:
                found.append(
                    (g.least_waves, g.per_sm, g.weight, g.kc, x_factor, b.splits, -b.slice_k, i)
                )
        return found

    @functools.cached_property
    def _by_modeled_bound(self) -> list[tuple[tuple[int, float], int]]:
        """(bound, i) of each block ``i`` of _blocks by the least (waves, us) of modeled_us
        over its grids, ascending."""
        return sorted(
            (min((g.least_waves, g.us) for g in b.grids), i) for i, b in enumerate(self._blocks)
        )


def _blocks(rows: int, k: int, sms: int, max_waves: int) -> tuple[_Block, ...]:
    """The (K splits, slice size, tiles) blocks of _SpreadSearch's decompositions, with the
    grids their decompositions can launch (a superset): one CTA per (tile, split) where at
    most ``max_waves`` waves of it can be resident (at the most CTAs per SM), and with one
    tile per CTA the persistent grids of each launch bound (see grid_ctas)."""
    found = []
    most_cps = SPREAD_MAX_CTAS_PER_SM
    for splits in _divisors(k // GROUP, SPLITS_MAX):
        most_slots = hopper.resident_ctas(sms * most_cps, splits)
        if most_slots == 0:
            continue  # not even one cluster of the splits is resident
        for tiles in _divisors(rows // 16, MAX_WARPS):
            units = rows // (16 * tiles) * splits
            grids = []  # (least waves, CTAs)
            if math.ceil(units / most_slots) <= max_waves:
                grids.append((math.ceil(units / most_slots), units))
            if tiles == 1:
                for cps in range(1, most_cps + 1):
                    slots = hopper.resident_ctas(sms * cps, splits)
                    if slots >= splits and slots // splits * splits < units:
                        grids.append((1, slots // splits * splits))
            if not grids:
                continue
            launched = tuple(
                _Grid(
                    waves,
                    ctas,
                    *_cost_terms(rows, k, tiles, ctas, splits, QUANT_WARPS, sms)[:3],
                    _modeled_us(rows, k, tiles, splits, 1, most_cps, ctas, sms)[1],
                )
                for waves, ctas in grids
            )
            for slice_k in SLICE_SIZES:
                if k // splits % slice_k == 0:
                    found.append(_Block(splits, slice_k, tiles, launched))
    return tuple(found)


@functools.lru_cache(maxsize=256)
def _spread_search(
    rows: int, k: int, sms: int, counts: tuple[int, ...], waves_ok: bool
) -> _SpreadSearch:
    """_SpreadSearch of a shape, memoized: the planner asks it for each token count."""
    return _SpreadSearch(rows, k, sms, counts, waves_ok)


def _block_decompositions(
    rows: int, k: int, sms: int, counts: tuple[int, ...], max_waves: int, block: _Block
) -> Iterator[_Decomposition]:
    """The decompositions of ``block`` that fit at least the first of ``counts``, over slices
    per warp and launch bounds (CTAs per SM), in search order. A launch bound where no
    register step count fits (_registers) ends its loop: heavier ones give fewer registers.
    With several tiles per CTA (no persistent grid) the loop starts at the first bound
    whose slots hold the grid in ``max_waves`` waves."""
    splits, slice_k, tiles = block.splits, block.slice_k, block.tiles
    units = rows // (16 * tiles) * splits  # (row tile, K split) pairs
    slices = k // splits // slice_k
    geometry = {"slice_k": slice_k, "splits": splits}
    grids: dict[tuple[int, int], tuple] = {}  # (cps, ctas) -> (cost terms less x's, modeled_us)
    # Resident CTAs (whole clusters of the splits) at each launch bound.
    slots_at = [hopper.resident_ctas(sms * c, splits) for c in range(SPREAD_MAX_CTAS_PER_SM + 1)]
    first_cps = 1
    if tiles > 1:
        first_cps = min(cps for cps, slots in enumerate(slots_at) if slots * max_waves >= units)
    for spw in _divisors(slices, slices):
        warps = tiles * slices // spw
        if warps > MAX_WARPS:
            continue
        for cps in range(first_cps, SPREAD_MAX_CTAS_PER_SM + 1):
            registers = _registers(warps, cps, spw, slice_k, splits > 1)
            if registers is None:
                break  # no step count fits here, nor at heavier launch bounds
            regs, fit = registers
            slots = slots_at[cps]
            if slots == 0:
                continue  # not even one cluster of the splits is resident
            # The grid depends on the register steps only when all of them are in registers
            # (grid_ctas), which fit (< steps) rules out: one grid for every step count tried.
            ctas = grid_ctas(rows, k, tiles, fit, cps, spw, sms, **geometry)
            persistent = ctas < units
            if persistent and tiles > 1:
                continue  # persistent grids were only measured with one tile per CTA
            waves = math.ceil(ctas / slots)
            if not persistent and waves > max_waves:
                continue
            tried = _steps_tried(spw, slice_k, splits > 1, persistent, fit, regs)
            if not tried:
                continue
            budget = hopper.smem_budget(cps)
            fitting = _counts_fitting(k, counts, tiles, max(tried), spw, geometry, budget)
            if not fitting:
                continue
            grid = grids.get((cps, ctas))
            if grid is None:
                grid = grids[cps, ctas] = (
                    _cost_terms(rows, k, tiles, ctas, splits, warps, sms)[:3],
                    _modeled_us(rows, k, tiles, splits, 1, cps, ctas, sms),
                )
            terms = (*grid[0], max(1.0, QUANT_WARPS / warps))
            yield _Decomposition(
                (splits, SLICE_SIZES.index(slice_k), tiles, spw, cps),
                splits, slice_k, tiles, spw, cps, warps, ctas, waves, persistent, tried,
                fitting, terms, grid[1],
            )  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _registers(warps: int, cps: int, spw: int, slice_k: int, split: bool) -> tuple[int, int] | None:
    """(registers per thread, the most register steps they allow: _register_steps) of a
    _spread CTA of ``warps`` warps of ``spw`` slices at ``cps`` CTAs per SM; None if no step
    count fits it with one CTA per tile (_steps_tried is empty): not even the fewest the
    cp.async groups allow, which need the fewest registers (_spread_regs grows with the
    steps). Then none fits a persistent grid (which needs more registers) nor a heavier
    launch bound either (the registers and the steps they allow only shrink with it)."""
    threads = 32 * warps
    fit = _register_steps(threads, cps, spw, slice_k)
    if fit is None:
        return None
    regs = hopper.reg_budget(threads, cps)
    fewest = max(0, slice_k // STEP - MAX_PENDING_GROUPS // spw)
    if fewest > fit or _spread_regs(spw, fewest, slice_k, split, False) > regs:
        return None
    return regs, fit


@functools.lru_cache(maxsize=4096)
def _steps_tried(
    spw: int, slice_k: int, split: bool, persistent: bool, fit: int, regs: int
) -> tuple[int, ...]:
    """The register step counts a _spread decomposition tries, in order: at most ``fit``
    (what the registers allow), the cp.async groups within MAX_PENDING_GROUPS and the
    kernel's registers (_spread_regs) within ``regs``; HEURISTIC_MAX_IN_REGS down to 0
    first, then more."""
    steps = slice_k // STEP
    cap = min(fit, HEURISTIC_MAX_IN_REGS)
    return tuple(
        in_regs
        for in_regs in (*range(cap, -1, -1), *range(cap + 1, fit + 1))
        if spw * (steps - in_regs) <= MAX_PENDING_GROUPS
        and _spread_regs(spw, in_regs, slice_k, split, persistent) <= regs
    )


def _counts_fitting(
    k: int, counts: tuple[int, ...], tiles: int, in_regs: int, spw: int, geometry: dict,
    budget: int,
) -> int:  # fmt: skip
    """How many of ``counts`` (ascending) this decomposition's shared memory fits in
    ``budget``: it grows with the token count, so they are the first ones."""
    if smem_bytes(k, counts[-1], tiles, in_regs, spw, **geometry) <= budget:
        return len(counts)
    for n, tokens in enumerate(counts):
        if smem_bytes(k, tokens, tiles, in_regs, spw, **geometry) > budget:
            return n
    return len(counts)


def _spread_regs(spw: int, in_regs: int, slice_k: int, split: bool, persistent: bool) -> int:
    """Registers a thread of a _spread config needs (ptxas 13.0, no spills): a base, and
    per slice of the warp its register steps (8 each), weight scales (2 rows x
    slice_k/128) and addresses; the persistent form holds the next tile's addresses and
    refill state too, and K splits (``split``: the tile is split along K) their
    reduction's."""
    per_slice = 8 * in_regs + 2 * (slice_k // GROUP)
    if not persistent:
        extra = SPREAD_SPLIT_REGS if split else 0
        return SPREAD_BASE_REGS + extra + spw * (per_slice + 4)
    extra = SPREAD_PERSISTENT_SPLIT_REGS if split else 0
    return SPREAD_PERSISTENT_BASE_REGS + extra + spw * (per_slice + 11)


def choose_config(
    rows: int, k: int, tokens: int, swiglu: bool, sms: int = hopper.SMS
) -> GemvConfig:
    """Default config for a shape: the H200-measured best where TUNED_H200 has one (GLM,
    DeepSeek-V3 TP 8 and its TP-8 shared expert, Qwen3-14B TP 8's down); elsewhere the whole-K
    heuristics (for k a multiple of 512: a persistent grid with several slices per warp for
    many rows and large k, _wide_persistent, else about one wave of resident CTAs over all
    SMs; at most HEURISTIC_MAX_IN_REGS steps in registers, in clusters of 2 from
    HEURISTIC_CLUSTER_MIN_TOKENS tokens on), unless they leave SMs unevenly loaded and
    _spread's search over tiles, K splits and slice sizes models faster, or they do not
    apply (k not a multiple of 512); a _spread pick is then the fastest by modeled_us (see
    RERANK_MIN_BYTES). No register spills either way.

    ``swiglu`` takes the same tiling (a CTA's 16-row tile is 8 gate + 8 up rows). ``sms``:
    the target GPU's SM count; TUNED_H200 and LATE_STEPS only apply at hopper.SMS (132).
    Picks without late steps are paced by PACED where they take it (but for
    UNPACED_GATE_UPS, persistent grids unless PACE_PERSISTENT, several slices per warp unless
    PACE_SLICES_PER_WARP).
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
    pick = _planned(rows, k, tokens, swiglu, sms)
    late = LATE_STEPS.get((rows, k), {}).get(tokens, 0) if swiglu and sms == hopper.SMS else 0
    if late:
        with_late = replace(pick, late_steps=late)
        if config_fits(rows, k, tokens, with_late, sms):
            return with_late
    return with_pace(rows, k, tokens, swiglu, pick, sms)


def with_pace(
    rows: int, k: int, tokens: int, swiglu: bool, pick: GemvConfig, sms: int = hopper.SMS
) -> GemvConfig:
    """``pick`` with PACED's pace where the planner's rule gives it one: no pace or late
    steps of its own, not one of UNPACED_GATE_UPS, a form the rule reaches (PACE_PERSISTENT,
    PACE_SLICES_PER_WARP) and it fits; else ``pick`` as it is."""
    if not PACED or pick.paced or pick.late_steps:
        return pick
    if swiglu and tokens in UNPACED_GATE_UPS.get((rows, k), ()):
        return pick
    launch = _launch(rows, k, tokens, pick, sms)
    if (launch.persistent and not PACE_PERSISTENT) or (launch.spw > 1 and not PACE_SLICES_PER_WARP):
        return pick
    paced = replace(pick, paced=PACED)
    return paced if config_fits(rows, k, tokens, paced, sms) else pick


def _planned(rows: int, k: int, tokens: int, swiglu: bool, sms: int) -> GemvConfig:
    """choose_config's pick before LATE_STEPS: TUNED_H200's or the heuristics'."""
    measured = tuned(rows, k, tokens, swiglu, sms)
    if measured is not None:
        return measured
    pick = _whole_k_pick(rows, k, tokens, sms)
    if pick is None:
        if _spread_search_at(rows, k, tokens, sms) is None:
            raise ValueError(
                f"fp8_gemv has no decomposition of rows={rows}, k={k}, tokens={tokens} that "
                f"fits a {sms}-SM GPU"
            )
        return _spread_pick(rows, k, tokens, sms)
    launch = _launch(rows, k, tokens, pick, sms)
    if _balance(launch) < SPREAD_BELOW_BALANCE:  # uneven: _spread's best may model faster
        spread = _spread(rows, k, tokens, sms)
        if spread is not None and spread[0] < SPREAD_GAIN * _launch_cost(launch):
            return _spread_pick(rows, k, tokens, sms)
    if tokens >= HEURISTIC_CLUSTER_MIN_TOKENS:
        clustered = replace(pick, cluster=2)
        if config_fits(rows, k, tokens, clustered, sms):
            return clustered
    return pick


def planned_waves(rows: int, k: int, tokens: int, swiglu: bool, sms: int = hopper.SMS) -> int:
    """Waves of resident CTAs choose_config's pick runs in: 1 for one wave or a persistent
    grid; more only where no one-wave decomposition fits (see SPREAD_MAX_WAVES)."""
    return modeled_us(rows, k, tokens, choose_config(rows, k, tokens, swiglu, sms), sms)[0]


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
