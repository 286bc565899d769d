"""fp8_gemv tuning and plan: shape support, default configs in sm_90 limits, compile requests."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mlpjit import layer_plan, models
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv import params as gemv_params
from mlpjit.kernels.fp8_gemv import plan as fp8_plan
from mlpjit.kernels.fp8_gemv import tuning
from mlpjit.kernels.fp8_gemv.params import GemvConfig

ARCH = "sm_90a"


def _all_model_shapes() -> list[tuple[int, int, bool]]:
    """Both launches of every preset's dense and shared-expert shards at TP 1-8 (where the
    shard is a multiple of 128)."""
    shapes = []
    for preset in models.PRESETS.values():
        for inter in preset.layers().values():
            for tp in (1, 2, 4, 8):
                if inter % (tp * 128) == 0:
                    shapes.append((2 * inter // tp, preset.hidden, True))
                    shapes.append((preset.hidden, inter // tp, False))
    return sorted(set(shapes))


def test_plan_imports_no_cutlass() -> None:
    code = "import sys, mlpjit.kernels.fp8_gemv.plan; print('cutlass' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("rows", "k", "tokens", "ok"),
    [
        (3072, 6144, 1, True),
        (6144, 1536, 8, True),
        (6144, 12288, 8, True),
        (6144, 1536, 9, False),  # more tokens than the mma's N
        (4608, 7168, 1, True),
        (7168, 2304, 1, True),  # DeepSeek-V3 TP8 down: k % 512 != 0, a multiple of 128
        (7168, 256, 8, True),  # DeepSeek-V3 TP8 shared expert down
        (512, 7168, 8, True),  # ... and gate_up: 32 row tiles
        (7168, 2240, 1, False),  # k % 128 != 0
        (3080, 6144, 1, False),  # rows % 16 != 0
        (6144, 32768, 1, True),  # K split over clusters of a persistent grid
        (5120, 17408, 1, True),  # Qwen3-14B TP1 down: 17 slices per tile, 5 waves
        (1024, 196608, 1, False),  # more than SPREAD_MAX_WAVES waves
    ],
)
def test_kernel_supports(rows: int, k: int, tokens: int, ok: bool) -> None:
    assert tuning.kernel_supports(rows, k, tokens) is ok


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_kernel_supports_rejects_non_positive_ints(bad) -> None:
    with pytest.raises(ValueError, match=r"^rows must be (an int|in \[1, )"):
        tuning.kernel_supports(bad, 6144, 1)
    with pytest.raises(ValueError, match="tokens"):
        tuning.kernel_supports(3072, 6144, bad)


@pytest.mark.parametrize("shape", _all_model_shapes(), ids=lambda s: f"{s[0]}x{s[1]}-{s[2]}")
@pytest.mark.parametrize("tokens", [1, 4, 8])
def test_choose_config_within_limits(shape, tokens: int) -> None:
    rows, k, swiglu = shape
    cfg = tuning.choose_config(rows, k, tokens, swiglu)
    # GemvParams validates what the kernel can compile; these are the budgets besides.
    p = gemv_params.GemvParams.of(rows, k, tokens, cfg, swiglu=swiglu, limit=None, ue8m0=True)
    assert p.warps <= gemv_params.MAX_WARPS
    assert 0 <= cfg.in_regs < p.steps  # at least one staged step (keeps the PDL overlap)
    assert p.threads * cfg.ctas_per_sm <= hopper.THREADS_PER_SM
    assert p.smem_bytes <= hopper.smem_budget(cfg.ctas_per_sm)
    assert cfg.ctas_per_sm * (p.smem_bytes + hopper.SMEM_CTA_OVERHEAD) <= hopper.SMEM_PER_SM
    # Registers the in-register weights need fit the launch bound.
    budget = hopper.reg_budget(p.threads, cfg.ctas_per_sm)
    assert tuning.BASE_REGS + 8 * cfg.in_regs * cfg.slices_per_warp <= budget
    # A K-split grid is made of whole clusters, in one resident wave but where nothing of
    # one wave fits (Qwen3-14B TP 1 down: 5 waves).
    if cfg.splits > 1:
        assert p.ctas % cfg.splits == 0
        waves = -(-p.ctas // hopper.resident_ctas(hopper.SMS * cfg.ctas_per_sm, cfg.splits))
        assert waves == 1 or (shape == (5120, 17408, False) and waves == 5)
    assert tuning.config_fits(rows, k, tokens, cfg)


def test_choose_config_one_wave_when_possible() -> None:
    # GLM-5 TP8: both kernels fit on the 132 SMs in a single wave of resident CTAs.
    for rows, k in ((3072, 6144), (6144, 1536)):
        for tokens in (1, 8):
            cfg = tuning.choose_config(rows, k, tokens, swiglu=rows == 3072)
            ctas = gemv_params.grid_ctas(
                rows, k, cfg.tiles, cfg.in_regs, cfg.ctas_per_sm, cfg.slices_per_warp
            )
            assert ctas <= hopper.SMS * cfg.ctas_per_sm, (rows, k, tokens, cfg)
            assert ctas >= hopper.SMS // 2  # and spread over the SMs


def test_smem_bytes_matches_design_formula() -> None:
    # warps * (STEPS - in_regs) * 1 KB + max(tokens*k, warps*512) + tokens * k/128 * 4
    assert gemv_params.smem_bytes(6144, 8, 1, 3) == 12 * 5 * 1024 + 8 * 6144 + 8 * 48 * 4
    assert gemv_params.smem_bytes(1536, 1, 2, 8) == 0 + 6 * 512 + 1 * 12 * 4
    # send_x: the scales 16-byte aligned, then the mbarrier counting the bytes the others send
    assert gemv_params.smem_bytes(1536, 1, 2, 8, send_x=True) == 6 * 512 + 48 + 16
    assert gemv_params.smem_bytes(1536, 3, 2, 8, send_x=True) == 3 * 1536 + 144 + 16
    assert tuning.choose_config(6144, 1536, 1, False).in_regs <= gemv_params.STEPS - 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((3072, 6144, 9, True), "cannot take"),
        ((7168, 2240, 1, False), "cannot take"),  # k % 128 != 0
        ((1024, 196608, 8, False), "cannot take"),  # more than SPREAD_MAX_WAVES waves
        ((3072, 6144, 1, "yes"), "swiglu must be a bool"),
    ],
)
def test_choose_config_errors(args, match) -> None:
    with pytest.raises(ValueError, match=match):
        tuning.choose_config(*args)


def test_gemv_request_params() -> None:
    req = fp8_plan.gemv_request(3072, 6144, 4, swiglu=True, limit=7, ue8m0=True, arch=ARCH)
    assert req.kernel == "fp8_gemv" and req.arch == ARCH
    cfg = tuning.choose_config(3072, 6144, 4, True)
    assert not cfg.early_launch
    assert dict(req.params) == {
        "rows": 3072,
        "k": 6144,
        "tokens": 4,
        "tiles": cfg.tiles,
        "in_regs": cfg.in_regs,
        "ctas_per_sm": cfg.ctas_per_sm,
        "swiglu": True,
        "limit": 7.0,
        "ue8m0": True,
    }
    from mlpjit.kernels.fp8_gemv import SPEC

    assert set(SPEC.field_names()) - set(req.params) == {
        "early_launch",
        "slices_per_warp",
        "cluster",
        "slice_k",
        "splits",
        "send_x",
        "late_steps",
        "paced",
        "sms",
        "trace",
    }


def test_early_launch_is_in_the_request_only_when_set() -> None:
    """False is the kernel's default: leaving it out keeps one key per kernel."""
    base = GemvConfig(2, 2, 1)
    early = GemvConfig(2, 2, 1, early_launch=True)
    kwargs = {"swiglu": True, "limit": None, "ue8m0": True, "arch": ARCH}
    plain = fp8_plan.gemv_request(3072, 6144, 8, **kwargs, config=base)
    marked = fp8_plan.gemv_request(3072, 6144, 8, **kwargs, config=early)
    assert "early_launch" not in plain.params and marked.params["early_launch"] is True
    assert {**plain.params, "early_launch": True} == dict(marked.params)
    # The tuned table sets it on gate_up only (after down a server runs no mlpjit kernel).
    tuned = [
        c for entries in tuning.TUNED_H200.values() for _, c in entries if c and c.early_launch
    ]
    assert tuned and all(
        swiglu for (_, _, swiglu), entries in tuning.TUNED_H200.items()
        for _, c in entries if c and c.early_launch
    )  # fmt: skip
    # GLM-4.5 TP8 gate_up (paced by tuning.PACED on top of the table's entry)
    assert tuning.choose_config(3072, 5120, 8, True) == replace(early, paced=tuning.PACED)


