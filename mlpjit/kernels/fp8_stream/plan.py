"""fp8_stream's compile requests: the knobs follow from the shape and the shared-memory
budget (no table): eight consumer warps of two blocks each per stage (32 KB stages, 2 KB
bulk copies per weight row: 1 KB copies streamed at 2.9 TB/s on the H200, 2 KB ones at
4.2; one block each where x leaves no room for two such stages), as many ring stages as
fit in the SM's shared memory beside x, and the cluster form with the cluster size whose
busiest CTA takes the fewest blocks (docs/KERNEL_NOTES.md, the streaming kernel). Which
halves of a dense-MLP layer stream, and with which options (x quantized once per cluster,
``share_x``), is the layer planner's question (mlpjit.layer_plan), outside this package: its
rules are no part of fp8_stream's cache key.
"""

from __future__ import annotations

from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_stream.params import (
    BLOCK,
    CLUSTER_SIZES,
    MAX_WARPS,
    WARPGROUP,
    StreamParams,
)
from mlpjit.kernels.fp8_stream.spec import SPEC

__all__ = [
    "DEFAULT_BLOCKS_PER_WARP",
    "DEFAULT_WARPS",
    "MAX_STAGES",
    "MIN_STAGES",
    "WHOLE_TILE_STAGE_MAX",
    "choose_cluster",
    "choose_stages",
    "stage_shape",
    "stream_params",
    "stream_request",
    "fits",
    "imbalance",
]

DEFAULT_WARPS = 8
DEFAULT_BLOCKS_PER_WARP = 2
# A K of at most WHOLE_TILE_STAGE_MAX blocks that is no divisor or multiple of 16 gets
# stages of whole tiles' K (stage_shape): a 16-block stage would span two tiles in most
# rounds. On the H200 that took 4-13% off the layers whose down projection has 12 to 21
# blocks; at 22 and 24 blocks a whole-tile stage leaves 3 stages in the ring and lost up to
# 9% (docs/KERNEL_NOTES.md, variant 42).
WHOLE_TILE_STAGE_MAX = 21
MAX_STAGES = 16
MIN_STAGES = 2


def stage_shape(k: int, whole_warpgroups: bool = False) -> tuple[int, int]:
    """(consumer warps, blocks per warp) of a stage for a K of ``k``: DEFAULT_WARPS x
    DEFAULT_BLOCKS_PER_WARP (16 blocks), or where K's blocks are at most
    WHOLE_TILE_STAGE_MAX and neither divide 16 nor are divided by it, as many whole tiles' K
    as fit in WHOLE_TILE_STAGE_MAX blocks: two blocks per warp where that count is even, else
    one (at most MAX_WARPS warps), else three (12 blocks: 6 x 2; 15: 15 x 1; 9: 18 = 9 x 2;
    7: 21 = 7 x 3; 17 and 19 keep 16-block stages). ``whole_warpgroups`` (tma): warp counts
    that are multiples of WARPGROUP only (12 blocks: 12 x 1; 15 and 21 keep 16-block
    stages)."""
    blocks = k // BLOCK
    default = (DEFAULT_WARPS, DEFAULT_BLOCKS_PER_WARP)
    stage = DEFAULT_WARPS * DEFAULT_BLOCKS_PER_WARP
    if blocks > WHOLE_TILE_STAGE_MAX or stage % blocks == 0 or blocks % stage == 0:
        return default
    whole = WHOLE_TILE_STAGE_MAX // blocks * blocks  # the most whole tiles' blocks that fit
    for per_warp in (2, 1, 3):
        warps = whole // per_warp
        if whole % per_warp or warps > MAX_WARPS or (whole_warpgroups and warps % WARPGROUP):
            continue
        return warps, per_warp
    return default


