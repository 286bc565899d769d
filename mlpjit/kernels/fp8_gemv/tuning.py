"""Which shapes fp8_gemv takes, and its tuning knobs per shape: a measured table for the
GLM shapes on the H200 and heuristics for every other shape.

What the sweeps behind the table and the heuristics found is in docs/KERNEL_NOTES.md.
"""

from __future__ import annotations

import math
from dataclasses import replace

from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv.params import (
    CLUSTER_SIZES,
    MAX_PENDING_GROUPS,
    MAX_TOKENS,
    MAX_WARPS,
    SLICE,
    STEPS,
    GemvConfig,
    grid_ctas,
    smem_bytes,
)

__all__ = [
    "TUNED_H200",
    "choose_config",
    "config_fits",
    "kernel_supports",
    "max_in_regs",
]

# Registers the kernel needs besides the in-register weights (8 per in_regs step), measured
# with ptxas 13.0 under launch bounds: in_regs=3 fits the 80-register bound (768 threads per
# SM) without spilling for every GLM-5 shape and token count.
BASE_REGS = 56
# Grids meant as one wave must be resident at once. Clusters of 2 always are (H200: 66 of
# 2 at one CTA per SM); of 4 or 8 only 10/11 of the slots fill (30 clusters of 4 = 120
# CTAs at one CTA per SM, 30 of 8 = 240 at two; cuOccupancyMaxActiveClusters), so a larger
# grid would run its last clusters as a second wave.
MAX_PERSISTENT_CLUSTER = 2
LARGE_CLUSTER_RESIDENCY = 120 / 132


