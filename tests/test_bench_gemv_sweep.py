"""mlpjit/bench/gemv_sweep.py: the variants and pairs a tuning sweep times, the config labels
(no GPU, no compile)."""

from __future__ import annotations

import dataclasses

import pytest

from mlpjit.bench import gemv_sweep
from mlpjit.kernels.fp8_gemv import tuning


def test_variants_are_valid_capped_and_start_with_default():
    for rows, k, swiglu in gemv_sweep.KERNEL_SHAPES.values():
        for m in (1, 8):
            found = gemv_sweep.variants(rows, k, m, swiglu)
            # k = 12288 leaves room for one warp per K slice only (tiles 1): one pair; k not
            # a multiple of 512 has no whole-K candidates besides the default
            assert (1 if k > 6144 or k % 512 else 2) <= len(found) <= gemv_sweep.MAX_VARIANTS
            default = tuning.choose_config(rows, k, m, swiglu)
            assert found[0] == dataclasses.replace(default, early_launch=False)
            assert not any(c.early_launch for c in found)
            assert len(set(found)) == len(found)
            spread = tuning.spread_config(rows, k, m)
            if spread is not None and spread != found[0]:
                assert found[1] == spread  # the model's pick, measured beside the default
            for c in found[1:]:  # the default may be any measured config (tuning.TUNED_H200)
                if c == spread:
                    continue
                assert c.tiles in gemv_sweep.TILES and c.in_regs in gemv_sweep.IN_REGS
                assert c.slices_per_warp == 1


def test_slices_per_warp_variants_are_added_and_valid():
    base = gemv_sweep.variants(6144, 12288, 1, False)
    wide = gemv_sweep.variants(6144, 12288, 1, False, spws=(2, 3, 5))
    assert wide[: len(base)] == base
    added = wide[len(base) :]
    assert added and {c.slices_per_warp for c in added} == {2, 3}  # 5 does not divide 24
    for c in added:
        assert tuning.config_fits(6144, 12288, 1, c) and c.tiles == 1


def test_pairs_are_plans_defaults_with_every_trigger_combination() -> None:
    hidden, inter = gemv_sweep.LAYER_SHAPES["glm5-tp8"]
    found = gemv_sweep.pairs(hidden, inter, 8)
    assert [(g.early_launch, d.early_launch) for g, d in found] == [
        (False, False),
        (False, True),
        (True, False),
        (True, True),
    ]
    gate_up = tuning.choose_config(2 * inter, hidden, 8, True)
    down = tuning.choose_config(hidden, inter, 8, False)
    for g, d in found:
        assert (g.tiles, g.in_regs, g.ctas_per_sm) == (
            gate_up.tiles,
            gate_up.in_regs,
            gate_up.ctas_per_sm,
        )
        assert (d.tiles, d.in_regs, d.ctas_per_sm) == (down.tiles, down.in_regs, down.ctas_per_sm)
    assert gemv_sweep.label(found[1][1]).endswith("/early") and "/early" not in gemv_sweep.label(
        found[0][1]
    )


def test_extra_down_configs_pair_with_both_triggers() -> None:
    hidden, inter = gemv_sweep.LAYER_SHAPES["glm5-tp8"]
    extra = [
        gemv_sweep.parse_config("t2/r3/c4"),
        gemv_sweep.parse_config("t8/r7/c8"),
    ]  # 2nd cannot fit
    found = gemv_sweep.pairs(hidden, inter, 1, extra)
    assert len(found) == 4 + 2
    assert [(g.early_launch, d) for g, d in found[4:]] == [(False, extra[0]), (True, extra[0])]


@pytest.mark.parametrize("text", ["t4/r3", "x4/r3/c2", "t4/rx/c2", ""])
def test_parse_config_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="t4/r3/c2"):
        gemv_sweep.parse_config(text)