def test_gemv_request_limit_only_for_swiglu_and_explicit_config() -> None:
    req = fp8_plan.gemv_request(
        6144, 1536, 2, swiglu=False, limit=7.0, ue8m0=False, arch=ARCH, config=GemvConfig(1, 4, 1)
    )
    assert req.params["limit"] is None
    assert (req.params["tiles"], req.params["in_regs"], req.params["ctas_per_sm"]) == (1, 4, 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"limit": -1.0}, "limit must be"),
        ({"limit": True}, "limit must be"),
        ({"ue8m0": 1}, "ue8m0 must be"),
        ({"arch": 90}, "arch must be"),
        ({"config": (1, 2, 1)}, "config must be"),
    ],
)
def test_gemv_request_errors(kwargs, match) -> None:
    base = {"swiglu": True, "limit": None, "ue8m0": True, "arch": ARCH}
    with pytest.raises(ValueError, match=match):
        fp8_plan.gemv_request(3072, 6144, 1, **{**base, **kwargs})


def test_tuned_table_fits_every_token_count_it_covers(monkeypatch):
    """Each measured entry is a valid config for every token count it is used for (late
    steps and the down projections' pacing, which LATE_STEPS and PACED add on top,
    aside)."""
    monkeypatch.setattr(tuning, "LATE_STEPS", {})
    monkeypatch.setattr(tuning, "PACED", 0)
    for (rows, k, swiglu), entries in tuning.TUNED_H200.items():
        bounds = [bound for bound, _ in entries]
        assert bounds == sorted(bounds) and bounds[-1] == gemv_params.MAX_TOKENS
        for tokens in range(1, gemv_params.MAX_TOKENS + 1):
            config = tuning.choose_config(rows, k, tokens, swiglu)
            expected = next(c for bound, c in entries if tokens <= bound)
            if expected is None:  # the planner's own pick
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(tuning, "TUNED_H200", {})
                    expected = tuning.choose_config(rows, k, tokens, swiglu)
            assert config == expected, (rows, k, swiglu, tokens)


@pytest.mark.parametrize(
    ("rows", "k", "tokens", "swiglu", "paced"),
    [
        (6144, 1536, 1, False, True),  # GLM-5 TP 8 down: the table's 4-tile pick
        (6144, 1536, 2, False, False),  # ... 3 slices per warp: not PACE_SLICES_PER_WARP
        (5120, 3072, 8, False, True),  # GLM-4.5 TP 4 down: the heuristics' pick, clustered
        (7168, 256, 1, False, False),  # one 128-K slice: nothing staged to pace
        (2304, 3072, 1, True, True),  # h3072-i1152 gate_up: a K split of the heuristics
        (3072, 5120, 8, True, True),  # GLM-4.5 TP 8 gate_up: the table's, PDL trigger early
        (3072, 6144, 4, True, False),  # GLM-5 TP 8 gate_up: a persistent grid
        (512, 6144, 8, True, False),  # LATE_STEPS' pick: its late steps, no pace
        (2048, 6144, 1, True, False),  # UNPACED_GATE_UPS: measured slower paced
        (2048, 6144, 2, True, True),  # ... at 1 token only
    ],
)
def test_picks_are_paced_where_they_take_it(
    rows: int, k: int, tokens: int, swiglu: bool, paced: bool
) -> None:
    config = tuning.choose_config(rows, k, tokens, swiglu)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tuning, "PACED", 0)
        unpaced = tuning.choose_config(rows, k, tokens, swiglu)
    assert config == (replace(unpaced, paced=tuning.PACED) if paced else unpaced)
    assert not unpaced.paced and tuning.config_fits(rows, k, tokens, config)


