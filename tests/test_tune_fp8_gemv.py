"""CPU smoke test of scripts/tune_fp8_gemv.py: --dry-run and --emit (no GPU, no compile)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import load_script

from mlpjit.kernels import plan
from mlpjit.kernels.registry import kernel_def

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "tune_fp8_gemv.py"


@pytest.fixture(scope="module")
def tune():
    return load_script("tune_fp8_gemv")


def _valid(params: dict) -> bool:
    """The plan's limits on one fp8_gemv specialization (what the kernel checks too)."""
    rows, k, m = params["rows"], params["k"], params["tokens"]
    tiles, in_regs, cps = params["tiles"], params["in_regs"], params["ctas_per_sm"]
    spw = params.get("slices_per_warp", 1)
    fit = plan._fit(k, m, tiles, cps, spw)
    return (
        rows % (16 * tiles) == 0
        and k % plan.SLICE == 0
        and (k // plan.SLICE) % spw == 0
        and fit is not None
        and 0 <= in_regs <= fit
        and plan.smem_bytes(k, m, tiles, in_regs, spw) <= plan.smem_budget(cps)
    )


def test_dry_run_lists_every_shape(tune, capsys):
    assert tune.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    for name in tune.SHAPES:
        assert f"{name} " in out
    # one default per (shape, tokens) line, plus the legend
    assert out.count("*") == len(tune.SHAPES) * len(tune.DEFAULT_TOKENS) + 1


def test_variants_are_valid_capped_and_start_with_default(tune):
    for rows, k, swiglu in tune.SHAPES.values():
        for m in (1, 8):
            found = tune.variants(rows, k, m, swiglu)
            # k = 12288 leaves room for one warp per K slice only (tiles 1): one pair
            assert (1 if k > 6144 else 2) <= len(found) <= tune.MAX_VARIANTS
            default = plan.choose_config(rows, k, m, swiglu)
            assert found[0] == dataclasses.replace(default, early_launch=False)
            assert not any(c.early_launch for c in found)
            assert len(set(found)) == len(found)
            for c in found[1:]:  # the default may be any measured config (plan.TUNED_H200)
                assert c.tiles in tune.TILES and c.in_regs in tune.IN_REGS
                assert c.slices_per_warp == 1


def test_slices_per_warp_variants_are_added_and_valid(tune):
    base = tune.variants(6144, 12288, 1, False)
    wide = tune.variants(6144, 12288, 1, False, spws=(2, 3, 5))
    assert wide[: len(base)] == base
    added = wide[len(base) :]
    assert added and {c.slices_per_warp for c in added} == {2, 3}  # 5 does not divide 24
    for c in added:
        assert plan._fits(6144, 12288, 1, c) and c.tiles == 1


def test_emit_writes_valid_requests(tune, tmp_path):
    path = tmp_path / "tune.jsonl"
    assert (
        tune.main(["--emit", str(path), "--shapes", "tp8-down,tp4-gate_up", "--tokens", "8"]) == 0
    )
    items = [json.loads(line) for line in path.read_text().splitlines()]
    expected = len(tune.variants(6144, 1536, 8, False)) + len(tune.variants(6144, 6144, 8, True))
    assert len(items) == expected
    allowed = kernel_def("fp8_gemv").param_names
    seen = set()
    for item in items:
        assert set(item) == {"kernel", "params", "arch"}
        assert item["kernel"] == "fp8_gemv" and item["arch"] == "sm_90a"
        params = item["params"]
        # early_launch is never set in a per-kernel sweep, sms stays the H200's (132);
        # slices_per_warp and cluster only when not 1 (plan's default for TP8 down at 8
        # tokens has clusters of 2)
        optional = {"slices_per_warp", "cluster"}
        assert set(params) - optional == allowed - {"early_launch", "sms"} - optional
        assert params["tokens"] == 8 and params["ue8m0"] is True and params["limit"] is None
        assert (params["rows"], params["k"], params["swiglu"]) in tune.SHAPES.values()
        assert _valid(params), params
        seen.add(json.dumps(params, sort_keys=True))
    assert len(seen) == len(items)  # no duplicate compiles


def test_emit_matches_cli_reader(tune, tmp_path):
    from mlpjit.cli import _read_requests

    path = tmp_path / "tune.jsonl"
    assert tune.main(["--emit", str(path), "--tokens", "1"]) == 0
    requests = _read_requests(path)
    assert requests == tune.kernel_requests("sm_90a", tuple(tune.SHAPES), (1,))


def test_bad_shape_is_rejected(tune):
    with pytest.raises(SystemExit):
        tune.main(["--dry-run", "--shapes", "tp3-down"])
    with pytest.raises(SystemExit):
        tune.main(["--dry-run", "--tokens", "9"])