def test_late_steps_parse_label_and_pairs() -> None:
    config = gemv_sweep.parse_config("t1/r3/c2/l2")
    assert config.late_steps == 2 and gemv_sweep.label(config) == "t1/r3/c2/l2"
    with pytest.raises(ValueError):
        gemv_sweep.parse_config("t1/r3/c2/l-1")
    found = gemv_sweep.pairs(6144, 1536, 1, late=(2, 99))
    lates = [(g.late_steps, d.late_steps) for g, d in found if g.late_steps or d.late_steps]
    # GLM-5 TP 8 at 1 token: gate_up keeps 3 steps in registers, 5 staged (99 -> 5); late
    # steps replace its pacing
    assert lates == [(2, 0), (5, 0)]
    assert not any(g.paced for g, d in found if g.late_steps)
    # Several slices per warp take no late steps: DeepSeek-V3 TP 8's gate_up (s2).
    found = gemv_sweep.pairs(7168, 2304, 1, late=(2,))
    assert not any(g.late_steps or d.late_steps for g, d in found)


def test_paced_parse_label_and_pairs() -> None:
    config = gemv_sweep.parse_config("t1/r3/c2/p1")
    assert config.paced == 1 and gemv_sweep.label(config) == "t1/r3/c2/p1"
    with pytest.raises(ValueError):
        gemv_sweep.parse_config("t1/r3/c2/p-1")
    # GLM-4.5 TP 8 at 2 tokens: a one-tile, one-wave gate_up paced by 1 with 6 staged steps
    # (in_regs 2), so a pace of 6 does not fit (at most 5 in flight before the rest) and is
    # left out, and 1 is the default pair's; 0 times it without pacing.
    found = gemv_sweep.pairs(5120, 1536, 2, paced=(0, 1, 5, 6))
    added = found[len(gemv_sweep.pairs(5120, 1536, 2)) :]
    assert [(g.paced, g.late_steps, d.paced) for g, d in added] == [(0, 0, 0), (5, 0, 0)]
    # A persistent gate_up (GLM-5 TP 8 at 8 tokens, one CTA per SM) is timed paced too,
    # instead of its late steps.
    default_g, _ = gemv_sweep.pairs(6144, 1536, 8)[0]
    paced = [g for g, _ in gemv_sweep.pairs(6144, 1536, 8, paced=(1,)) if g.paced]
    assert paced == [dataclasses.replace(default_g, late_steps=0, paced=1)]


def test_paced_zero_and_paced_down_pairs() -> None:
    # GLM-5 TP 8 at 1 token: both picks are paced (the down by PACED); paced=0 times the
    # gate_up without its pacing, paced_down sets the down's alone.
    default_g, default_d = gemv_sweep.pairs(6144, 1536, 1)[0]
    assert default_g.paced and default_d.paced == tuning.PACED == 1
    found = gemv_sweep.pairs(6144, 1536, 1, paced=(0,), paced_down=(0, 1, 2))
    added = found[len(gemv_sweep.pairs(6144, 1536, 1)) :]
    assert [(g.paced, d.paced) for g, d in added] == [(0, 1), (1, 0), (1, 2)]
    # A down with several slices per warp (GLM-5 TP 8 at 2 tokens) is timed paced too; a
    # down with one staged step (hidden 7168 x 256: one 128-K slice, one step in registers)
    # takes no pace.
    _, down = gemv_sweep.pairs(6144, 1536, 2)[0]
    found = gemv_sweep.pairs(6144, 1536, 2, paced_down=(1, 2))
    assert [d for _, d in found if d.paced] == [dataclasses.replace(down, paced=n) for n in (1, 2)]
    assert not any(d.paced for _, d in gemv_sweep.pairs(7168, 256, 1, paced_down=(1, 2)))
    requests = gemv_sweep.layer_requests(["glm5-tp8"], [1], paced_down=(2,))
    assert len(requests) == len(gemv_sweep.layer_requests(["glm5-tp8"], [1])) + 1