@settings(max_examples=60, deadline=None)
@given(
    rows_blocks=st.integers(1, 96),
    k_blocks=st.integers(1, 96),
    tokens=st.integers(1, gemv_params.MAX_TOKENS),
    swiglu=st.booleans(),
    sms=st.sampled_from((132, 114, 78)),
)
@example(rows_blocks=24, k_blocks=48, tokens=1, swiglu=True, sms=132)  # a paced table entry
@example(rows_blocks=48, k_blocks=12, tokens=1, swiglu=False, sms=132)  # a down the rule paces
@example(rows_blocks=16, k_blocks=48, tokens=1, swiglu=True, sms=132)  # UNPACED_GATE_UPS
def test_the_pace_is_added_exactly_where_the_unpaced_pick_takes_it(
    rows_blocks: int, k_blocks: int, tokens: int, swiglu: bool, sms: int
) -> None:
    """Whatever the shape: PACED only adds a pace, to a pick without late steps that can
    take it (one that GemvParams accepts and fits the GPU), and nowhere else."""
    rows, k = 128 * rows_blocks, 128 * k_blocks
    if not tuning.kernel_supports(rows, k, tokens, sms):
        return
    try:
        config = tuning.choose_config(rows, k, tokens, swiglu, sms)
    except ValueError:
        return  # no decomposition fits: the stock path, with or without the rule
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tuning, "PACED", 0)
        unpaced = tuning.choose_config(rows, k, tokens, swiglu, sms)
    if unpaced.paced:  # a table entry's own pace
        assert config == unpaced
        return
    assert replace(config, paced=0) == unpaced
    paced = replace(unpaced, paced=tuning.PACED)
    exception = swiglu and tokens in tuning.UNPACED_GATE_UPS.get((rows, k), ())
    takes_it = not unpaced.late_steps and tuning.config_fits(rows, k, tokens, paced, sms)
    launch = gemv_params.GemvParams.of(
        rows, k, tokens, unpaced, swiglu=False, limit=None, ue8m0=False, sms=sms
    )
    exception = (
        exception
        or (launch.persistent and not tuning.PACE_PERSISTENT)
        or (launch.spw > 1 and not tuning.PACE_SLICES_PER_WARP)
    )
    assert config.paced == (tuning.PACED if takes_it and not exception else 0)


@pytest.mark.parametrize("tokens", [2, 4, 5, 6, 7])
def test_persistent_picks_take_a_pace_once_the_rule_reaches_them(monkeypatch, tokens) -> None:
    """GLM-5 TP 8's gate_up at 2-7 tokens is a persistent grid of one slice per warp: the
    kernel takes a pace there, and PACE_PERSISTENT decides whether the planner adds it."""
    unpaced = tuning.choose_config(3072, 6144, tokens, True)
    assert not unpaced.paced and not unpaced.late_steps
    launch = gemv_params.GemvParams.of(
        3072, 6144, tokens, unpaced, swiglu=True, limit=None, ue8m0=False
    )
    assert launch.persistent and launch.ctas < launch.row_tiles
    monkeypatch.setattr(tuning, "PACE_PERSISTENT", True)
    paced = tuning.choose_config(3072, 6144, tokens, True)
    assert paced == replace(unpaced, paced=tuning.PACED)
    assert tuning.config_fits(3072, 6144, tokens, paced)


@pytest.mark.parametrize(
    ("rows", "k", "tokens", "swiglu"),
    [
        (6144, 1536, 2, False),  # GLM-5 TP 8 down: one wave of 3 slices per warp
        (5120, 1536, 8, False),  # GLM-4.5 TP 8 down: the same at 8 tokens
        (24576, 6144, 2, True),  # GLM-5 TP 1 gate_up: a persistent grid of 3 slices per warp
    ],
)
def test_picks_of_several_slices_per_warp_take_a_pace_once_the_rule_reaches_them(
    monkeypatch, rows: int, k: int, tokens: int, swiglu: bool
) -> None:
    unpaced = tuning.choose_config(rows, k, tokens, swiglu)
    assert unpaced.slices_per_warp > 1 and not unpaced.paced
    monkeypatch.setattr(tuning, "PACE_SLICES_PER_WARP", True)
    monkeypatch.setattr(tuning, "PACE_PERSISTENT", True)
    paced = tuning.choose_config(rows, k, tokens, swiglu)
    assert paced == replace(unpaced, paced=tuning.PACED)
    assert tuning.config_fits(rows, k, tokens, paced)


def test_with_pace_leaves_paced_late_and_switched_off_forms_alone() -> None:
    one_wave = GemvConfig(1, 3, 2)  # GLM-5 TP 8 gate_up at 1 token: one wave, one slice
    assert tuning.with_pace(3072, 6144, 1, True, one_wave) == replace(one_wave, paced=tuning.PACED)
    for config in (replace(one_wave, paced=2), replace(one_wave, late_steps=2)):
        assert tuning.with_pace(3072, 6144, 1, True, config) == config
    persistent = GemvConfig(1, 3, 1)  # 192 tiles on 132 CTAs
    assert tuning.with_pace(3072, 6144, 2, True, persistent) == persistent


def test_unpaced_gate_ups_are_picks_the_rule_would_pace() -> None:
    """Each exception names a gate_up and token count the rule would otherwise change."""
    for (rows, k), counts in tuning.UNPACED_GATE_UPS.items():
        for tokens in counts:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(tuning, "UNPACED_GATE_UPS", {})
                assert tuning.choose_config(rows, k, tokens, True).paced == tuning.PACED
            assert tuning.choose_config(rows, k, tokens, True).paced == 0


# Late steps measured on the planner's picks (variant 60 on the H100): (rows, k) of the
# gate_up -> the token counts they cover.
PLANNER_PICKS_WITH_LATE_STEPS = {
    (1024, 7168): (1, 4, 8),
    (2048, 7168): (4, 8),
    (512, 6144): (4, 8),
    (2048, 6144): (4, 8),
    (768, 5120): (2, 4, 8),
    (1536, 5120): (1, 2, 4, 8),
    (3072, 4096): (2, 4),
}