def max_in_regs(
    k: int, tokens: int, tiles: int, ctas_per_sm: int, slices_per_warp: int = 1
) -> int | None:
    """The most 64-K steps in registers that fit the register and shared-memory budgets
    of this tiling and launch bound, or None if none does."""
    threads = 32 * tiles * (k // SLICE) // slices_per_warp
    if threads * ctas_per_sm > hopper.THREADS_PER_SM:
        return None
    regs = hopper.reg_budget(threads, ctas_per_sm)
    # At most STEPS-1: with no cp.async at all, ptxas 13.0 hoists griddepcontrol.wait
    # (ACQBULK) above every weight load, losing the PDL overlap; a committed cp.async group
    # keeps the loads before it (tests/test_fp8_gemv_compile.py checks the order).
    in_regs = min(STEPS - 1, (regs - BASE_REGS) // (8 * slices_per_warp))
    if in_regs < 0 or smem_bytes(k, tokens, tiles, in_regs, slices_per_warp) > hopper.smem_budget(
        ctas_per_sm
    ):
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
) -> GemvConfig:
    return GemvConfig(tiles, in_regs, ctas_per_sm, early, spw, cluster)


# The fastest config per GLM shape on one H200 (132 SMs), from per-kernel sweeps
# (`scripts/tune_fp8_gemv.py kernel`) and layer-level pair sweeps (`... layer`) at 1-8
# tokens; docs/KERNEL_NOTES.md has the variants and numbers. (rows, k, swiglu) ->
# ((up to tokens, config), ...): a token count takes the first entry whose bound covers it;
# shapes not listed, or an entry that does not fit a token count, use the heuristic.
# early=True (PDL trigger at kernel entry, so the down kernel starts streaming while gate_up
# still runs) only where it won >= 0.25 us per layer, and only on gate_up: after down a
# server runs no mlpjit kernel. cluster=2 where clusters of 2 won >= 0.2 us per layer in two
# sweeps; spw = slices per warp, mostly with persistent grids (TP 4, 2, 1).
TUNED_H200: dict[tuple[int, int, bool], tuple[tuple[int, GemvConfig], ...]] = {
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
}
# Heuristic picks keep at most this many steps in registers: 2-3 beat more in the sweeps
# (more registers cost occupancy, and ptxas may sink register loads below the PDL wait).
HEURISTIC_MAX_IN_REGS = 3
# From this many tokens on, heuristic picks run in clusters of 2 (where the grid allows):
# at 8 tokens that won 0.4-2.3 us per layer on every untuned GLM-4.5 shape (TP4/TP2/TP1),
# at 4 tokens it won at TP1 only and lost up to 0.4 us elsewhere.
HEURISTIC_CLUSTER_MIN_TOKENS = 5


def config_fits(rows: int, k: int, tokens: int, config: GemvConfig, sms: int = hopper.SMS) -> bool:
    """Whether ``config`` compiles for this shape AND runs as planned: registers within the
    launch bound (no spills), shared memory within the budget, and a cluster grid meant as
    one wave resident at once."""
    spw = config.slices_per_warp
    if spw < 1 or (k // SLICE) % spw or spw * (STEPS - config.in_regs) > MAX_PENDING_GROUPS:
        return False
    if type(config.cluster) is not int or config.cluster not in CLUSTER_SIZES:
        return False
    if rows % (16 * config.tiles):
        return False
    grid = grid_ctas(rows, k, config.tiles, config.in_regs, config.ctas_per_sm, spw, sms)
    if grid % config.cluster:
        return False
    slots = sms * config.ctas_per_sm
    if config.cluster > MAX_PERSISTENT_CLUSTER and slots >= grid > LARGE_CLUSTER_RESIDENCY * slots:
        return False  # meant as one wave, but not resident at once
    fit = max_in_regs(k, tokens, config.tiles, config.ctas_per_sm, spw)
    return (
        fit is not None
        and 0 <= config.in_regs <= fit
        and smem_bytes(k, tokens, config.tiles, config.in_regs, spw)
        <= hopper.smem_budget(config.ctas_per_sm)
    )


def _tuned(rows: int, k: int, tokens: int, swiglu: bool, sms: int) -> GemvConfig | None:
    if sms != hopper.SMS:
        return None  # measured on 132 SMs: grids and pairings need not carry over
    for bound, config in TUNED_H200.get((rows, k, swiglu), ()):
        if tokens <= bound:
            return config if config_fits(rows, k, tokens, config) else None
    return None


def _check_shape(rows: int, k: int, tokens: int) -> None:
    for name, value in (("rows", rows), ("k", k), ("tokens", tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def one_wave_candidates(
    rows: int, k: int, tokens: int, sms: int = hopper.SMS
) -> list[tuple[tuple, GemvConfig]]:
    """(score, config) of every one-CTA-per-tile tiling that fits, lower score better."""
    slices = k // SLICE
    found = []
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


def kernel_supports(rows: int, k: int, tokens: int) -> bool:
    """True when fp8_gemv can run this shape; otherwise callers use the stock path."""
    _check_shape(rows, k, tokens)
    if tokens > MAX_TOKENS or k % SLICE or rows % 16:
        return False
    return bool(one_wave_candidates(rows, k, tokens))


def choose_config(
    rows: int, k: int, tokens: int, swiglu: bool, sms: int = hopper.SMS
) -> GemvConfig:
    """Default config for a shape: the H200-measured best for the GLM shapes (TUNED_H200);
    elsewhere a persistent grid with several slices per warp for many rows and large k
    (_wide_persistent), else about one wave of resident CTAs over all SMs, at most
    HEURISTIC_MAX_IN_REGS steps in registers, no register spills; in clusters of 2 from
    HEURISTIC_CLUSTER_MIN_TOKENS tokens on.

    ``swiglu`` takes the same tiling (a CTA's 16-row tile is 8 gate + 8 up rows). ``sms``:
    the target GPU's SM count; TUNED_H200 only applies at hopper.SMS (132).
    ValueError if the kernel cannot take the shape (see kernel_supports).
    """
    hopper.check_sms(sms)
    if not isinstance(swiglu, bool):
        raise ValueError(f"swiglu must be a bool, got {swiglu!r}")
    if swiglu and rows % 2:
        raise ValueError(f"rows must be even with swiglu, got {rows}")
    if not kernel_supports(rows, k, tokens):
        raise ValueError(
            f"fp8_gemv cannot take rows={rows}, k={k}, tokens={tokens}: needs k % {SLICE} == 0, "
            f"rows % 16 == 0, 1 <= tokens <= {MAX_TOKENS} and k <= {SLICE * MAX_WARPS} "
            "within the shared-memory and register limits"
        )
    tuned = _tuned(rows, k, tokens, swiglu, sms)
    if tuned is not None:
        return tuned
    pick = _wide_persistent(rows, k, tokens, sms)
    if pick is None:
        best = min(one_wave_candidates(rows, k, tokens, sms), key=lambda c: c[0])[1]
        pick = GemvConfig(best.tiles, min(best.in_regs, HEURISTIC_MAX_IN_REGS), best.ctas_per_sm)
    if tokens >= HEURISTIC_CLUSTER_MIN_TOKENS:
        clustered = replace(pick, cluster=2)
        if config_fits(rows, k, tokens, clustered, sms):
            return clustered
    return pick


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
            threads = 32 * slices // spw
            if threads * cps > hopper.THREADS_PER_SM:
                continue
            regs = hopper.reg_budget(threads, cps)
            fits_regs = WIDE_BASE_REGS + 8 * in_regs * spw <= regs
            if fits_regs and smem_bytes(k, tokens, 1, in_regs, spw) <= hopper.smem_budget(cps):
                return GemvConfig(1, in_regs, cps, slices_per_warp=spw)
    return None