def test_spread_picks_are_paced_as_the_planner_would_pace_them() -> None:
    """h3072-i1152 and GLM-5 TP 8 at 1 token: each spread pick the sweep adds is
    tuning.with_pace's form of it, and some of them take a pace."""
    paced = 0
    for hidden, inter in ((3072, 1152), (6144, 1536)):
        found = gemv_sweep.pairs(hidden, inter, 1, spread=3)
        for rows, k, swiglu, half in ((2 * inter, hidden, True, 0), (hidden, inter, False, 1)):
            for config in tuning.spread_configs(rows, k, 1, count=3):
                planned = tuning.with_pace(rows, k, 1, swiglu, config)
                assert any(pair[half] == planned for pair in found)
                paced += planned.paced != config.paced
    assert paced >= 2


def test_paced_regs_pairs() -> None:
    """GLM-5 TP 8 at 2 tokens: each half with 0 or 1 steps in registers, paced by PACED (the
    gate_up a persistent grid, the down 3 slices per warp); the rest of the pair as planned."""
    gate_up, down = gemv_sweep.pairs(6144, 1536, 2)[0]
    found = gemv_sweep.pairs(6144, 1536, 2, paced_regs=(0, 1))
    added = found[len(gemv_sweep.pairs(6144, 1536, 2)) :]
    paced = {"paced": tuning.PACED, "late_steps": 0}
    assert added == [
        (dataclasses.replace(gate_up, in_regs=0, **paced), down),
        (gate_up, dataclasses.replace(down, in_regs=0, **paced)),
        (dataclasses.replace(gate_up, in_regs=1, **paced), down),
        (gate_up, dataclasses.replace(down, in_regs=1, **paced)),
    ]
    # more register steps than a 128-K slice has (2): nothing added
    assert len(gemv_sweep.pairs(7168, 256, 1, paced_regs=(3,))) == len(
        gemv_sweep.pairs(7168, 256, 1)
    )
    requests = gemv_sweep.layer_requests(["glm5-tp8"], [2], paced_regs=(0,))
    assert len(requests) == len(gemv_sweep.layer_requests(["glm5-tp8"], [2])) + 2


def test_parse_config_slices_per_warp() -> None:
    assert gemv_sweep.parse_config("t1/r0/c2/s3").slices_per_warp == 3
    assert gemv_sweep.parse_config("t1/r0/c2").slices_per_warp == 1
    assert gemv_sweep.label(gemv_sweep.parse_config("t1/r0/c2/s3")) == "t1/r0/c2/s3"
    with pytest.raises(ValueError, match="t1/r0/c2/s3"):
        gemv_sweep.parse_config("t1/r0/c2/q3")
    with pytest.raises(ValueError, match="t1/r0/c2/s3"):
        gemv_sweep.parse_config("t1/r0/c2/s3/s2")  # twice
    with pytest.raises(ValueError, match="slices >= 1"):
        gemv_sweep.parse_config("t4/r1/c2/s0")


def test_extra_gate_up_configs_cross_with_every_down() -> None:
    hidden, inter = gemv_sweep.LAYER_SHAPES["glm5-tp8"]
    g2, d2 = gemv_sweep.parse_config("t2/r2/c1"), gemv_sweep.parse_config("t2/r2/c2")
    found = gemv_sweep.pairs(hidden, inter, 1, [d2], [g2])
    assert len(found) == len(set(found))
    crossed = {(g.tiles, g.in_regs, g.ctas_per_sm, g.early_launch, d) for g, d in found}
    for early in (False, True):
        assert (2, 2, 1, early, d2) in crossed
    assert all(not d.early_launch for g, d in found[4:])


