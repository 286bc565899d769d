"""CPU test of scripts/pair_sweep.py: the pairs it times and --emit (no GPU, no compile)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_script

from mlpjit.kernels import plan
from mlpjit.kernels.registry import kernel_def

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "pair_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    return load_script("pair_sweep")


def test_pairs_are_plans_defaults_with_every_trigger_combination(sweep) -> None:
    hidden, inter = sweep.SHAPES["glm5-tp8"]
    found = sweep.pairs(hidden, inter, 8)
    assert [(g.early_launch, d.early_launch) for g, d in found] == [
        (False, False), (False, True), (True, False), (True, True)
    ]  # fmt: skip
    gate_up = plan.choose_config(2 * inter, hidden, 8, True)
    down = plan.choose_config(hidden, inter, 8, False)
    for g, d in found:
        assert (g.tiles, g.in_regs, g.ctas_per_sm) == (gate_up.tiles, gate_up.in_regs,
                                                       gate_up.ctas_per_sm)  # fmt: skip
        assert (d.tiles, d.in_regs, d.ctas_per_sm) == (down.tiles, down.in_regs, down.ctas_per_sm)
    assert sweep.label(found[1][1]).endswith("/early") and "/early" not in sweep.label(found[0][1])


def test_emit_writes_distinct_valid_requests(sweep, tmp_path: Path, capsys) -> None:
    out = tmp_path / "pairs.jsonl"
    assert (
        sweep.main(["--shapes", "glm5-tp8,glm4.5-tp8", "--tokens", "1,8", "--emit", str(out)]) == 0
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    # 2 shapes x 2 token counts x (gate_up, down) x (trigger off, on)
    assert len(lines) == 16 and len({json.dumps(x, sort_keys=True) for x in lines}) == 16
    names = kernel_def("fp8_gemv").param_names
    for item in lines:
        assert item["kernel"] == "fp8_gemv" and item["arch"] == "sm_90a"
        assert set(item["params"]) <= names
    assert sum("early_launch" in x["params"] for x in lines) == 8
    assert "16 requests" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--shapes", "glm9"], "unknown"),
        (["--tokens", "1,x"], "comma list"),
        (["--tokens", "0,9"], "must be in"),
    ],
)
def test_bad_arguments(sweep, argv, match, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        sweep.main([*argv, "--emit", "/dev/null"])
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_extra_down_configs_pair_with_both_triggers(sweep) -> None:
    hidden, inter = sweep.SHAPES["glm5-tp8"]
    extra = [sweep.parse_config("t2/r3/c4"), sweep.parse_config("t8/r7/c8")]  # 2nd cannot fit
    found = sweep.pairs(hidden, inter, 1, extra)
    assert len(found) == 4 + 2
    assert [(g.early_launch, d) for g, d in found[4:]] == [(False, extra[0]), (True, extra[0])]


@pytest.mark.parametrize("text", ["t4/r3", "x4/r3/c2", "t4/rx/c2", ""])
def test_parse_config_rejects_malformed(sweep, text: str) -> None:
    with pytest.raises(ValueError, match="t4/r3/c2"):
        sweep.parse_config(text)


def test_parse_config_slices_per_warp(sweep) -> None:
    assert sweep.parse_config("t1/r0/c2/s3").slices_per_warp == 3
    assert sweep.parse_config("t1/r0/c2").slices_per_warp == 1
    assert sweep.label(sweep.parse_config("t1/r0/c2/s3")) == "t1/r0/c2/s3"
    with pytest.raises(ValueError, match="t1/r0/c2/s3"):
        sweep.parse_config("t1/r0/c2/x3")
    with pytest.raises(ValueError, match="slices >= 1"):
        sweep.parse_config("t4/r1/c2/s0")


def test_extra_gate_up_configs_cross_with_every_down(sweep) -> None:
    hidden, inter = sweep.SHAPES["glm5-tp8"]
    g2, d2 = sweep.parse_config("t2/r2/c1"), sweep.parse_config("t2/r2/c2")
    found = sweep.pairs(hidden, inter, 1, [d2], [g2])
    assert len(found) == len(set(found))
    crossed = {(g.tiles, g.in_regs, g.ctas_per_sm, g.early_launch, d) for g, d in found}
    for early in (False, True):
        assert (2, 2, 1, early, d2) in crossed
    assert all(not d.early_launch for g, d in found[4:])


def test_parse_config_cluster(sweep) -> None:
    both = sweep.parse_config("t1/r3/c1/s2/n4")
    assert (both.slices_per_warp, both.cluster) == (2, 4)
    alone = sweep.parse_config("t1/r3/c1/n2")
    assert (alone.slices_per_warp, alone.cluster) == (1, 2)
    assert sweep.label(both) == "t1/r3/c1/s2/n4" and sweep.label(alone) == "t1/r3/c1/n2"
    with pytest.raises(ValueError, match="cluster"):
        sweep.parse_config("t1/r3/c1/n3")
    with pytest.raises(ValueError, match="t1/r3/c1/s2/n4"):
        sweep.parse_config("t1/r3/c1/n2/s2")


def test_cluster_pairs_set_each_kernel_and_both(sweep) -> None:
    """GLM-5 TP8 at 8 tokens: plan's pair uses clusters of 2; --clusters 1 adds the
    unclustered kernels, 4 only where the grid allows it (not gate_up's persistent grid)."""
    hidden, inter = sweep.SHAPES["glm5-tp8"]
    found = sweep.pairs(hidden, inter, 8, clusters=[1, 4])
    assert len(found) == len(set(found))
    labels = {(sweep.label(g), sweep.label(d)) for g, d in found}
    assert ("t1/r3/c1/n2", "t4/r1/c2/s3") in labels
    assert ("t1/r3/c1", "t4/r1/c2/s3/n2") in labels
    assert ("t1/r3/c1", "t4/r1/c2/s3") in labels
    assert ("t1/r3/c1/n2", "t4/r1/c2/s3/n4") in labels
    assert not any(g.cluster == 4 for g, _ in found)


def test_bad_clusters_argument(sweep, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        sweep.main(["--clusters", "3", "--emit", "/dev/null"])
    assert exc.value.code == 2 and "--clusters" in capsys.readouterr().err
