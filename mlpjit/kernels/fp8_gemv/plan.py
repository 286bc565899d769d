"""Compile requests of fp8_gemv: one launch (gemv_request) or both kernels of a dense-MLP
shard for a list of token counts (dense_mlp_requests), planned by tuning.choose_config, with
the halves that stream_halves gives to fp8_stream's cluster form instead.

Every size is checked against its documented maximum (params.MAX_HIDDEN,
MAX_INTERMEDIATE, MAX_ROWS, MAX_K) and the SM count against hopper's range before any
planning, so a huge or bad value is a one-line ValueError naming it, never a search that
does not finish.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable

from mlpjit.jit.bounds import shown
from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.checks import check_bool, check_int
from mlpjit.kernels.fp8_gemv.params import (
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    GemvConfig,
    GemvParams,
    check_limit,
)
from mlpjit.kernels.fp8_gemv.spec import SPEC
from mlpjit.kernels.fp8_gemv.tuning import choose_config, kernel_supports, planned_waves, tuned
from mlpjit.kernels.fp8_stream import plan as stream_plan

__all__ = [
    "MAX_TOKEN_COUNTS",
    "STREAM_MAX_BYTES",
    "STREAM_MAX_IMBALANCE",
    "STREAM_MIN_BYTES",
    "dense_mlp_requests",
    "gemv_request",
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


def stream_halves(hidden: int, inter: int, tokens: int, sms: int = hopper.SMS) -> tuple[bool, bool]:
    """Which of a layer's (gate_up, down) run fp8_stream's cluster form instead of
    fp8_gemv (docs/KERNEL_NOTES.md, variants 38 and 39):

    - the down projection alone where fp8_gemv's plan for it takes more than one wave of
      CTAs (no one-wave decomposition fits its K: each wave pays its own ramp and tail);
    - fp8_gemv for both where the table has a measured pick for either half at this token
      count (those beat the stream on the H200);
    - both halves for layers of STREAM_MIN_BYTES to STREAM_MAX_BYTES whose tiles deal
      evenly (stream_plan.imbalance within STREAM_MAX_IMBALANCE for both).

    A half goes to fp8_stream only where it takes the shape (stream_plan.fits); where both
    do, x is quantized once per cluster from stream_plan.SHARE_X_MIN_TOKENS tokens on
    (stream_plan.layer_stream_options)."""
    gate_up, down = (2 * inter, hidden), (hidden, inter)
    down_fits = stream_plan.fits(*down, tokens, sms)
    if planned_waves(*down, tokens, False, sms) > 1 and down_fits:
        return False, True
    if tuned(*gate_up, tokens, True, sms) or tuned(*down, tokens, False, sms):
        return False, False
    both = (
        STREAM_MIN_BYTES <= 3 * hidden * inter <= STREAM_MAX_BYTES
        and down_fits
        and stream_plan.fits(*gate_up, tokens, sms)
        and max(stream_plan.imbalance(*gate_up, sms), stream_plan.imbalance(*down, sms))
        <= STREAM_MAX_IMBALANCE
    )
    return both, both


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
    sms: int = hopper.SMS,
) -> KernelRequest:
    """The compile request of one fp8_gemv launch (config defaults to choose_config) for a
    GPU of ``sms`` SMs. ValueError (from GemvParams) for anything the kernel cannot take."""
    hopper.check_sms(sms)
    if config is None:
        config = choose_config(rows, k, tokens, swiglu, sms)
    elif not isinstance(config, GemvConfig):
        raise ValueError(f"config must be a GemvConfig or None, got {config!r}")
    params = GemvParams.of(
        rows, k, tokens, config, swiglu=swiglu, limit=limit, ue8m0=ue8m0, sms=sms
    )
    # Defaults left out, as the key does: requests stay short (and record files readable).
    return KernelRequest(kernel=SPEC.name, params=SPEC.key_params(params), arch=arch)


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
                extra = stream_plan.layer_stream_options(rows, k, m, all(streams), sms)
                requests.append(
                    stream_plan.stream_request(rows, k, m, swiglu=swiglu, **options, **extra)
                )
            else:
                requests.append(gemv_request(rows, k, m, swiglu=swiglu, **options))
    return tuple(requests)