def choose_stages(
    rows: int,
    k: int,
    tokens: int,
    warps: int,
    sms: int = hopper.SMS,
    blocks_per_warp: int = 1,
    ctas_per_sm: int = 1,
    cluster: int = 0,
    share_x: bool = False,
    tma: bool = False,
) -> int:
    """Most ring stages (up to MAX_STAGES, no more than a CTA's range has) within the
    shared-memory budget of ``ctas_per_sm`` CTAs per SM; ValueError (naming k and tokens)
    when not even MIN_STAGES fit."""
    for stages in range(MAX_STAGES, MIN_STAGES - 1, -1):
        try:
            params = StreamParams(
                rows=rows, k=k, tokens=tokens, swiglu=False, limit=None, ue8m0=True,
                warps=warps, stages=stages, sms=sms, blocks_per_warp=blocks_per_warp,
                ctas_per_sm=ctas_per_sm, cluster=cluster, share_x=share_x, tma=tma,
            )  # fmt: skip
        except ValueError:
            continue
        # A range of b blocks fills at most b / stage_blocks + 3 stages (its segments).
        most = -(-params.max_blocks_per_cta // params.stage_blocks) + 3
        return max(MIN_STAGES, min(stages, most))
    raise ValueError(f"fp8_stream cannot hold x for k={k} and {tokens} tokens in shared memory")


def stream_params(
    rows: int,
    k: int,
    tokens: int,
    *,
    swiglu: bool,
    limit: float | None,
    ue8m0: bool,
    warps: int | None = None,
    stages: int | None = None,
    sms: int = hopper.SMS,
    trace: bool = False,
    blocks_per_warp: int | None = None,
    ctas_per_sm: int = 1,
    cluster: int | None = None,
    share_x: bool = False,
    ablate: str = "",
    tma: bool = False,
    step_sums: bool = False,
) -> StreamParams:
    """The params of one launch; knobs left None follow from the shape (``warps`` and
    ``blocks_per_warp`` both None: stage_shape's; ``cluster`` None: the cluster form at
    choose_cluster's size; 0: the grid-wide form; ``ablate``, ``tma``, ``step_sums``: see
    StreamParams)."""
    hopper.check_sms(sms)
    if cluster is None:
        cluster = choose_cluster(rows, k, sms)
    if warps is None and blocks_per_warp is None:
        warps, preferred = stage_shape(k, tma)
    else:
        warps = DEFAULT_WARPS if warps is None else warps
        preferred = DEFAULT_BLOCKS_PER_WARP
    if blocks_per_warp is None and stages is None:
        # One block per warp where x leaves no room for MIN_STAGES stages of the preferred
        # shape (k 17408 at 8 tokens: docs/KERNEL_NOTES.md, variant 38).
        for blocks_per_warp in (preferred, 1):
            try:
                stages = choose_stages(
                    rows, k, tokens, warps, sms, blocks_per_warp, ctas_per_sm, cluster, share_x,
                    tma,
                )  # fmt: skip
                break
            except ValueError:
                if blocks_per_warp == 1:
                    raise
    if blocks_per_warp is None:
        blocks_per_warp = preferred
    if stages is None:
        stages = choose_stages(
            rows, k, tokens, warps, sms, blocks_per_warp, ctas_per_sm, cluster, share_x, tma
        )
    return StreamParams(
        rows=rows, k=k, tokens=tokens, swiglu=swiglu, limit=limit if swiglu else None,
        ue8m0=ue8m0, warps=warps, stages=stages, sms=sms, trace=trace,
        blocks_per_warp=blocks_per_warp, ctas_per_sm=ctas_per_sm, cluster=cluster,
        share_x=share_x, ablate=ablate, tma=tma, step_sums=step_sums,
    )  # fmt: skip


def choose_cluster(rows: int, k: int, sms: int = hopper.SMS) -> int:
    """The cluster form's cluster size (1, 2, 4 or 8) whose busiest CTA takes the fewest
    blocks (whole tiles dealt to as many clusters as can be resident, each cluster's
    blocks cut evenly), the smaller size on a tie (fewer split tiles)."""
    best = None
    for size in CLUSTER_SIZES[1:]:
        try:
            params = StreamParams(
                rows=rows, k=k, tokens=1, swiglu=False, limit=None, ue8m0=True,
                stages=MIN_STAGES, sms=sms, cluster=size,
            )  # fmt: skip
        except ValueError:
            continue
        if best is None or params.max_blocks_per_cta < best[0]:
            best = (params.max_blocks_per_cta, size)
    if best is None:
        raise ValueError(f"fp8_stream's cluster form cannot take rows={rows}, k={k}")
    return best[1]


def imbalance(rows: int, k: int, sms: int = hopper.SMS) -> float:
    """The busiest CTA's blocks over the mean per SM, in the cluster form choose_cluster
    picks: near 1 where the whole tiles deal evenly to clusters that fill the SMs, more
    where a few large tiles do not, or clusters of 4 or 8 leave SMs idle."""
    params = StreamParams(
        rows=rows, k=k, tokens=1, swiglu=False, limit=None, ue8m0=True, stages=MIN_STAGES,
        sms=sms, cluster=choose_cluster(rows, k, sms),
    )  # fmt: skip
    return params.max_blocks_per_cta * sms / params.blocks


def fits(rows: int, k: int, tokens: int, sms: int = hopper.SMS) -> bool:
    """Whether fp8_stream takes the shape with its default knobs (the cluster form; x and
    MIN_STAGES stages in shared memory)."""
    try:
        stream_params(rows, k, tokens, swiglu=False, limit=None, ue8m0=True, sms=sms)
    except ValueError:
        return False
    return True


def stream_request(rows: int, k: int, tokens: int, *, arch: str, **options) -> KernelRequest:
    """The compile request of one fp8_stream launch (options: see stream_params)."""
    params = stream_params(rows, k, tokens, **options)
    return KernelRequest(kernel=SPEC.name, params=SPEC.key_params(params), arch=arch)
