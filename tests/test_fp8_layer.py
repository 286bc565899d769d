"""fp8_layer's params and planner (plain Python: no cutlass, no GPU)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_layer import SPEC, plan
from mlpjit.kernels.fp8_layer.params import COUNTER_BYTES, LayerParams

BASE = dict(hidden=7168, inter=256, tokens=1, limit=None, ue8m0=True, stages_gate_up=4,
            stages_down=3, warps=8, blocks_per_warp=1)  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(hidden=7000), "hidden must be a multiple of 128"),
        (dict(inter=200), "inter must be a multiple of 128"),
        (dict(tokens=9), r"tokens must be in \[1, 8\]"),
        (dict(warps=17), r"warps must be in \[1, 16\]"),
        (dict(stages_down=1), r"stages must be in \[2, 16\]"),
        (dict(limit=-1.0), "limit must be None or a finite number > 0 within BF16"),
        (dict(ue8m0=1), "ue8m0 must be a bool"),
        (dict(hidden=128, inter=128), "at least 132 blocks per phase"),
        (dict(stages_gate_up=4, stages_down=4, blocks_per_warp=2), "lower stages_gate_up"),
    ],
)
def test_params_refuse_what_the_kernel_cannot_take(change, message) -> None:
    with pytest.raises(ValueError, match=message):
        LayerParams(**{**BASE, **change})


def test_phases_are_the_layer_halves_on_one_wave() -> None:
    p = LayerParams(**{**BASE, "limit": 7.0})
    assert (p.gate_up.rows, p.gate_up.k, p.gate_up.swiglu) == (512, 7168, True)
    assert (p.down.rows, p.down.k, p.down.swiglu) == (7168, 256, False)
    assert p.gate_up.limit == 7.0 and p.down.limit is None
    assert p.gate_up.ctas == p.down.ctas == p.ctas == hopper.SMS
    assert p.threads == p.gate_up.threads == p.down.threads


def test_regions_do_not_overlap() -> None:
    p = LayerParams(**BASE)
    assert p.gate_up.smem_bytes <= p.smem_down and p.smem_down % 128 == 0
    assert p.smem_bytes == p.smem_down + p.down.smem_bytes <= hopper.smem_budget(1)
    assert p.gate_up.workspace_bytes <= p.work_down and p.work_down % 16 == 0
    assert p.work_down + p.down.workspace_bytes <= p.work_counters
    assert p.workspace_bytes == p.work_counters + COUNTER_BYTES


def test_small_layers_request_every_byte_at_launch() -> None:
    """The DeepSeek-V3 TP-8 shared expert: both rings hold their whole range."""
    p = plan.layer_params(7168, 256, 1, limit=None, ue8m0=True)
    for phase, stages in ((p.gate_up, p.stages_gate_up), (p.down, p.stages_down)):
        segments = 3  # a range is at most three segments, each starting a stage
        need = -(-phase.max_blocks_per_cta // phase.stage_blocks) + segments
        assert stages >= min(need, plan.MAX_STAGES)


def test_request_names_the_kernel_and_keeps_the_clamp() -> None:
    r = plan.layer_request(6144, 1536, 2, limit=7.0, ue8m0=False, arch="sm_90a")
    assert r.kernel == SPEC.name == "fp8_layer"
    assert r.params["limit"] == 7.0 and r.params["ue8m0"] is False


@settings(max_examples=150, deadline=None)
@given(
    hidden=st.integers(1, 64).map(lambda n: n * 128),
    inter=st.integers(1, 40).map(lambda n: n * 128),
    tokens=st.integers(1, 8),
    warps=st.sampled_from([4, 8, 16]),
)
def test_planner_fits_or_says_why(hidden, inter, tokens, warps) -> None:
    try:
        p = plan.layer_params(hidden, inter, tokens, limit=None, ue8m0=True, warps=warps)
    except ValueError as err:
        assert "fp8_layer" in str(err) or "needs at least" in str(err)
        return
    assert p.smem_bytes <= hopper.smem_budget(1)
    assert min(p.stages_gate_up, p.stages_down) >= plan.MIN_STAGES
    assert p.gate_up.blocks >= p.ctas and p.down.blocks >= p.ctas