@pytest.mark.parametrize("shape", PLANNER_PICKS_WITH_LATE_STEPS)
def test_late_steps_entries_are_the_planner_picks_that_were_measured(shape) -> None:
    """LATE_STEPS changes the planner's own pick only by its late steps, at the token counts
    measured and only there (every pick it names still takes them: one slice per warp and
    enough staged steps); every other count without a TUNED_H200 pick of its own is the
    planner's pick unchanged."""
    rows, k = shape
    for tokens in range(1, gemv_params.MAX_TOKENS + 1):
        config = tuning.choose_config(rows, k, tokens, True)
        if tuning.tuned(rows, k, tokens, True) is not None:
            assert tokens not in PLANNER_PICKS_WITH_LATE_STEPS[shape]
            continue
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tuning, "TUNED_H200", {})
            patch.setattr(tuning, "LATE_STEPS", {})
            patch.setattr(tuning, "PACED", 0)
            planned = tuning.choose_config(rows, k, tokens, True)
        assert replace(config, late_steps=0, paced=0) == planned, (shape, tokens)
        assert (config.late_steps > 0) == (tokens in PLANNER_PICKS_WITH_LATE_STEPS[shape])


def test_heuristic_keeps_few_steps_in_registers():
    # a shape outside the table (GLM-5 TP 16 would not fit 512; take hidden 4096, inter 2048)
    for tokens in (1, 8):
        config = tuning.choose_config(4096, 2048, tokens, False)
        assert (4096, 2048, False) not in tuning.TUNED_H200
        assert config.in_regs <= tuning.HEURISTIC_MAX_IN_REGS


