"""CPU tests of scripts/tune_fp8_gemv.py: the variants and pairs it times, --dry-run and --emit
(no GPU, no compile)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import load_script

from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv import SPEC, tuning
from mlpjit.kernels.fp8_gemv import params as gemv_params
from mlpjit.kernels.fp8_gemv.params import GemvConfig


@pytest.fixture(scope="module")
def tune():
    return load_script("tune_fp8_gemv")


def _valid(params: dict) -> bool:
    """The plan's limits on one fp8_gemv specialization (what the kernel checks too)."""
    rows, k, m = params["rows"], params["k"], params["tokens"]
    tiles, in_regs, cps = params["tiles"], params["in_regs"], params["ctas_per_sm"]
    if params.get("splits", 1) > 1 or params.get("slice_k", 512) != 512:
        return tuning.config_fits(rows, k, m, GemvConfig(**{
            f: params[f] for f in GemvConfig.__dataclass_fields__ if f in params
        }))  # fmt: skip
    spw = params.get("slices_per_warp", 1)
    fit = tuning.max_in_regs(k, m, tiles, cps, spw)
    return (
        rows % (16 * tiles) == 0
        and k % gemv_params.SLICE == 0
        and (k // gemv_params.SLICE) % spw == 0
        and fit is not None
        and 0 <= in_regs <= fit
        and gemv_params.smem_bytes(k, m, tiles, in_regs, spw) <= hopper.smem_budget(cps)
    )


# ---- kernel mode --------------------------------------------------------------------------


def test_dry_run_lists_every_shape(tune, capsys):
    assert tune.main(["kernel", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for name in tune.DEFAULT_KERNEL_SHAPES:
        assert f"{name} " in out
    # one default per (shape, tokens) line, plus the legend
    assert out.count("*") == len(tune.DEFAULT_KERNEL_SHAPES) * len(tune.KERNEL_TOKENS) + 1


def test_variants_are_valid_capped_and_start_with_default(tune):
    for rows, k, swiglu in tune.KERNEL_SHAPES.values():
        for m in (1, 8):
            found = tune.variants(rows, k, m, swiglu)
            # k = 12288 leaves room for one warp per K slice only (tiles 1): one pair; k not
            # a multiple of 512 has no whole-K candidates besides the default
            assert (1 if k > 6144 or k % 512 else 2) <= len(found) <= tune.MAX_VARIANTS
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
                assert c.tiles in tune.TILES and c.in_regs in tune.IN_REGS
                assert c.slices_per_warp == 1


def test_slices_per_warp_variants_are_added_and_valid(tune):
    base = tune.variants(6144, 12288, 1, False)
    wide = tune.variants(6144, 12288, 1, False, spws=(2, 3, 5))
    assert wide[: len(base)] == base
    added = wide[len(base) :]
    assert added and {c.slices_per_warp for c in added} == {2, 3}  # 5 does not divide 24
    for c in added:
        assert tuning.config_fits(6144, 12288, 1, c) and c.tiles == 1


def test_emit_writes_valid_requests(tune, tmp_path):
    path = tmp_path / "tune.jsonl"
    argv = ["kernel", "--emit", str(path), "--shapes", "glm5-tp8-down,glm5-tp4-gate_up"]
    assert tune.main([*argv, "--tokens", "8"]) == 0
    items = [json.loads(line) for line in path.read_text().splitlines()]
    expected = len(tune.variants(6144, 1536, 8, False)) + len(tune.variants(6144, 6144, 8, True))
    assert len(items) == expected
    allowed = set(SPEC.field_names())
    seen = set()
    for item in items:
        assert set(item) == {"kernel", "params", "arch"}
        assert item["kernel"] == "fp8_gemv" and item["arch"] == "sm_90a"
        params = item["params"]
        # early_launch is never set in a per-kernel sweep, sms stays the H200's (132);
        # slices_per_warp and cluster only when not 1 (plan's default for TP8 down at 8
        # tokens has clusters of 2)
        optional = {"slices_per_warp", "cluster", "slice_k", "splits"}
        assert set(params) - optional == allowed - {"early_launch", "sms"} - optional
        assert params["tokens"] == 8 and params["ue8m0"] is True and params["limit"] is None
        assert (params["rows"], params["k"], params["swiglu"]) in tune.KERNEL_SHAPES.values()
        assert _valid(params), params
        seen.add(json.dumps(params, sort_keys=True))
    assert len(seen) == len(items)  # no duplicate compiles


def test_emit_matches_cli_reader(tune, tmp_path):
    from mlpjit.planning import read_requests

    path = tmp_path / "tune.jsonl"
    assert tune.main(["kernel", "--emit", str(path), "--tokens", "1"]) == 0
    requests = read_requests(path)
    assert requests == tune.kernel_requests("sm_90a", tune.DEFAULT_KERNEL_SHAPES, (1,))


def test_bad_shape_is_rejected(tune):
    with pytest.raises(SystemExit):
        tune.main(["kernel", "--dry-run", "--shapes", "tp3-down"])
    with pytest.raises(SystemExit):
        tune.main(["kernel", "--dry-run", "--tokens", "9"])


# ---- layer mode ---------------------------------------------------------------------------


def test_pairs_are_plans_defaults_with_every_trigger_combination(tune) -> None:
    hidden, inter = tune.LAYER_SHAPES["glm5-tp8"]
    found = tune.pairs(hidden, inter, 8)
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
    assert tune.label(found[1][1]).endswith("/early") and "/early" not in tune.label(found[0][1])


def test_layer_emit_writes_distinct_valid_requests(tune, tmp_path: Path, capsys) -> None:
    out = tmp_path / "pairs.jsonl"
    argv = ["layer", "--shapes", "glm5-tp8,glm4.5-tp8", "--tokens", "1,8", "--emit", str(out)]
    assert tune.main(argv) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    # 2 shapes x 2 token counts x (gate_up, down) x (trigger off, on)
    assert len(lines) == 16 and len({json.dumps(x, sort_keys=True) for x in lines}) == 16
    names = set(SPEC.field_names())
    for item in lines:
        assert item["kernel"] == "fp8_gemv" and item["arch"] == "sm_90a"
        assert set(item["params"]) <= names
    assert sum("early_launch" in x["params"] for x in lines) == 8
    assert "16 requests" in capsys.readouterr().out


def test_layer_dry_run_lists_every_pair(tune, capsys) -> None:
    assert tune.main(["layer", "--dry-run", "--shapes", "glm5-tp8", "--tokens", "1,8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("glm5-tp8 (hidden=6144, intermediate=1536) m=1: ")
    assert out[-1].startswith("8 (gate_up + down) pairs")


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--shapes", "glm9"], "unknown"),
        (["--tokens", "1,x"], "comma list"),
        (["--tokens", "0,9"], "must be in"),
        (["--clusters", "3"], "--clusters"),
        (["--down-configs", "t4/r3"], "--down-configs"),
    ],
)
def test_layer_bad_arguments(tune, argv, match, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        tune.main(["layer", *argv, "--emit", "/dev/null"])
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_mode_is_required(tune, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        tune.main(["--dry-run"])
    assert exc.value.code == 2 and "kernel" in capsys.readouterr().err


def test_extra_down_configs_pair_with_both_triggers(tune) -> None:
    hidden, inter = tune.LAYER_SHAPES["glm5-tp8"]
    extra = [tune.parse_config("t2/r3/c4"), tune.parse_config("t8/r7/c8")]  # 2nd cannot fit
    found = tune.pairs(hidden, inter, 1, extra)
    assert len(found) == 4 + 2
    assert [(g.early_launch, d) for g, d in found[4:]] == [(False, extra[0]), (True, extra[0])]


@pytest.mark.parametrize("text", ["t4/r3", "x4/r3/c2", "t4/rx/c2", ""])
def test_parse_config_rejects_malformed(tune, text: str) -> None:
    with pytest.raises(ValueError, match="t4/r3/c2"):
        tune.parse_config(text)


def test_parse_config_slices_per_warp(tune) -> None:
    assert tune.parse_config("t1/r0/c2/s3").slices_per_warp == 3
    assert tune.parse_config("t1/r0/c2").slices_per_warp == 1
    assert tune.label(tune.parse_config("t1/r0/c2/s3")) == "t1/r0/c2/s3"
    with pytest.raises(ValueError, match="t1/r0/c2/s3"):
        tune.parse_config("t1/r0/c2/q3")
    with pytest.raises(ValueError, match="t1/r0/c2/s3"):
        tune.parse_config("t1/r0/c2/s3/s2")  # twice
    with pytest.raises(ValueError, match="slices >= 1"):
        tune.parse_config("t4/r1/c2/s0")


def test_extra_gate_up_configs_cross_with_every_down(tune) -> None:
    hidden, inter = tune.LAYER_SHAPES["glm5-tp8"]
    g2, d2 = tune.parse_config("t2/r2/c1"), tune.parse_config("t2/r2/c2")
    found = tune.pairs(hidden, inter, 1, [d2], [g2])
    assert len(found) == len(set(found))
    crossed = {(g.tiles, g.in_regs, g.ctas_per_sm, g.early_launch, d) for g, d in found}
    for early in (False, True):
        assert (2, 2, 1, early, d2) in crossed
    assert all(not d.early_launch for g, d in found[4:])


def test_parse_config_cluster(tune) -> None:
    both = tune.parse_config("t1/r3/c1/s2/n4")
    assert (both.slices_per_warp, both.cluster) == (2, 4)
    alone = tune.parse_config("t1/r3/c1/n2")
    assert (alone.slices_per_warp, alone.cluster) == (1, 2)
    assert tune.label(both) == "t1/r3/c1/s2/n4" and tune.label(alone) == "t1/r3/c1/n2"
    with pytest.raises(ValueError, match="cluster"):
        tune.parse_config("t1/r3/c1/n3")
    # optional parts in any order, K slices and splits too
    assert tune.parse_config("t1/r3/c1/n2/s2") == both.__class__(
        1, 3, 1, slices_per_warp=2, cluster=2
    )
    split = tune.parse_config("t2/r1/c2/x4/k256")
    assert (split.splits, split.slice_k) == (4, 256)
    assert tune.label(split) == "t2/r1/c2/k256/x4"


def test_cluster_pairs_set_each_kernel_and_both(tune) -> None:
    """GLM-5 TP8 at 8 tokens: plan's pair uses clusters of 2; --clusters 1 adds the
    unclustered kernels, 4 only where the grid allows it (not gate_up's persistent grid)."""
    hidden, inter = tune.LAYER_SHAPES["glm5-tp8"]
    found = tune.pairs(hidden, inter, 8, clusters=[1, 4])
    assert len(found) == len(set(found))
    labels = {(tune.label(g), tune.label(d)) for g, d in found}
    assert ("t1/r3/c1/n2", "t4/r1/c2/s3") in labels
    assert ("t1/r3/c1", "t4/r1/c2/s3/n2") in labels
    assert ("t1/r3/c1", "t4/r1/c2/s3") in labels
    assert ("t1/r3/c1/n2", "t4/r1/c2/s3/n4") in labels
    assert not any(g.cluster == 4 for g, _ in found)


def test_bad_clusters_argument(tune, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        tune.main(["layer", "--clusters", "3", "--emit", "/dev/null"])
    assert exc.value.code == 2 and "--clusters" in capsys.readouterr().err


def test_markdown_table_marks_default_and_best(tune) -> None:
    rows = [
        {
            "shape": "glm5-tp8",
            "tokens": 1,
            "gate_up": "a",
            "down": "b",
            "us": 10.0,
            "default": True,
        },
        {
            "shape": "glm5-tp8",
            "tokens": 1,
            "gate_up": "c",
            "down": "d",
            "us": 9.5,
            "default": False,
        },
    ]
    lines = tune.markdown_table(rows, "layer").splitlines()
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == 7
    assert lines[2].endswith("| 10.00 | default |") and lines[3].endswith("| 9.50 | **best** |")