def test_parse_config_cluster() -> None:
    both = gemv_sweep.parse_config("t1/r3/c1/s2/n4")
    assert (both.slices_per_warp, both.cluster) == (2, 4)
    alone = gemv_sweep.parse_config("t1/r3/c1/n2")
    assert (alone.slices_per_warp, alone.cluster) == (1, 2)
    assert gemv_sweep.label(both) == "t1/r3/c1/s2/n4" and gemv_sweep.label(alone) == "t1/r3/c1/n2"
    with pytest.raises(ValueError, match="cluster"):
        gemv_sweep.parse_config("t1/r3/c1/n3")
    # optional parts in any order, K slices and splits too
    assert gemv_sweep.parse_config("t1/r3/c1/n2/s2") == both.__class__(
        1, 3, 1, slices_per_warp=2, cluster=2
    )
    split = gemv_sweep.parse_config("t2/r1/c2/x4/k256")
    assert (split.splits, split.slice_k) == (4, 256)
    assert gemv_sweep.label(split) == "t2/r1/c2/k256/x4"


def test_cluster_pairs_set_each_kernel_and_both() -> None:
    """GLM-5 TP8 at 8 tokens: plan's pair uses clusters of 2 (gate_up sending x by
    st.async, with 4 late steps); --clusters 1 adds the unclustered kernels, 4 only where
    the grid allows it (not gate_up's persistent grid)."""
    hidden, inter = gemv_sweep.LAYER_SHAPES["glm5-tp8"]
    found = gemv_sweep.pairs(hidden, inter, 8, clusters=[1, 4])
    assert len(found) == len(set(found))
    labels = {(gemv_sweep.label(g), gemv_sweep.label(d)) for g, d in found}
    assert ("t1/r3/c1/n2/send/l4", "t4/r1/c2/s3") in labels
    assert ("t1/r3/c1/l4", "t4/r1/c2/s3/n2") in labels
    assert ("t1/r3/c1/l4", "t4/r1/c2/s3") in labels
    assert ("t1/r3/c1/n2/send/l4", "t4/r1/c2/s3/n4") in labels
    assert not any(g.cluster == 4 for g, _ in found)


def test_parse_config_send_x() -> None:
    config = gemv_sweep.parse_config("t1/r3/c1/n2/send")
    assert (config.cluster, config.send_x) == (2, True)
    assert gemv_sweep.label(config) == "t1/r3/c1/n2/send"
    assert not gemv_sweep.parse_config("t1/r3/c1/n2").send_x
    with pytest.raises(ValueError, match="needs a cluster"):
        gemv_sweep.parse_config("t1/r3/c1/send")


def test_send_x_pairs_switch_each_clustered_kernel() -> None:
    """--send-x adds the default pair with the x sharing of its clustered gate_up, of its
    clustered down and of both switched (GLM-5 TP 8 at 8 tokens: gate_up sends, down does
    not, as planned); a pair without a cluster gets none."""
    hidden, inter = gemv_sweep.LAYER_SHAPES["glm5-tp8"]
    plain = gemv_sweep.pairs(hidden, inter, 8)
    assert (plain[0][0].send_x, plain[0][1].send_x) == (True, False)
    found = gemv_sweep.pairs(hidden, inter, 8, send_x=True)
    assert found[: len(plain)] == plain
    sends = [(g.send_x, d.send_x) for g, d in found[len(plain) :]]
    assert sends == [(False, False), (True, True), (False, True)]
    assert all(g.cluster == 2 and d.cluster == 2 for g, d in found[len(plain) :])
    assert gemv_sweep.pairs(hidden, inter, 1, send_x=True) == gemv_sweep.pairs(hidden, inter, 1)


def test_layer_shape_takes_presets_and_free_names() -> None:
    assert gemv_sweep.layer_shape("glm5-tp8") == (6144, 1536)
    assert gemv_sweep.layer_shape("h3072-i1152") == (3072, 1152)
    for name in ("h3072-i1100", "glm9-tp8", "h3072"):
        assert gemv_sweep.layer_shape(name) is None
    assert "h2048-i256" in gemv_sweep.GRID_LAYER_NAMES
    assert all(gemv_sweep.layer_shape(n) for n in gemv_sweep.GRID_LAYER_NAMES)
    requests = gemv_sweep.layer_requests(["h3072-i1152"], [1])
    assert {(r.params["rows"], r.params["k"]) for r in requests} == {(2304, 3072), (3072, 1152)}
