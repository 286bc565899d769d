"""The layer planner: which kernel runs each half of a dense-MLP layer, with which options.

For every token count of a TP shard, dense_mlp_requests asks each kernel package for one
launch: fp8_gemv's (fp8_gemv.plan.gemv_request, its config from the table or heuristics)
or, for the halves stream_halves gives to it, fp8_stream's cluster form
(fp8_stream.plan.stream_request, with layer_stream_options where both halves stream).
token_counts checks and deduplicates the token counts every plan and DenseMlp.prepare()
read.

These rules are about layers, not kernels, so they live outside the kernel packages: the
compile cache keys each kernel by the source of its whole package, and a rule changed here
changes which kernels a layer asks for, never a kernel's cache key. The kernel packages
never import this module. Pure Python: no cutlass or torch import.

Every size is checked against its documented maximum (fp8_gemv's MAX_HIDDEN,
MAX_INTERMEDIATE) and the SM count against hopper's range before any planning, so a huge or
bad value is a one-line ValueError naming it, never a search that does not finish.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable

from mlpjit.jit.bounds import shown
from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.blocks import BLOCK
from mlpjit.kernels.checks import check_bool, check_int
from mlpjit.kernels.fp8_gemv.params import MAX_HIDDEN, MAX_INTERMEDIATE, check_limit
from mlpjit.kernels.fp8_gemv.plan import gemv_request
from mlpjit.kernels.fp8_gemv.tuning import kernel_supports, planned_waves, tuned
from mlpjit.kernels.fp8_stream import plan as stream_plan

__all__ = [
    "MAX_TOKEN_COUNTS",
    "SHARE_X_MAX_STAGES",
    "SHARE_X_MIN_TOKENS",
    "STREAM_MAX_BYTES",
    "STREAM_MAX_IMBALANCE",
    "STREAM_MID_MIN_BYTES",
    "STREAM_MID_MIN_DOWN_BLOCKS",
    "STREAM_MIN_BYTES",
    "dense_mlp_requests",
    "layer_stream_options",
    "stream_halves",
    "token_counts",
]

# Most token counts one plan or prepare() reads: far more than a server's list of CUDA-graph
# batch sizes, and few enough that an endless iterable (itertools.count) is refused at once.
MAX_TOKEN_COUNTS = 1 << 16


def token_counts(tokens: Iterable[int]) -> list[int]:
    """The distinct token counts of ``tokens`` (a finite iterable of at most
    MAX_TOKEN_COUNTS ints >= 1) as plain ints in first-seen order; ValueError naming
    tokens otherwise. Linear: duplicates are found with a set."""
    try:
        items = list(itertools.islice(tokens, MAX_TOKEN_COUNTS + 1))
    except TypeError:
        raise ValueError(
            f"tokens must be an iterable of ints >= 1 (e.g. range(1, 9)), got {tokens!r}"
        ) from None
    if len(items) > MAX_TOKEN_COUNTS:
        raise ValueError(
            f"tokens must be a finite iterable of at most {MAX_TOKEN_COUNTS} token counts "
            f"(e.g. range(1, 9)), got more from {shown(tokens)}"
        )
    seen: set[int] = set()
    counts = []
    for t in items:
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"tokens must be ints >= 1, got {shown(t)} in {shown(tokens)}")
        if t not in seen:
            seen.add(t)
            counts.append(int(t))
    return counts


# Layers of STREAM_MIN_BYTES to STREAM_MAX_BYTES of weights stream both halves (fp8_stream's
# cluster form) where its whole tiles deal evenly enough (STREAM_MAX_IMBALANCE: the busiest
# CTA's blocks over the mean per SM; the tiles of 1920- to 4864-wide shards deal within
# 1.125, 1152-wide ones at 1.15 and more lost). On the H200 such layers of 25-69 MB ran at
# 0.74-1.0x the time of fp8_gemv's planned pair; at 17-24 MB the stream won on some shapes
# and lost up to 24% on others (the TP-2 shared experts of GLM-5 and DeepSeek-V3, whose
# fp8_gemv pairs run near 1.6x the floor), so those keep fp8_gemv. Past 70 MiB fp8_gemv's
# persistent whole-K grids run near the floor and the streamed gate_up lost
# (docs/KERNEL_NOTES.md, variant 39).
STREAM_MIN_BYTES = 24 << 20
STREAM_MAX_BYTES = 70 << 20
STREAM_MAX_IMBALANCE = 1.13
# Layers of STREAM_MID_MIN_BYTES up to STREAM_MIN_BYTES stream both halves too from
# SHARE_X_MIN_TOKENS tokens on (x shared per cluster) where the down projection has at least
# STREAM_MID_MIN_DOWN_BLOCKS K blocks and the tiles deal within
# STREAM_MAX_IMBALANCE: at 6-8 tokens fp8_gemv's pairs of that size take 1.2-1.5x their
# 1-token time (x quantized per CTA), the stream's time follows the bytes. On the H200 that
# ran at 0.71-0.97x the pair's time at 6 and 8 tokens on 6 such shapes; shards of 8-12
# blocks (the TP-2 shared experts of GLM-5 and DeepSeek-V3, Qwen3-8B TP 8, GLM-4.5's shared
# expert at TP 1) lost up to 9%, and 1-4 tokens mostly lost (docs/KERNEL_NOTES.md,
# variant 41).
STREAM_MID_MIN_BYTES = 12 << 20
STREAM_MID_MIN_DOWN_BLOCKS = 13

# A layer whose halves both stream shares x's quantization over clusters of at least 2 from
# this many tokens on, with at most SHARE_X_MAX_STAGES ring stages. On the H200 (14 such
# layers, 1-8 tokens) that took 3-9% off the layer at 8 tokens and 0-6% at 6, and cost
# 1-6% at 1-2 tokens, where x is small; with the planner's deeper rings it won about half
# as much at 8 tokens. Down projections streamed alone gained nothing from it
# (docs/KERNEL_NOTES.md, variant 40).
SHARE_X_MIN_TOKENS = 6
SHARE_X_MAX_STAGES = 3


def stream_halves(hidden: int, inter: int, tokens: int, sms: int = hopper.SMS) -> tuple[bool, bool]:
    """Which of a layer's (gate_up, down) run fp8_stream's cluster form instead of
    fp8_gemv (docs/KERNEL_NOTES.md, variants 38, 39 and 41):

    - the down projection alone where fp8_gemv's plan for it takes more than one wave of
      CTAs (no one-wave decomposition fits its K: each wave pays its own ramp and tail);
    - fp8_gemv for both where the table has a measured pick for either half at this token
      count (those beat the stream on the H200);
    - both halves for layers of STREAM_MIN_BYTES to STREAM_MAX_BYTES whose tiles deal
      evenly (stream_plan.imbalance within STREAM_MAX_IMBALANCE for both), and from
      SHARE_X_MIN_TOKENS tokens on for layers of STREAM_MID_MIN_BYTES up to
      STREAM_MIN_BYTES whose down projection has STREAM_MID_MIN_DOWN_BLOCKS K blocks or more.

    A half goes to fp8_stream only where it takes the shape (stream_plan.fits); where both
    do, x is quantized once per cluster from SHARE_X_MIN_TOKENS tokens on
    (layer_stream_options)."""
    gate_up, down = (2 * inter, hidden), (hidden, inter)
    down_fits = stream_plan.fits(*down, tokens, sms)
    if planned_waves(*down, tokens, False, sms) > 1 and down_fits:
        return False, True
    if tuned(*gate_up, tokens, True, sms) or tuned(*down, tokens, False, sms):
        return False, False
    size = 3 * hidden * inter
    mid = (
        STREAM_MID_MIN_BYTES <= size < STREAM_MIN_BYTES
        and tokens >= SHARE_X_MIN_TOKENS
        and inter // BLOCK >= STREAM_MID_MIN_DOWN_BLOCKS
    )
    both = (
        (STREAM_MIN_BYTES <= size <= STREAM_MAX_BYTES or mid)
        and down_fits
        and stream_plan.fits(*gate_up, tokens, sms)
        and max(stream_plan.imbalance(*gate_up, sms), stream_plan.imbalance(*down, sms))
        <= STREAM_MAX_IMBALANCE
    )
    return both, both


def layer_stream_options(
    rows: int, k: int, tokens: int, both_halves: bool, sms: int = hopper.SMS
) -> dict:
    """stream_request options for one half of a dense layer on fp8_stream: x quantized once
    per cluster (``share_x``, clusters of at least 2, at most SHARE_X_MAX_STAGES stages)
    where both halves stream and there are SHARE_X_MIN_TOKENS tokens or more and it fits;
    otherwise none (the planner's defaults)."""
    if not both_halves or tokens < SHARE_X_MIN_TOKENS:
        return {}
    options = dict(cluster=max(stream_plan.choose_cluster(rows, k, sms), 2), share_x=True)
    try:
        warps, per_warp = stream_plan.stage_shape(k)
        most = stream_plan.choose_stages(
            rows, k, tokens, warps, sms, per_warp, 1, options["cluster"], share_x=True
        )
    except ValueError:
        return {}
    return {**options, "stages": min(most, SHARE_X_MAX_STAGES)}


def dense_mlp_requests(
    hidden: int,
    intermediate: int,
    tp: int,
    tokens: range | list[int] | tuple[int, ...] | int,
    arch: str,
    ue8m0: bool = True,
    limit: float | None = None,
    sms: int = hopper.SMS,
) -> list[KernelRequest]:
    """Both kernels of one TP shard for every token count the kernel takes, planned for a
    GPU of ``sms`` SMs.

    gate_up: rows 2*intermediate/tp, k hidden (SwiGLU fused); down: rows hidden,
    k intermediate/tp; each on fp8_stream's cluster form where ``stream_halves`` says so.
    Token counts or shapes the kernel cannot take are skipped (they run the stock path and
    need no compile).
    """
    hopper.check_sms(sms)
    check_int("hidden", hidden, 1, MAX_HIDDEN)
    check_int("intermediate", intermediate, 1, MAX_INTERMEDIATE)
    check_int("tp", tp, 1, intermediate)
    if intermediate % tp:
        raise ValueError(f"tp must divide intermediate ({intermediate}), got {tp}")
    counts = token_counts([tokens] if isinstance(tokens, int) else tokens)
    limit = check_limit(limit)
    check_bool("ue8m0", ue8m0)
    return list(_shard_requests(hidden, intermediate // tp, tuple(counts), arch, ue8m0, limit, sms))


@functools.lru_cache(maxsize=256)
def _shard_requests(
    hidden: int,
    inter: int,
    counts: tuple[int, ...],
    arch: str,
    ue8m0: bool,
    limit: float | None,
    sms: int,
) -> tuple[KernelRequest, ...]:
    """dense_mlp_requests of checked arguments, memoized per process: a model's many layers
    of one shape (75 shared experts of GLM-5) plan once instead of once each."""
    requests = []
    for m in counts:
        if not (
            kernel_supports(2 * inter, hidden, m, sms) and kernel_supports(hidden, inter, m, sms)
        ):
            continue
        options = dict(limit=limit, ue8m0=ue8m0, arch=arch, sms=sms)
        halves = ((2 * inter, hidden, True), (hidden, inter, False))
        streams = stream_halves(hidden, inter, m, sms)
        for (rows, k, swiglu), streamed in zip(halves, streams, strict=True):
            if streamed:
                extra = layer_stream_options(rows, k, m, all(streams), sms)
                requests.append(
                    stream_plan.stream_request(rows, k, m, swiglu=swiglu, **options, **extra)
                )
            else:
                requests.append(gemv_request(rows, k, m, swiglu=swiglu, **options))
    return tuple(requests)