def test_wide_persistent_heuristic_follows_the_measured_picks(monkeypatch) -> None:
    """Untuned shapes with two or more waves of row tiles and large k get a persistent grid
    with several slices per warp, as measured best for GLM-5 TP1/TP2/TP4 (variant 12)."""
    monkeypatch.setattr(tuning, "TUNED_H200", {})
    # GLM-5 TP1 gate_up: 2 CTAs per SM at 1-2 tokens, one when x no longer fits beside them.
    assert tuning.choose_config(24576, 6144, 1, True) == GemvConfig(1, 0, 2, slices_per_warp=3)
    # From 5 tokens on in clusters of 2 (HEURISTIC_CLUSTER_MIN_TOKENS).
    assert tuning.choose_config(24576, 6144, 8, True) == GemvConfig(
        1, 0, 1, slices_per_warp=2, cluster=2
    )
    # GLM-5 TP1 down at 8 tokens: register steps where shared memory runs out, 3 slices per
    # warp there (2 spilled with ptxas 13.0).
    assert tuning.choose_config(6144, 12288, 8, False) == GemvConfig(
        1, 3, 1, slices_per_warp=3, cluster=2
    )
    # Fewer than two waves of row tiles load some SMs twice as much as others with one CTA
    # per tile (GLM-5 TP8 gate_up: 192 row tiles on 132 SMs): the tiles are split along K
    # over one wave instead.
    spread = tuning.choose_config(3072, 6144, 1, True)
    assert spread.splits > 1
    p = gemv_params.GemvParams.of(3072, 6144, 1, spread, swiglu=True, limit=None, ue8m0=True)
    assert hopper.SMS * 0.9 <= p.ctas <= hopper.SMS * spread.ctas_per_sm
    for rows, k, m in ((24576, 5120, 1), (12288, 5120, 5), (24576, 5120, 8)):
        config = tuning.choose_config(rows, k, m, rows > k)
        spw = config.slices_per_warp
        assert spw > 1 and (k // gemv_params.SLICE) % spw == 0
        grid = gemv_params.grid_ctas(rows, k, 1, config.in_regs, config.ctas_per_sm, spw)
        assert grid == hopper.SMS * config.ctas_per_sm < rows // 16  # persistent


def test_glm45_tp4_gate_up_keeps_the_measured_one_token_pick() -> None:
    """The wide heuristic lost there (pair_sweep_heuristic_glm45_h200.txt); 2+ tokens use it.
    Its last 3 staged steps are requested after x (late_steps_sweep_wide_h100*.json)."""
    assert tuning.choose_config(6144, 5120, 1, True) == GemvConfig(2, 3, 1, late_steps=3)
    assert tuning.choose_config(6144, 5120, 2, True).slices_per_warp == 2


def test_cluster_is_in_the_request_only_when_set() -> None:
    """cluster=1 (no cluster) is the kernel's default: one key for the plain kernel."""
    kwargs = {"swiglu": True, "limit": None, "ue8m0": True, "arch": ARCH}
    plain = fp8_plan.gemv_request(3072, 6144, 8, **kwargs, config=GemvConfig(1, 3, 1))
    clustered = fp8_plan.gemv_request(
        3072, 6144, 8, **kwargs, config=GemvConfig(1, 3, 1, cluster=2)
    )
    assert "cluster" not in plain.params and clustered.params["cluster"] == 2
    assert {**plain.params, "cluster": 2} == dict(clustered.params)


def test_fits_checks_cluster_sizes_and_residency() -> None:
    # GLM-5 TP8 gate_up at 8 tokens: a persistent grid of 132 CTAs (one per SM).
    persistent = GemvConfig(1, 3, 1)
    assert gemv_params.grid_ctas(3072, 6144, 1, 3, 1) == hopper.SMS < 3072 // 16
    assert tuning.config_fits(3072, 6144, 8, replace(persistent, cluster=2))
    # Clusters of 4 would not all be resident at once (30 x 4 CTAs on the H200), nor in a
    # one-wave grid of 132 CTAs that is not persistent (2112 rows: 132 tiles).
    assert not tuning.config_fits(3072, 6144, 8, replace(persistent, cluster=4))
    assert gemv_params.grid_ctas(2112, 6144, 1, 3, 1) == hopper.SMS
    assert not tuning.config_fits(2112, 6144, 1, GemvConfig(1, 3, 1, cluster=4))
    assert tuning.config_fits(2112, 6144, 1, GemvConfig(1, 3, 1, cluster=2))
    for bad in (3, 2.0, True):
        assert not tuning.config_fits(3072, 6144, 8, replace(persistent, cluster=bad))
    # One CTA per row tile (192 CTAs at 2 per SM): any size dividing the grid, none that
    # does not (rows 6160: 385 tiles).
    one_per_tile = GemvConfig(1, 3, 2, cluster=8)
    assert tuning.config_fits(3072, 6144, 1, one_per_tile)
    assert not tuning.config_fits(6160, 6144, 1, replace(one_per_tile, cluster=2))


def test_tuned_clusters_only_where_the_pair_sweep_measured_them() -> None:
    """Clusters of 2 from 3 tokens on at GLM-5 TP8/TP4/TP1 (variant 14); never at 1-2
    tokens, where the shared quantization saves less than the cluster barriers cost."""
    for rows, k, swiglu in tuning.TUNED_H200:
        for tokens in range(1, gemv_params.MAX_TOKENS + 1):
            config = tuning.choose_config(rows, k, tokens, swiglu)
            assert config.cluster in (1, 2)
            if tokens <= 2:
                assert config.cluster == 1, (rows, k, tokens)
    assert tuning.choose_config(3072, 6144, 8, True).cluster == 2
    assert tuning.choose_config(6144, 1536, 8, False).cluster == 2


def test_heuristic_clusters_from_five_tokens_where_the_grid_allows() -> None:
    """Untuned shapes: clusters of 2 from HEURISTIC_CLUSTER_MIN_TOKENS tokens on (GLM-4.5
    TP1/TP2/TP4 measured 0.4-2.3 us faster per layer at 8 tokens), never below, never where
    the grid is odd."""
    for rows, k, swiglu in ((24576, 5120, True), (12288, 5120, True)):
        assert (rows, k, swiglu) not in tuning.TUNED_H200
        for tokens in range(1, gemv_params.MAX_TOKENS + 1):
            config = tuning.choose_config(rows, k, tokens, swiglu)
            want = 2 if tokens >= tuning.HEURISTIC_CLUSTER_MIN_TOKENS else 1
            assert config.cluster == want, (rows, k, tokens, config)
            assert tuning.config_fits(rows, k, tokens, config)
    # 9 row tiles of 16 (one CTA each): an odd grid stays unclustered.
    assert tuning.choose_config(144, 4096, 8, False).cluster == 1


def test_register_budget_follows_the_scheduler_split() -> None:
    """The register file is split over 4 schedulers: 14 warps per SM (k 7168, 448 threads)
    get 128 registers under the launch bound (ptxas 13.0), too few for the persistent form
    (which then spilled), so that grid stays one CTA per row tile."""
    assert hopper.reg_budget(448, 1) == 128
    assert hopper.reg_budget(384, 1) == 168 and hopper.reg_budget(768, 1) == 80
    assert hopper.reg_budget(448, 2) == 72 and hopper.reg_budget(256, 1) == 255
    assert gemv_params.grid_ctas(4096, 7168, 1, 3, 1) == 4096 // 16


def test_sms_sizes_the_persistent_grids() -> None:
    """A GPU with fewer SMs (H20: 78) gets persistent grids of 78 * ctas_per_sm CTAs and the
    heuristic instead of the 132-SM table; 132 keeps the table and the key."""
    h20 = 78
    for tokens in (1, 8):
        for rows, k, swiglu in ((24576, 6144, True), (6144, 12288, False)):  # GLM-5 TP1
            config = tuning.choose_config(rows, k, tokens, swiglu, sms=h20)
            assert tuning.config_fits(rows, k, tokens, config, sms=h20)
            grid = gemv_params.grid_ctas(rows, k, config.tiles, config.in_regs, config.ctas_per_sm,
                                  config.slices_per_warp, sms=h20)  # fmt: skip
            assert grid <= h20 * config.ctas_per_sm < rows // (16 * config.tiles)
    tuned = tuning.choose_config(3072, 6144, 1, True)
    assert tuning.choose_config(3072, 6144, 1, True, sms=hopper.SMS) == tuned
    kwargs = {"swiglu": True, "limit": None, "ue8m0": True, "arch": ARCH}
    assert "sms" not in fp8_plan.gemv_request(3072, 6144, 1, **kwargs).params
    assert fp8_plan.gemv_request(3072, 6144, 1, **kwargs, sms=h20).params["sms"] == h20
    requests = layer_plan.dense_mlp_requests(6144, 12288, 8, [1, 8], ARCH, sms=114)
    assert len(requests) == 4 and all(r.params["sms"] == 114 for r in requests)


@pytest.mark.parametrize("bad", [0, -1, 1025, 1.5, True, "78"])
def test_bad_sms(bad) -> None:
    with pytest.raises(ValueError, match="sms must be an int"):
        tuning.choose_config(3072, 6144, 1, True, sms=bad)
    with pytest.raises(ValueError, match="sms must be an int"):
        layer_plan.dense_mlp_requests(6144, 12288, 8, [1], ARCH, sms=bad)


def test_params_default_sms_is_the_tuned_tables() -> None:
    """The key drops sms at the params' default, which must be the SM count the planner's
    defaults and tuned table are for."""
    import dataclasses

    from mlpjit.kernels.fp8_gemv.params import GemvParams

    defaults = {f.name: f.default for f in dataclasses.fields(GemvParams)}
    assert defaults["sms"] == hopper.SMS


def _family_shards() -> list[tuple[str, int, int]]:
    """(name, hidden, intermediate per shard) of every DeepSeek-family layer the kernels
    are for: GLM-5, DeepSeek-V3 / Kimi-K2 and Qwen3 at TP 1/2/4/8 (dense and shared
    expert), GLM-4.5 dense at TP 1-8 where TP divides it, its shared expert at TP 1/2/4."""
    shards = []
    for name, preset in models.PRESETS.items():
        for layer, inter in preset.layers().items():
            tps = (1, 2, 3, 4, 6, 8) if (name, layer) == ("glm4.5", "dense") else (1, 2, 4, 8)
            for tp in tps:
                if (name, layer) == ("glm4.5", "shared") and tp == 8:
                    continue  # 192 per shard: not a multiple of the 128-wide weight blocks
                shards.append((f"{name}-{layer}-tp{tp}", preset.hidden, inter // tp))
    return shards


@pytest.mark.parametrize("shard", _family_shards(), ids=lambda s: s[0])
def test_family_layers_take_the_kernels(shard) -> None:
    """Every token count 1-8 of every family layer runs on the kernels (Qwen3-14B's TP-1
    down projection, k 17408 = 17 x 1024, in 5 waves: 17 slices per row tile, in 17 warps
    or in one, need more registers than a persistent grid leaves)."""
    from mlpjit.dense_mlp import kernel_supported

    _, hidden, inter = shard
    for m in range(1, 9):
        assert kernel_supported(hidden, inter, m), m


def test_k_split_geometry() -> None:
    """A K split's CTA covers k/splits: its slices, x scales and shared memory follow; the
    grid is one CTA per (row tile, split) in clusters of the splits, or a persistent grid of
    whole clusters."""
    p = gemv_params.GemvParams(
        rows=512, k=7168, tokens=3, tiles=1, in_regs=1, ctas_per_sm=2, swiglu=True,
        limit=None, ue8m0=True, slice_k=256, splits=4,
    )  # fmt: skip
    assert (p.kc, p.slices, p.steps, p.slice_groups, p.cta_groups) == (1792, 7, 4, 2, 14)
    assert (p.ctas, p.cluster_ctas, p.persistent, p.threads) == (128, 4, False, 7 * 32)
    # staged weights | x [3, 1792] | x scales [3, 14] (16-byte aligned) | 3 other splits' sums
    staged = 7 * (4 - 1) * 1024
    assert p.smem_reduce_offset == staged + 3 * 1792 + 176
    # the other three splits' partials, then the mbarrier that counts them
    assert p.smem_mbarrier == p.smem_reduce_offset + 3 * 512
    assert p.smem_bytes == p.smem_mbarrier + 16
    # persistent: DeepSeek-V3 TP 1 down split in two, 66 clusters take 448 row tiles in turn
    q = gemv_params.GemvParams(
        rows=7168, k=18432, tokens=1, tiles=1, in_regs=1, ctas_per_sm=1, swiglu=False,
        limit=None, ue8m0=True, slice_k=128, splits=2, slices_per_warp=9,
    )  # fmt: skip
    assert (q.ctas, q.persistent, q.row_tiles) == (132, True, 448)
    # clusters of 4 or 8 fill only 10/11 of the slots: a persistent grid is resident
    r = gemv_params.GemvParams(
        rows=7168, k=18432, tokens=1, tiles=1, in_regs=1, ctas_per_sm=1, swiglu=False,
        limit=None, ue8m0=True, slice_k=128, splits=4, slices_per_warp=9,
    )  # fmt: skip
    assert r.ctas == hopper.resident_ctas(hopper.SMS, 4) == 120


def test_slice_and_split_are_in_the_cache_key() -> None:
    """slice_k and splits change the compiled code: each value is its own key (defaults
    left out of the request, as for every parameter)."""
    from mlpjit.jit.key import request_key

    kwargs = {"swiglu": False, "limit": None, "ue8m0": True, "arch": ARCH}
    base = GemvConfig(4, 3, 1, slices_per_warp=3, slice_k=256)  # DeepSeek-V3 TP 8 down
    configs = [
        base,
        replace(base, in_regs=1, slices_per_warp=6, slice_k=128),
        replace(base, splits=3, slices_per_warp=1),
    ]
    requests = [fp8_plan.gemv_request(7168, 2304, 1, **kwargs, config=c) for c in configs]
    assert "splits" not in requests[0].params and requests[2].params["splits"] == 3
    assert requests[0].params["slice_k"] == 256 and requests[1].params["slice_k"] == 128
    assert len({request_key(r) for r in requests}) == 3


def test_trace_builds_are_their_own_key_and_stamp_after_the_output() -> None:
    """A trace build is a request of its own (the default one leaves trace out), and its
    stamps sit after the output, 16-byte aligned, TRACE_POINTS 8-byte slots per CTA."""
    from mlpjit.jit.key import request_key
    from mlpjit.kernels.fp8_gemv.params import TRACE_POINTS, GemvParams

    kwargs = {"swiglu": True, "limit": None, "ue8m0": True, "arch": ARCH}
    plain = fp8_plan.gemv_request(3072, 6144, 3, **kwargs)
    traced = fp8_plan.gemv_request(3072, 6144, 3, **kwargs, trace=True)
    assert "trace" not in plain.params and traced.params["trace"] is True
    assert request_key(plain) != request_key(traced)
    p = GemvParams(**{**plain.params, "trace": True})
    assert p.trace_offset == 3 * 3072  # 3 tokens x 1536 act columns x 2 bytes
    assert p.out_bytes == p.trace_offset + p.ctas * TRACE_POINTS * 8
    odd = GemvParams(**{**plain.params, "tokens": 1, "rows": 16 * 3, "trace": True})
    assert odd.trace_offset == 48 and odd.trace_offset >= 24 * 2  # 24 act columns, aligned
    assert GemvParams(**plain.params).out_bytes == p.trace_offset  # no stamps by default
    with pytest.raises(ValueError, match="trace"):
        GemvParams(**{**plain.params, "trace": 1})


def test_support_follows_the_sm_count() -> None:
    """Whether a shape takes the kernels depends on the GPU: Qwen3-14B TP 1 down needs 5
    waves on 132 SMs, more than SPREAD_MAX_WAVES on an H20's 78, so there it runs the stock
    path, and planning a layer for 78 SMs skips it instead of failing."""
    from mlpjit.dense_mlp import kernel_supported

    assert kernel_supported(5120, 17408, 1) and kernel_supported(5120, 17408, 1, sms=114)
    assert not kernel_supported(5120, 17408, 1, sms=78)
    assert layer_plan.dense_mlp_requests(5120, 17408, 1, [1, 8], ARCH, sms=78) == []
    assert len(layer_plan.dense_mlp_requests(5120, 17408, 1, [1, 8], ARCH, sms=114)) == 4
    with pytest.raises(ValueError, match="fp8_gemv cannot take"):
        tuning.choose_config(5120, 17408, 1, False, sms=78)


def test_largest_sizes_plan_quickly() -> None:
    hidden, inter = gemv_params.MAX_HIDDEN, gemv_params.MAX_INTERMEDIATE
    layer_plan.dense_mlp_requests(hidden, inter, 1, range(1, 9), ARCH)  # stock path: none fit
    with pytest.raises(ValueError, match=r"^rows must be in \[1, 2097152\]"):
        tuning.kernel_supports(gemv_params.MAX_ROWS + 16, 1024, 1)
    with pytest.raises(ValueError, match=r"^k must be in \[128, 1048576\]"):
        gemv_params.GemvParams(16, gemv_params.MAX_K + 128, 1, 1, 0, 1, False, None, False)


def test_modeled_us_follows_the_terms_it_names() -> None:
    whole = GemvConfig(tiles=4, in_regs=1, ctas_per_sm=1, slices_per_warp=3, slice_k=128)
    waves, us = tuning.modeled_us(7168, 1152, 1, whole)
    p = gemv_params.GemvParams.of(7168, 1152, 1, whole, swiglu=False, limit=None, ue8m0=True)
    assert waves == 1 and not p.persistent
    rounds = -(-p.ctas // p.sms) * -(-p.row_tiles // p.ctas)
    kb = rounds * 16 * p.tiles * p.kc / 1e3
    assert us == pytest.approx(kb / tuning.HBM_KB_PER_US + tuning.ROUND_US * rounds)
    split = GemvConfig(tiles=4, in_regs=1, ctas_per_sm=1, slice_k=128, splits=3)
    s = gemv_params.GemvParams.of(7168, 1152, 1, split, swiglu=False, limit=None, ue8m0=True)
    s_rounds = -(-s.ctas // s.sms) * -(-s.row_tiles * 3 // s.ctas)
    s_kb = s_rounds * 16 * s.tiles * s.kc / 1e3
    expected = (
        s_kb / tuning.HBM_KB_PER_US
        + tuning.ROUND_US * s_rounds
        + 2 * tuning.SPLIT_US
        + tuning.PERSISTENT_US * s.persistent
    )
    assert tuning.modeled_us(7168, 1152, 1, split)[1] == pytest.approx(expected)


@pytest.mark.parametrize("tokens", [1, 4, 8])
@pytest.mark.parametrize(("rows", "k"), [(7168, 1152), (6144, 1152), (2304, 6144), (3072, 2816)])
def test_spread_picks_are_the_fastest_modeled_and_never_split_persistent(rows, k, tokens) -> None:
    """The off-table shapes where the model's pick won most on the H200 (variant 29)."""
    pick = tuning._spread_pick(rows, k, tokens, hopper.SMS)
    launch = gemv_params.GemvParams.of(rows, k, tokens, pick, swiglu=False, limit=None, ue8m0=True)
    assert not (launch.persistent and pick.splits > 1)
    assert tuning.config_fits(rows, k, tokens, pick)
    best = tuning.modeled_us(rows, k, tokens, pick)
    for _, other in tuning._spread_ranked(rows, k, tokens, hopper.SMS):
        other_launch = tuning._launch(rows, k, tokens, other, hopper.SMS)
        if other.splits == 1 or not other_launch.persistent:
            assert best <= tuning.modeled_us(rows, k, tokens, other)


def test_small_kernels_at_many_tokens_keep_the_cost_models_rank() -> None:
    rows, k = 512, 6144  # a TP-8 shared expert's gate_up: 3 MB
    assert rows * k < tuning.RERANK_MIN_BYTES
    ranked = tuning._spread_ranked(rows, k, 8, hopper.SMS)
    assert tuning._spread_pick(rows, k, 8, hopper.SMS) == ranked[0][1]
    assert tuning._spread_pick(rows, k, 1, hopper.SMS) == min(
        (config for _, config in ranked),
        key=lambda c: tuning.modeled_us(rows, k, 1, c),
    )


def test_k1152_down_projections_are_one_wave_of_several_tiles() -> None:
    """A 9-block K: one-slice warps in a persistent grid lost 2-3 us per layer on the H200
    to one wave of multi-tile CTAs (variant 29)."""
    for rows in (6144, 7168, 8192):
        for tokens in (1, 8):
            pick = tuning.choose_config(rows, 1152, tokens, swiglu=False)
            launch = tuning._launch(rows, 1152, tokens, pick, hopper.SMS)
            assert pick.tiles > 1 and not launch.persistent, (rows, tokens, pick)


@pytest.mark.parametrize(("rows", "k"), [(512, 6144), (6144, 256), (7168, 1152), (4096, 7168)])
def test_spread_search_ranks_each_token_count_as_alone(rows, k) -> None:
    """_spread_search finds every token count's decompositions in one pass (shared memory
    checked once, as a prefix of the counts): the same ranks as each count searched alone."""
    table = tuning._spread_search(rows, k, hopper.SMS, tuning._TABLE_COUNTS, False)
    for at, tokens in enumerate(tuning._TABLE_COUNTS):
        alone = tuning._spread_search(rows, k, hopper.SMS, (tokens,), False)
        assert table.ranked(at) == alone.ranked(0), tokens


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _reference_spread_ranked(rows: int, k: int, tokens: int, sms: int) -> list[tuple]:
    """_spread_ranked the straightforward way (as the planner searched before its bounded
    search): every decomposition of one wave (or, where none fits, of several) with the
    first register step count tried that fits, ranked by the cost model, sorted."""
    for max_waves in (1, tuning.SPREAD_MAX_WAVES):
        found = []
        for splits in _divisors(k // gemv_params.GROUP, gemv_params.SPLITS_MAX):
            kc = k // splits
            for slice_k in gemv_params.SLICE_SIZES:
                if kc % slice_k:
                    continue
                slices, steps = kc // slice_k, slice_k // gemv_params.STEP
                geometry = {"slice_k": slice_k, "splits": splits}
                for tiles in _divisors(rows // 16, gemv_params.MAX_WARPS):
                    for spw in _divisors(slices, slices):
                        warps = tiles * slices // spw
                        if warps > gemv_params.MAX_WARPS:
                            continue
                        threads = gemv_params.cta_threads(k, tiles, spw, **geometry)
                        for cps in range(1, tuning.SPREAD_MAX_CTAS_PER_SM + 1):
                            fit = tuning._register_steps(threads, cps, spw, slice_k)
                            slots = hopper.resident_ctas(sms * cps, splits)
                            if fit is None or slots == 0:
                                continue
                            regs = hopper.reg_budget(threads, cps)
                            ctas = gemv_params.grid_ctas(
                                rows, k, tiles, fit, cps, spw, sms, **geometry
                            )
                            persistent = gemv_params.is_persistent(rows, tiles, splits, ctas)
                            waves = -(-ctas // slots)
                            if (persistent and tiles > 1) or (not persistent and waves > max_waves):
                                continue
                            cap = min(fit, tuning.HEURISTIC_MAX_IN_REGS)
                            for in_regs in (*range(cap, -1, -1), *range(cap + 1, fit + 1)):
                                needs = tuning._spread_regs(
                                    spw, in_regs, slice_k, splits > 1, persistent
                                )
                                smem = gemv_params.smem_bytes(
                                    k, tokens, tiles, in_regs, spw, **geometry
                                )
                                if (
                                    spw * (steps - in_regs) <= gemv_params.MAX_PENDING_GROUPS
                                    and needs <= regs
                                    and smem <= hopper.smem_budget(cps)
                                ):
                                    quant = (
                                        tuning.X_COST
                                        * tokens
                                        * kc
                                        * 2
                                        * max(1.0, tuning.QUANT_WARPS / warps)
                                    )
                                    split = (
                                        tuning.SPLIT_COST + tuning.SPLIT_STEP * (splits - 2)
                                        if splits > 1
                                        else 0
                                    )
                                    rounds = -(-(rows // (16 * tiles) * splits) // ctas)
                                    cost = -(-ctas // sms) * (
                                        rounds * (16 * tiles * kc + split) + quant
                                    )
                                    rank = (waves, cost, splits, -slice_k, warps, cps, ctas)
                                    config = GemvConfig(
                                        tiles, in_regs, cps, slices_per_warp=spw, **geometry
                                    )
                                    found.append((rank, config))
                                    break
        if found:
            return sorted(found, key=lambda item: item[0])
    return []


def _reference_spread_pick(rows: int, k: int, tokens: int, sms: int) -> GemvConfig:
    """_spread_pick over the whole reference list: the first of those modeled_us rates
    fastest (K splits in persistent grids left out), or the first."""
    ranked = _reference_spread_ranked(rows, k, tokens, sms)
    if rows * k < tuning.RERANK_MIN_BYTES and tokens >= tuning.HEURISTIC_CLUSTER_MIN_TOKENS:
        return ranked[0][1]
    rated = [
        (tuning.modeled_us(rows, k, tokens, config, sms), order, config)
        for order, (rank, config) in enumerate(ranked)
        if config.splits == 1
        or not gemv_params.is_persistent(rows, config.tiles, config.splits, rank[-1])
    ]
    return min(rated)[2] if rated else ranked[0][1]


def _reference_supports(rows: int, k: int, tokens: int, sms: int) -> bool:
    if tokens > gemv_params.MAX_TOKENS or k % gemv_params.GROUP or rows % 16:
        return False
    slices = k // gemv_params.SLICE
    if k % gemv_params.SLICE == 0 and any(
        tuning.max_in_regs(k, tokens, tiles, cps) is not None
        for tiles in (1, 2, 4, 8, 16, 32)
        if tiles * slices <= gemv_params.MAX_WARPS and rows % (16 * tiles) == 0
        for cps in range(1, 9)
    ):
        return True
    return bool(_reference_spread_ranked(rows, k, tokens, sms))


def _spread_shapes() -> list[tuple[int, int, int]]:
    """Shapes whose searches take each path: GLM-5 TP 8's shared expert, K splits in a
    persistent grid (DeepSeek-V3 TP 1 down), several waves (Qwen3-14B TP 1 down), a few
    SMs, and a fixed sample of others."""
    import random

    shapes = [
        (512, 6144, 132),
        (6144, 256, 132),
        (7168, 1152, 132),
        (3072, 2816, 114),
        (7168, 18432, 132),
        (5120, 17408, 132),
        (1024, 1024, 8),
        (2304, 6144, 16),
        (4096, 7168, 78),
    ]
    rng = random.Random(2024)
    for _ in range(12):
        rows, k = 16 * rng.randint(1, 1024), 128 * rng.randint(1, 96)
        shapes.append((rows, k, rng.choice((16, 78, 114, 132))))
    return shapes


@pytest.mark.parametrize(("rows", "k", "sms"), _spread_shapes())
def test_spread_search_equals_the_straightforward_search(rows, k, sms) -> None:
    """_SpreadSearch finds only the blocks of decompositions that can rank first (best) or
    be rated fastest (fastest): the same picks, costs and support as ranking every
    decomposition, and its full list (ranked) is that list."""
    for memo in (tuning._spread_search, tuning._spread_pick, tuning._spread_ranked):
        memo.cache_clear()
    tuning._supports.cache_clear()
    for tokens in range(1, gemv_params.MAX_TOKENS + 1):
        ranked = _reference_spread_ranked(rows, k, tokens, sms)
        spread = tuning._spread(rows, k, tokens, sms)
        assert spread == ((ranked[0][0][1], ranked[0][1]) if ranked else None), tokens
        assert tuning.kernel_supports(rows, k, tokens, sms) == _reference_supports(
            rows, k, tokens, sms
        )
        if ranked:
            assert tuning._spread_pick(rows, k, tokens, sms) == _reference_spread_pick(
                rows, k, tokens, sms
            ), tokens
    for tokens in range(1, gemv_params.MAX_TOKENS + 1):
        assert tuning._spread_ranked(rows, k, tokens, sms) == tuple(
            _reference_spread_ranked(rows, k, tokens, sms)
        ), tokens
