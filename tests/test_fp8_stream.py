"""fp8_stream's params and planner (plain Python: no cutlass, no GPU)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_stream import SPEC, plan
from mlpjit.kernels.fp8_stream.params import (
    BLOCK,
    MAX_WARPS,
    TILE_ROWS,
    TRACE_POINTS,
    X_BLOCK_BYTES,
    StreamParams,
    workspace_bytes,
)

BASE = dict(rows=3072, k=6144, tokens=8, swiglu=True, limit=None, ue8m0=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(rows=3000), "rows must be a multiple of 16"),
        (dict(k=6100), "k must be a multiple of 128"),
        (dict(tokens=9), r"tokens must be in \[1, 8\]"),
        (dict(warps=0), r"warps must be in \[1, 16\]"),
        (dict(stages=1), r"stages must be in \[2, 16\]"),
        (dict(limit=float("inf")), "limit must be None or a finite number > 0 within BF16"),
        (dict(limit=-1.0), "limit must be None or a finite number > 0 within BF16"),
        (dict(swiglu=1), "swiglu must be a bool"),
        (dict(sms=0), "sms must be an int"),
        (dict(stages=16, k=18432), "more than .* lower stages or warps"),
        (dict(blocks_per_warp=5), r"blocks_per_warp must be in \[1, 4\]"),
        (dict(ctas_per_sm=3), r"ctas_per_sm must be in \[1, 2\]"),
        (dict(ctas_per_sm=2, stages=6), "at ctas_per_sm=2"),
        (dict(cluster=3), "cluster must be one of 0, 1, 2, 4, 8"),
        (dict(cluster=True), "cluster must be one of"),
        (dict(k=384, cluster=4), r"cluster must be at most k / 128 = 3"),
        (dict(share_x=True), "share_x needs the cluster form with clusters of 2 or more"),
        (dict(share_x=True, cluster=1), "share_x needs .* got cluster=1"),
        (dict(share_x=1, cluster=2), "share_x must be a bool"),
        (dict(ablate="w"), "ablate must be one of '', 'x', 'mma', 'x\\+mma', got 'w'"),
        (dict(ablate=None), "ablate must be one of .* got None"),
        (dict(ablate="x", share_x=True, cluster=2), "ablate='x' needs share_x=False"),
        (dict(tma=1), "tma must be a bool"),
        (dict(tma=True, warps=6), "tma needs warps a multiple of 4 .* got 6"),
        (dict(step_sums=True), "step_sums needs tma=True"),
    ],
)
def test_params_refuse_what_the_kernel_cannot_take(change, message) -> None:
    with pytest.raises(ValueError, match=message):
        StreamParams(**{**BASE, **change})


def test_ranges_cover_the_blocks_evenly_on_one_wave() -> None:
    p = StreamParams(**BASE)
    assert p.blocks == 3072 // TILE_ROWS * 6144 // BLOCK
    assert p.ctas == hopper.SMS
    assert p.max_blocks_per_cta == -(-p.blocks // p.ctas)
    tiny = StreamParams(**{**BASE, "rows": 128, "k": 640, "swiglu": False})
    assert tiny.ctas == tiny.blocks == 40  # one block per CTA: never an idle CTA


def test_workspace_holds_two_slots_per_cta_and_a_counter_per_tile() -> None:
    assert workspace_bytes(3072, 6144) == 132 * 2 * 512 + 192 * 4
    assert workspace_bytes(128, 640) == 40 * 2 * 512 + 8 * 4
    traced = StreamParams(**{**BASE, "trace": True})
    assert traced.workspace_bytes > workspace_bytes(3072, 6144)
    assert traced.trace_offset % 8 == 0


def test_request_keeps_the_clamp_for_swiglu_only() -> None:
    gate_up = plan.stream_request(3072, 6144, 1, swiglu=True, limit=7.0, ue8m0=True, arch="sm_90a")
    down = plan.stream_request(6144, 1536, 1, swiglu=False, limit=7.0, ue8m0=True, arch="sm_90a")
    assert gate_up.kernel == SPEC.name == "fp8_stream"
    assert gate_up.params["limit"] == 7.0
    assert down.params.get("limit") is None


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 512).map(lambda n: n * TILE_ROWS),
    k=st.integers(1, 160).map(lambda n: n * BLOCK),
    tokens=st.integers(1, 8),
    warps=st.sampled_from([4, 8, 16]),
    blocks_per_warp=st.sampled_from([1, 2]),
    ctas_per_sm=st.sampled_from([1, 2]),
)
def test_planner_fits_or_names_k_and_tokens(rows, k, tokens, warps, blocks_per_warp, ctas_per_sm):
    try:
        p = plan.stream_params(
            rows, k, tokens, swiglu=False, limit=None, ue8m0=True, warps=warps,
            blocks_per_warp=blocks_per_warp, ctas_per_sm=ctas_per_sm,
        )  # fmt: skip
    except ValueError as err:
        assert f"k={k}" in str(err) and f"{tokens} tokens" in str(err)
        return
    assert p.smem_bytes <= hopper.smem_budget(ctas_per_sm)
    assert p.stage_blocks == warps * blocks_per_warp
    assert plan.MIN_STAGES <= p.stages <= plan.MAX_STAGES


@settings(max_examples=300, deadline=None)
@given(
    tiles=st.integers(1, 700),
    kblocks=st.integers(1, 140),
    cluster=st.sampled_from([0, 1, 2, 4, 8]),
    sms=st.sampled_from([hopper.SMS, 114, 78, 16]),
)
def test_ranges_partition_the_blocks_and_split_tiles_stay_in_a_cluster(
    tiles, kblocks, cluster, sms
) -> None:
    if cluster > kblocks:
        return
    p = StreamParams(
        rows=tiles * TILE_ROWS, k=kblocks * BLOCK, tokens=1, swiglu=False, limit=None,
        ue8m0=True, stages=2, sms=sms, cluster=cluster,
    )  # fmt: skip
    ranges = p.cta_ranges()
    assert len(ranges) == p.ctas <= hopper.resident_ctas(sms, p.cluster_ctas)
    assert ranges[0][0] == 0 and ranges[-1][1] == p.blocks
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(start < stop for start, stop in ranges)  # no idle CTA
    assert max(stop - start for start, stop in ranges) == p.max_blocks_per_cta
    if cluster:
        for c, (start, stop) in enumerate(ranges):
            # every tile this CTA touches lies wholly inside its cluster's blocks
            j = c // cluster
            lo = ranges[j * cluster][0]
            hi = ranges[j * cluster + cluster - 1][1]
            assert lo % kblocks == 0 and hi % kblocks == 0
            assert lo <= start and stop <= hi


@settings(max_examples=300, deadline=None)
@given(
    tiles=st.integers(1, 400),
    kblocks=st.integers(1, 60),
    cluster=st.sampled_from([0, 1, 2, 4, 8]),
    stage=st.sampled_from([(8, 2), (6, 2), (15, 1), (7, 3), (16, 1)]),
)
def test_segments_take_the_split_tiles_first_and_stages_cover_the_range(
    tiles, kblocks, cluster, stage
) -> None:
    if cluster > kblocks:
        return
    warps, per_warp = stage
    p = StreamParams(
        rows=tiles * TILE_ROWS, k=kblocks * BLOCK, tokens=1, swiglu=False, limit=None,
        ue8m0=True, stages=2, cluster=cluster, warps=warps, blocks_per_warp=per_warp,
    )  # fmt: skip
    for b0, b1 in p.cta_ranges():
        (h0, h1), (t0, t1), (m0, m1) = p.segments(b0, b1)
        covered = sorted(b for lo, hi in p.segments(b0, b1) for b in range(lo, hi))
        assert covered == list(range(b0, b1))  # a partition, in any order
        assert h1 - h0 < kblocks and t1 - t0 < kblocks  # the partial shares only...
        if m1 > m0:
            assert m0 % kblocks == 0 and m1 % kblocks == 0  # ...and whole tiles last
        if h1 > h0:
            assert h0 == b0 and (h1 % kblocks == 0 or h1 == b1)
        if t1 > t0:
            assert t1 == b1 and t0 % kblocks == 0
        fills = p.stage_fills(b0, b1)
        assert sum(fills) == b1 - b0 and max(fills) <= p.stage_blocks
        # the planner's bound on the stages a range can fill (plan.choose_stages)
        assert len(fills) <= -(-(b1 - b0) // p.stage_blocks) + 3


def test_cluster_form_needs_no_workspace_and_holds_the_partials_it_receives() -> None:
    grid = StreamParams(**BASE, stages=4)
    clustered = StreamParams(**BASE, stages=4, cluster=4)
    assert clustered.workspace_bytes == 16  # the kernel keeps a pointer; nothing is read
    assert clustered.smem_received == clustered.smem_ring + 4 * clustered.stage_bytes
    assert clustered.smem_bytes == clustered.smem_received + 3 * 512 + 16
    assert grid.smem_bytes == grid.smem_ring + 4 * grid.stage_bytes
    assert clustered.cluster_ctas == 4 and grid.cluster_ctas == 1
    assert clustered.ctas == 120  # 30 clusters of 4 are resident on 132 SMs
    assert StreamParams(**BASE, stages=4, cluster=2).ctas == 132
    traced = StreamParams(**BASE, stages=4, cluster=2, trace=True)
    assert traced.trace_offset == 0 and traced.workspace_bytes == 132 * TRACE_POINTS * 8


@pytest.mark.parametrize(("tokens", "cluster"), [(1, 2), (6, 4), (7, 2), (8, 8)])
def test_shared_x_is_quantized_once_per_cluster(tokens, cluster) -> None:
    # The shared expert's gate_up (512 x 7168): ranges of 8 clusters of 8 cover under a
    # tile, so without share_x a CTA holds part of x; with it every CTA holds all of x and
    # quantizes every cluster-th chunk of it.
    base = dict(BASE, rows=512, k=7168, tokens=tokens, stages=3, cluster=cluster)
    alone = StreamParams(**base)
    shared = StreamParams(**base, share_x=True)
    assert shared.x_blocks_max == 56 >= alone.x_blocks_max
    assert shared.x_chunks == -(-tokens * 56 // cluster)
    assert alone.x_chunks == tokens * alone.x_blocks_max
    assert shared.x_passes == -(-shared.x_chunks // (4 * shared.warps))
    # the x mbarrier shares the 16 bytes of mbarriers after the received partials
    assert shared.smem_x_bar == shared.smem_split_bar + 8 < shared.smem_bytes
    assert shared.smem_bytes - alone.smem_bytes >= tokens * (56 - alone.x_blocks_max) * BLOCK
    assert "share_x" not in SPEC.key_params(alone) and SPEC.key_params(shared)["share_x"]


@pytest.mark.parametrize("share_x", [False, True])
def test_tma_x_holds_core_matrix_blocks_and_the_first_three_again(share_x: bool) -> None:
    # GLM-5 TP 8 gate_up (48 K blocks), 1 token: every K block of x is 8 tokens x 128 bytes
    # (wgmma's B rows), and a range that wraps past K holds its first three blocks again.
    base = dict(BASE, tokens=1, stages=3, cluster=2, share_x=share_x)
    plain = StreamParams(**base)
    tma = StreamParams(**base, tma=True)
    assert plain.max_blocks_per_cta == tma.max_blocks_per_cta == 72  # 3 tiles per cluster
    assert tma.x_blocks_max == 48 + 3 and tma.x_slots == 48 + 3
    assert tma.x_bytes == 51 * X_BLOCK_BYTES and plain.x_bytes == 1 * plain.x_row
    assert tma.x_chunks == -(-51 // (2 if share_x else 1))
    # the ring: unpadded 2 KB blocks from a 1 KB boundary (the swizzle's atom)
    assert tma.stage_bytes == 4 * 2048 and tma.smem_ring % 1024 == 0  # 4 warps x 1 block
    assert tma.kernel_args == (*plain.kernel_args, "w_map") and tma.tma_box_rows == 8
    # A range under one tile holds its own blocks and room for three past its end.
    small = StreamParams(**dict(BASE, rows=512, k=7168, tokens=8, stages=3, cluster=8,
                                tma=True, swiglu=False))  # fmt: skip
    assert small.max_blocks_per_cta == 21  # 2 tiles per cluster of 8 (15 clusters)
    assert small.x_blocks_max == 21 and small.x_slots == 24 and small.tma_box_rows == 16
    assert SPEC.key_params(tma)["tma"] is True and "tma" not in SPEC.key_params(plain)


def test_tma_stage_shape_takes_whole_warpgroups() -> None:
    for blocks in range(1, 200):
        warps, per_warp = plan.stage_shape(blocks * BLOCK, whole_warpgroups=True)
        assert warps % 4 == 0 and warps * per_warp <= max(16, plan.WHOLE_TILE_STAGE_MAX)
    assert plan.stage_shape(12 * BLOCK, whole_warpgroups=True) == (12, 1)
    assert plan.stage_shape(13 * BLOCK, whole_warpgroups=True) == (8, 2)
    p = plan.stream_params(3072, 1664, 8, swiglu=False, limit=None, ue8m0=True, tma=True)
    assert (p.warps, p.blocks_per_warp, p.tma) == (8, 2, True)


def test_choose_cluster_takes_the_busiest_cta_with_fewest_blocks() -> None:
    # GLM-5 TP 8 gate_up: 192 tiles; clusters of 2 take 3 tiles (72 blocks per CTA), one
    # tile per CTA would leave two tiles (96 blocks) on some
    assert plan.choose_cluster(3072, 6144) == 2
    # DeepSeek-V3's shared expert gate_up: 32 tiles, 15 resident clusters of 8
    assert plan.choose_cluster(512, 7168) == 8
    assert plan.choose_cluster(128, 128) == 1  # one block per tile: no split possible


def test_stage_shape_takes_whole_tiles_where_16_blocks_would_span_two() -> None:
    shape = {blocks: plan.stage_shape(blocks * BLOCK) for blocks in range(1, 200)}
    assert shape[12] == (6, 2) and shape[15] == (15, 1) and shape[21] == (7, 3)
    assert shape[9] == (9, 2) and shape[5] == (10, 2)  # 18 = two tiles, 20 = four
    default = (plan.DEFAULT_WARPS, plan.DEFAULT_BLOCKS_PER_WARP)
    for blocks in (1, 2, 4, 8, 16, 17, 19, 22, 24, 32, 48, 199):
        assert shape[blocks] == default, blocks
    for blocks, (warps, per_warp) in shape.items():
        stage = warps * per_warp
        assert 1 <= warps <= MAX_WARPS and 1 <= per_warp <= 4
        assert (warps, per_warp) == default or (
            stage % blocks == 0 and stage <= plan.WHOLE_TILE_STAGE_MAX
        ), blocks


def test_stream_params_take_the_stage_shape_unless_told() -> None:
    p = plan.stream_params(3072, 1920, 8, swiglu=False, limit=None, ue8m0=True)
    assert (p.warps, p.blocks_per_warp) == (15, 1)
    p = plan.stream_params(3072, 1920, 8, swiglu=False, limit=None, ue8m0=True, stages=3)
    assert (p.warps, p.blocks_per_warp, p.stages) == (15, 1, 3)
    p = plan.stream_params(3072, 1920, 8, swiglu=False, limit=None, ue8m0=True, warps=8)
    assert (p.warps, p.blocks_per_warp) == (8, 2)
    # Where x leaves no room for stages of two blocks per warp, one (variant 38's fallback).
    p = plan.stream_params(5120, 17408, 8, swiglu=False, limit=None, ue8m0=True)
    assert (p.warps, p.blocks_per_warp) == (8, 1)
