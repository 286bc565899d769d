"""Kernel planning: which shapes the fp8_gemv kernel takes, and its tuning knobs per shape.

No cutlass import: DenseMlp and the CLI plan (and key) kernels without CuTe DSL. The limits
below mirror the kernel's own validation in kernels/fp8_gemv.py (DESIGN.md section 2) and
the sm_90 (H100/H200) resources; see docs/KERNEL_NOTES.md for the reasoning per shape.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlpjit.jit.manager import KernelRequest

__all__ = [
    "MODELS",
    "GemvConfig",
    "kernel_supports",
    "choose_config",
    "gemv_request",
    "grid_ctas",
    "dense_mlp_requests",
    "smem_budget",
    "smem_bytes",
    "check_sms",
]

MODELS = {"glm5": (6144, 12288), "glm4.5": (5120, 12288)}  # (hidden, intermediate)

SLICE = 512  # K per warp
STEPS = 8  # 64-K steps per slice
GROUP = 128
MAX_TOKENS = 8
MAX_WARPS = 32  # 1024 threads per CTA
# cp.async groups one thread may have in flight: ptxas 13.0 encodes the wait count in 6 bits
# (DEPBAR.LE SB0, 0x3f), so slices_per_warp * (STEPS - in_regs) must stay within it.
MAX_PENDING_GROUPS = 63
# CTAs per thread block cluster that share one quantization of x (1: none). At most 8, the
# portable cluster size.
CLUSTER_SIZES = (1, 2, 4, 8)
# Grids meant as one wave must be resident at once. Clusters of 2 always are (H200: 66 of
# 2 at one CTA per SM); of 4 or 8 only 10/11 of the slots fill (30 clusters of 4 = 120
# CTAs at one CTA per SM, 30 of 8 = 240 at two; cuOccupancyMaxActiveClusters), so a larger
# grid would run its last clusters as a second wave.
MAX_PERSISTENT_CLUSTER = 2
LARGE_CLUSTER_RESIDENCY = 120 / 132
# fp8_gemv's kernel parameters, in order (all device pointers): output, input, weight, scales.
GEMV_PARAM_NAMES = ("out", "x", "w", "w_scale")

# sm_90 resources (H100 / H200). SMS is the SM count the tuned table and the defaults are
# for (H200, H100 SXM); other Hopper parts (H100 PCIe and H800 PCIe: 114, H20: 78) pass their
# own count as ``sms``, which sizes the persistent grids (a grid planned for 132 SMs would
# run its last CTAs as a second wave on fewer).
SMS = 132
MAX_SMS = 1024
SMEM_PER_SM = 228 * 1024
SMEM_PER_CTA_MAX = 227 * 1024  # dynamic + static
SMEM_CTA_OVERHEAD = 2 * 1024  # 1 KB reserved by the system + 1 KB static (1024-aligned base)
REGS_PER_SM = 65536
SCHEDULERS = 4  # warp schedulers per SM, each with a quarter of the register file
THREADS_PER_SM = 2048
# Registers the kernel needs besides the in-register weights (8 per in_regs step), measured
# with ptxas 13.0 under launch bounds: in_regs=3 fits the 80-register bound (768 threads per
# SM) without spilling for every GLM-5 shape and token count.
BASE_REGS = 56
# Registers a thread needs for the persistent (row-tile loop) form of the kernel: at 80 it
# spilled, at 168 (384 threads per SM) no GLM-5 config did (ptxas 13.0, 2026-11-30); at
# exactly 128 (512 threads, e.g. k 8192 with 3 register steps) it spilled 16-48 B.
PERSISTENT_MIN_REGS = 136


@dataclass(frozen=True)
class GemvConfig:
    """Tuning knobs of one fp8_gemv specialization (see DESIGN.md section 2)."""

    tiles: int  # 16-row tiles per CTA
    in_regs: int  # 64-K steps loaded into registers (the rest go through shared memory)
    ctas_per_sm: int  # launch bound: CTAs meant to be resident per SM
    early_launch: bool = False  # PDL trigger at kernel entry instead of after the wait
    # 512-K slices per warp: more means fewer threads (and registers) per row tile, so a
    # persistent grid fits where one warp per slice would spill (large k).
    slices_per_warp: int = 1
    # CTAs per cluster: each quantizes 1/cluster of x and writes it into every CTA's shared
    # memory, so x is read from L2 once per cluster instead of once per CTA.
    cluster: int = 1


def smem_bytes(k: int, tokens: int, tiles: int, in_regs: int, slices_per_warp: int = 1) -> int:
    """Dynamic shared memory of a specialization (DESIGN.md's formula)."""
    warps = tiles * (k // SLICE) // slices_per_warp
    staged = tiles * (k // SLICE) * (STEPS - in_regs) * 2 * 32 * 16
    act = max(tokens * k, warps * 32 * 16)
    return staged + act + tokens * (k // GROUP) * 4


def grid_ctas(
    rows: int,
    k: int,
    tiles: int,
    in_regs: int,
    ctas_per_sm: int,
    slices_per_warp: int = 1,
    sms: int = SMS,
) -> int:
    """CTAs launched: one per 16*tiles-row tile, or a persistent grid of one resident wave.

    Persistent (sms*ctas_per_sm CTAs; CTA c takes row tiles c, c + grid, ...) when there
    are more tiles than that, at least one step is staged (its slot holds the partial sums)
    and the launch bound leaves PERSISTENT_MIN_REGS registers a thread: x is then quantized
    once per CTA instead of once per tile. At the 80-register bound of 768 threads per SM
    the tile loop spilled 16-104 B with ptxas 13.0 for every GLM-5 config tried, so such
    configs keep one CTA per tile.
    """
    tiles_total = rows // (16 * tiles)
    threads = 32 * tiles * (k // SLICE) // slices_per_warp
    if in_regs >= STEPS or _reg_budget(threads, ctas_per_sm) < PERSISTENT_MIN_REGS:
        return tiles_total
    return min(tiles_total, sms * ctas_per_sm)


def _reg_budget(threads: int, ctas_per_sm: int) -> int:
    """Registers per thread under the launch bound: the register file is split over the SM's
    SCHEDULERS warp schedulers, so the scheduler with the most resident warps sets the bound
    (ptxas 13.0: 14 warps per SM get 128 registers, not 65536 / 448 = 146)."""
    warps_per_scheduler = math.ceil(math.ceil(threads / 32) * ctas_per_sm / SCHEDULERS)
    return min(255, REGS_PER_SM // SCHEDULERS // (32 * warps_per_scheduler) // 8 * 8)


def smem_budget(ctas_per_sm: int) -> int:
    """Dynamic shared memory one CTA may use when ctas_per_sm CTAs share an SM."""
    return min(SMEM_PER_CTA_MAX, SMEM_PER_SM // ctas_per_sm) - SMEM_CTA_OVERHEAD


def _fit(k: int, tokens: int, tiles: int, ctas_per_sm: int, slices_per_warp: int = 1) -> int | None:
    """The largest in_regs that fits registers and shared memory, or None."""
    threads = 32 * tiles * (k // SLICE) // slices_per_warp
    if threads * ctas_per_sm > THREADS_PER_SM:
        return None
    regs = _reg_budget(threads, ctas_per_sm)
    # At most STEPS-1: with no cp.async at all, ptxas 13.0 hoists griddepcontrol.wait
    # (ACQBULK) above every weight load, losing the PDL overlap; a committed cp.async group
    # keeps the loads before it (tests/test_fp8_gemv_compile.py checks the order).
    in_regs = min(STEPS - 1, (regs - BASE_REGS) // (8 * slices_per_warp))
    if in_regs < 0 or smem_bytes(k, tokens, tiles, in_regs, slices_per_warp) > smem_budget(
        ctas_per_sm
    ):
        return None
    return in_regs


def _c(
    tiles: int,
    in_regs: int,
    ctas_per_sm: int,
    early_launch: bool = False,
    spw: int = 1,
    cluster: int = 1,
) -> GemvConfig:
    return GemvConfig(tiles, in_regs, ctas_per_sm, early_launch, spw, cluster)


# The fastest config per known shape, measured on one H200 with scripts/tune_fp8_gemv.py and
# scripts/pair_sweep.py (2026-11-29, tokens 1, 2, 4 and 8; docs/KERNEL_NOTES.md, variants 4,
# 6-9 and 12). (rows, k, swiglu) ->
# ((up to tokens, config), ...): a token count takes the first entry whose bound covers it.
# Shapes not listed, or an entry that does not fit a token count, use the heuristic.
# EARLY marks gate_up configs whose PDL trigger at kernel entry (early_launch) made the layer
# faster by >= 0.25 us in the layer-level sweep (scripts/pair_sweep.py, 2026-11-29,
# bench/results/pair_sweep_early_h200.json): the down kernel then starts streaming while
# gate_up still runs. Only gate_up: after down a server runs no mlpjit kernel (all-reduce,
# residual add), so an early trigger there only helps a benchmark chain of MLPs.
EARLY = True
TUNED_H200: dict[tuple[int, int, bool], tuple[tuple[int, GemvConfig], ...]] = {
    # GLM-5 (hidden 6144, intermediate 12288) TP 8, 4, 2, 1
    # TP8 and GLM-4.5: from layer-level pair sweeps (gate_up and down alternating;
    # bench/results/pair_sweep_h200.txt, pair_sweep_down_h200.txt, then with slices per
    # warp pair_sweep_wide_tp8_h200.txt: 2-8 tokens 0.2-0.5 us faster per layer with a
    # persistent gate_up (t1/r3/c1) and down at 3 slices per warp).
    # 5-8 tokens: clusters of 2 CTAs sharing x's quantization (variant 14, pair sweeps of
    # bench/results/pair_sweep_cluster_h200.txt): 0.5-1.8 us per layer.
    (3072, 6144, True): ((1, _c(1, 3, 2)), (4, _c(1, 3, 1)), (8, _c(1, 3, 1, cluster=2))),
    (6144, 1536, False): (
        (1, _c(4, 3, 2)),
        (4, _c(4, 1, 2, spw=3)),
        (8, _c(4, 1, 2, spw=3, cluster=2)),
    ),
    # TP 4, 2 and 1: persistent grids (one resident wave looping over row tiles), most with
    # 2-3 slices per warp (spw), from the wide-warp sweeps of 2026-11-29 and a layer-level
    # pair sweep against the previous picks (KERNEL_NOTES variant 12;
    # bench/results/tune_fp8_gemv_h200_wide_*.md, pair_sweep_wide_h200.txt). No early
    # trigger won >= 0.25 us on gate_up there. Clusters of 2 (cluster=2) where they won
    # >= 0.2 us per layer in both sessions of the cluster pair sweep (TP4, TP1; variant 14)
    # or in both sweeps of the follow-up (TP2 gate_up and TP1 down at 8 tokens; variant 16,
    # bench/results/pair_sweep_cluster_more_h200.txt).
    (6144, 6144, True): (
        (1, _c(1, 0, 2, spw=2)),
        (2, _c(1, 0, 2, spw=3)),
        (3, _c(1, 2, 2, spw=3)),
        (4, _c(1, 2, 2, spw=3, cluster=2)),
        (5, _c(1, 3, 1)),
        (8, _c(1, 3, 1, cluster=2)),
    ),
    (6144, 3072, False): (
        (2, _c(4, 0, 1, spw=2)),
        (4, _c(2, 2, 2)),
        (5, _c(4, 0, 1, spw=2)),
        (7, _c(4, 0, 1, spw=2, cluster=2)),
        (8, _c(4, 0, 1, spw=2)),
    ),
    (12288, 6144, True): (
        (1, _c(1, 2, 2, spw=3)),
        (2, _c(1, 0, 2, spw=3)),
        (4, _c(1, 2, 2, spw=3)),
        (7, _c(1, 3, 1)),
        (8, _c(1, 3, 1, cluster=2)),
    ),
    (6144, 6144, False): (
        (2, _c(1, 0, 2, spw=2)),
        (4, _c(1, 2, 1)),
        (8, _c(1, 0, 1, spw=2)),
    ),
    (24576, 6144, True): (
        (2, _c(1, 0, 2, spw=3)),
        (3, _c(1, 0, 1, spw=3)),
        (4, _c(1, 0, 1, spw=3, cluster=2)),
        (8, _c(1, 3, 1, cluster=2)),
    ),
    # TP1 down at 8 tokens: spw 3 in clusters of 2 beat the unclustered spw 2 pick by 1.3 us
    # per layer (spw 2 in clusters spills; spw 2 unclustered spills at 5-7 tokens).
    (6144, 12288, False): (
        (1, _c(1, 0, 1, spw=3)),
        (2, _c(1, 0, 1, spw=2)),
        (6, _c(1, 2, 1, spw=3, cluster=2)),
        (8, _c(1, 3, 1, spw=3, cluster=2)),
    ),
    # GLM-4.5 (hidden 5120) TP 8
    (3072, 5120, True): (
        (1, _c(1, 3, 2)),
        (2, _c(1, 2, 2)),
        (4, _c(1, 3, 1)),
        (8, _c(2, 2, 1, EARLY)),
    ),
    (5120, 1536, False): ((1, _c(2, 2, 2)), (4, _c(4, 0, 2, spw=3)), (8, _c(2, 2, 2))),
    # GLM-4.5 TP4 gate_up: at 1 token the previous heuristic's pick beat the wide persistent
    # one (16.54 vs 17.57 us per layer), at 2-8 tokens the wide one won by 1.08-1.15x
    # (pair_sweep_heuristic_glm45_h200.txt); at 8 tokens clusters of 2 by 0.2-0.6 us
    # (pair_sweep_cluster_more_h200.txt).
    (6144, 5120, True): (
        (1, _c(2, 3, 1)),
        (7, _c(1, 0, 1, spw=2)),
        (8, _c(1, 0, 1, spw=2, cluster=2)),
    ),
}
# The sweep's lesson for other shapes: 2-3 steps in registers beat more (more registers
# cost occupancy, and ptxas may sink register loads below the PDL wait).
HEURISTIC_MAX_IN_REGS = 3
# From this many tokens on, heuristic picks run in clusters of 2 (where the grid allows):
# at 8 tokens that won 0.4-2.3 us per layer on every untuned GLM-4.5 shape (TP4/TP2/TP1),
# at 4 tokens it won at TP1 only and lost up to 0.4 us elsewhere (variant 14).
HEURISTIC_CLUSTER_MIN_TOKENS = 5


def _fits(rows: int, k: int, tokens: int, config: GemvConfig, sms: int = SMS) -> bool:
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
    fit = _fit(k, tokens, config.tiles, config.ctas_per_sm, spw)
    return (
        fit is not None
        and 0 <= config.in_regs <= fit
        and smem_bytes(k, tokens, config.tiles, config.in_regs, spw)
        <= smem_budget(config.ctas_per_sm)
    )


def _tuned(rows: int, k: int, tokens: int, swiglu: bool, sms: int) -> GemvConfig | None:
    if sms != SMS:
        return None  # measured on 132 SMs: grids and pairings need not carry over
    for bound, config in TUNED_H200.get((rows, k, swiglu), ()):
        if tokens <= bound:
            return config if _fits(rows, k, tokens, config) else None
    return None


def _check_shape(rows: int, k: int, tokens: int) -> None:
    for name, value in (("rows", rows), ("k", k), ("tokens", tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_sms(sms: int) -> int:
    """``sms`` if it is an SM count (an int in 1..MAX_SMS), else ValueError naming it."""
    if isinstance(sms, bool) or not isinstance(sms, int) or not 1 <= sms <= MAX_SMS:
        raise ValueError(f"sms must be an int in [1, {MAX_SMS}] (the GPU's SM count), got {sms!r}")
    return sms


def _candidates(rows: int, k: int, tokens: int, sms: int = SMS) -> list[tuple[tuple, GemvConfig]]:
    slices = k // SLICE
    found = []
    tiles = 1
    while tiles * slices <= MAX_WARPS:
        if rows % (16 * tiles) == 0:
            ctas = rows // (16 * tiles)
            for cps in range(1, 9):
                in_regs = _fit(k, tokens, tiles, cps)
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
    return bool(_candidates(rows, k, tokens))


def choose_config(rows: int, k: int, tokens: int, swiglu: bool, sms: int = SMS) -> GemvConfig:
    """Default config for a shape: the H200-measured best for the GLM shapes (TUNED_H200);
    elsewhere a persistent grid with several slices per warp for many rows and large k
    (_wide_persistent), else about one wave of resident CTAs over all SMs, at most
    HEURISTIC_MAX_IN_REGS steps in registers, no register spills; in clusters of 2 from
    HEURISTIC_CLUSTER_MIN_TOKENS tokens on.

    ``swiglu`` takes the same tiling (a CTA's 16-row tile is 8 gate + 8 up rows). ``sms``:
    the target GPU's SM count; TUNED_H200 only applies at SMS (132).
    ValueError if the kernel cannot take the shape (see kernel_supports).
    """
    check_sms(sms)
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
        best = min(_candidates(rows, k, tokens, sms), key=lambda c: c[0])[1]
        pick = GemvConfig(best.tiles, min(best.in_regs, HEURISTIC_MAX_IN_REGS), best.ctas_per_sm)
    if tokens >= HEURISTIC_CLUSTER_MIN_TOKENS:
        clustered = replace(pick, cluster=2)
        if _fits(rows, k, tokens, clustered, sms):
            return clustered
    return pick


# Heuristic for shapes with at least two waves of 16-row tiles and k >= WIDE_MIN_K: the
# measured GLM picks at TP1/TP2/TP4 (KERNEL_NOTES variant 12) were persistent grids with 2-3
# slices per warp and as little as possible in registers. Fewest register steps first,
# then (ctas_per_sm, slices_per_warp) in WIDE_ORDER. A persistent thread needs about
# WIDE_BASE_REGS registers besides its register steps: ptxas 13.0 spilled 2 slices per warp
# at 168 registers with 2 steps each.
WIDE_MIN_K = 4096
WIDE_ORDER = ((2, 3), (1, 2), (1, 3), (2, 2))
WIDE_MAX_IN_REGS = 3
WIDE_BASE_REGS = 140


def _wide_persistent(rows: int, k: int, tokens: int, sms: int = SMS) -> GemvConfig | None:
    slices = k // SLICE
    tiles_total = rows // 16
    if k < WIDE_MIN_K or k % SLICE or tiles_total < 2 * sms:
        return None
    for in_regs in range(WIDE_MAX_IN_REGS + 1):
        for cps, spw in WIDE_ORDER:
            if slices % spw or grid_ctas(rows, k, 1, in_regs, cps, spw, sms) >= tiles_total:
                continue  # not persistent: too few registers at this bound, or too few tiles
            threads = 32 * slices // spw
            if threads * cps > THREADS_PER_SM:
                continue
            regs = _reg_budget(threads, cps)
            fits_regs = WIDE_BASE_REGS + 8 * in_regs * spw <= regs
            if fits_regs and smem_bytes(k, tokens, 1, in_regs, spw) <= smem_budget(cps):
                return GemvConfig(1, in_regs, cps, slices_per_warp=spw)
    return None


def gemv_request(
    rows: int,
    k: int,
    tokens: int,
    *,
    swiglu: bool,
    limit: float | None,
    ue8m0: bool,
    arch: str,
    config: GemvConfig | None = None,
    sms: int = SMS,
) -> KernelRequest:
    """The compile request of one fp8_gemv launch (config defaults to choose_config) for a
    GPU of ``sms`` SMs."""
    from mlpjit.jit.manager import KernelRequest
    from mlpjit.kernels.registry import kernel_def

    if not isinstance(ue8m0, bool):
        raise ValueError(f"ue8m0 must be a bool, got {ue8m0!r}")
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0
    ):
        raise ValueError(f"limit must be None or a positive float, got {limit!r}")
    if not isinstance(arch, str) or not arch.startswith("sm_"):
        raise ValueError(f"arch must be a string like 'sm_90a', got {arch!r}")
    check_sms(sms)
    if config is None:
        config = choose_config(rows, k, tokens, swiglu, sms)
    elif not isinstance(config, GemvConfig):
        raise ValueError(f"config must be a GemvConfig or None, got {config!r}")
    params = {
        "rows": rows,
        "k": k,
        "tokens": tokens,
        "tiles": config.tiles,
        "in_regs": config.in_regs,
        "ctas_per_sm": config.ctas_per_sm,
        "swiglu": swiglu,
        # The clamp only shapes the SwiGLU epilogue: keep it out of the plain kernel's key.
        "limit": float(limit) if (swiglu and limit is not None) else None,
        "ue8m0": ue8m0,
    }
    # The optional knobs only where they differ from the kernel's defaults (one key per
    # compile either way: the key drops defaults too, but requests stay short).
    optional = {**dataclasses.asdict(config), "sms": sms}
    for name, default in kernel_def("fp8_gemv").param_defaults.items():
        if optional[name] != default:
            params[name] = optional[name]
    return KernelRequest(kernel="fp8_gemv", params=params, arch=arch)


def dense_mlp_requests(
    hidden: int,
    intermediate: int,
    tp: int,
    tokens: range | list[int] | tuple[int, ...] | int,
    arch: str,
    ue8m0: bool = True,
    limit: float | None = None,
    sms: int = SMS,
) -> list[KernelRequest]:
    """Both kernels of one TP shard for every token count the kernel takes, planned for a
    GPU of ``sms`` SMs.

    gate_up: rows 2*intermediate/tp, k hidden (SwiGLU fused); down: rows hidden,
    k intermediate/tp. Token counts or shapes the kernel cannot take are skipped (they run
    the stock path and need no compile).
    """
    check_sms(sms)
    for name, value in (("hidden", hidden), ("intermediate", intermediate), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if intermediate % tp:
        raise ValueError(f"tp must divide intermediate ({intermediate}), got {tp}")
    counts = [tokens] if isinstance(tokens, int) else list(tokens)
    for m in counts:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"tokens must be positive ints, got {m!r}")
    inter = intermediate // tp
    requests = []
    for m in counts:
        if not (kernel_supports(2 * inter, hidden, m) and kernel_supports(hidden, inter, m)):
            continue
        for rows, k, swiglu in ((2 * inter, hidden, True), (hidden, inter, False)):
            requests.append(
                gemv_request(
                    rows, k, m, swiglu=swiglu, limit=limit, ue8m0=ue8m0, arch=arch, sms=sms
                )
            )
    return requests
