"""scripts/tune_fp8_gemv.py's code (mlpjit/bench/tune_gemv.py) without a GPU: --dry-run and
--emit of both modes, bad arguments and the report table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlpjit.bench import gemv_sweep, tune_gemv
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv import SPEC, tuning
from mlpjit.kernels.fp8_gemv import params as gemv_params
from mlpjit.kernels.fp8_gemv.params import GemvConfig
from mlpjit.testing import layers


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


def test_dry_run_lists_every_shape(capsys):
    assert tune_gemv.main(["kernel", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for name in gemv_sweep.DEFAULT_KERNEL_SHAPES:
        assert f"{name} " in out
    # one default per (shape, tokens) line, plus the legend
    assert (
        out.count("*") == len(gemv_sweep.DEFAULT_KERNEL_SHAPES) * len(gemv_sweep.KERNEL_TOKENS) + 1
    )


def test_emit_writes_valid_requests(tmp_path):
    path = tmp_path / "tune_gemv.jsonl"
    argv = ["kernel", "--emit", str(path), "--shapes", "glm5-tp8-down,glm5-tp4-gate_up"]
    assert tune_gemv.main([*argv, "--tokens", "8"]) == 0
    items = [json.loads(line) for line in path.read_text().splitlines()]
    expected = len(gemv_sweep.variants(6144, 1536, 8, False)) + len(
        gemv_sweep.variants(6144, 6144, 8, True)
    )
    assert len(items) == expected
    allowed = set(SPEC.field_names())
    seen = set()
    for item in items:
        assert set(item) == {"kernel", "params", "arch"}
        assert item["kernel"] == "fp8_gemv" and item["arch"] == "sm_90a"
        params = item["params"]
        # early_launch and trace are never set in a per-kernel sweep, sms stays the H200's;
        # slices_per_warp, cluster, send_x, late_steps and paced only when not the default (plan's
        # pick for TP8 at 8 tokens has clusters of 2, its gate_up sending x by st.async)
        optional = {"slices_per_warp", "cluster", "slice_k", "splits", "send_x", "late_steps"}
        optional.add("paced")
        never = {"early_launch", "sms", "trace"}
        assert set(params) - optional == allowed - never - optional
        assert params["tokens"] == 8 and params["ue8m0"] is True and params["limit"] is None
        assert (params["rows"], params["k"], params["swiglu"]) in gemv_sweep.KERNEL_SHAPES.values()
        assert _valid(params), params
        seen.add(json.dumps(params, sort_keys=True))
    assert len(seen) == len(items)  # no duplicate compiles


def test_emit_matches_cli_reader(tmp_path):
    from mlpjit.planning import read_requests

    path = tmp_path / "tune_gemv.jsonl"
    assert tune_gemv.main(["kernel", "--emit", str(path), "--tokens", "1"]) == 0
    requests = read_requests(path)
    assert requests == gemv_sweep.kernel_requests("sm_90a", gemv_sweep.DEFAULT_KERNEL_SHAPES, (1,))


def test_bad_shape_is_rejected():
    with pytest.raises(SystemExit):
        tune_gemv.main(["kernel", "--dry-run", "--shapes", "tp3-down"])
    with pytest.raises(SystemExit):
        tune_gemv.main(["kernel", "--dry-run", "--tokens", "9"])


def test_layer_emit_writes_distinct_valid_requests(tmp_path: Path, capsys) -> None:
    out = tmp_path / "pairs.jsonl"
    argv = ["layer", "--shapes", "glm5-tp8,glm4.5-tp8", "--tokens", "1,8", "--emit", str(out)]
    assert tune_gemv.main(argv) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    # 2 shapes x 2 token counts x (gate_up, down) x (trigger off, on)
    assert len(lines) == 16 and len({json.dumps(x, sort_keys=True) for x in lines}) == 16
    names = set(SPEC.field_names())
    for item in lines:
        assert item["kernel"] == "fp8_gemv" and item["arch"] == "sm_90a"
        assert set(item["params"]) <= names
    assert sum("early_launch" in x["params"] for x in lines) == 8
    assert "16 requests" in capsys.readouterr().out


def test_layer_dry_run_lists_every_pair(capsys) -> None:
    assert tune_gemv.main(["layer", "--dry-run", "--shapes", "glm5-tp8", "--tokens", "1,8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("glm5-tp8 (hidden=6144, intermediate=1536) m=1: ")
    assert out[-1].startswith("8 (gate_up + down) pairs")


def test_layer_shapes_take_the_grid_and_free_names(capsys) -> None:
    argv = ["layer", "--dry-run", "--shapes", "h2560-i2304,grid", "--tokens", "1"]
    assert tune_gemv.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("h2560-i2304 (hidden=2560, intermediate=2304) m=1: ")
    assert out[1].startswith("h2048-i256 (hidden=2048, intermediate=256) m=1: ")
    assert len(out) == 1 + 36 + 1


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--shapes", "glm9"], "unknown"),
        (["--tokens", "1,x"], "comma list"),
        (["--tokens", "0,9"], "must be in"),
        (["--clusters", "3"], "--clusters"),
        (["--down-configs", "t4/r3"], "--down-configs"),
        (["--rounds", "0"], "--rounds"),
        (["--shapes", "h3072-i1100"], "unknown"),
        (["--paced", "-1"], "--paced"),
        (["--paced-down", "-1"], "--paced-down"),
        (["--paced", "x"], "--paced"),
    ],
)
def test_layer_bad_arguments(argv, match, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        tune_gemv.main(["layer", *argv, "--emit", "/dev/null"])
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_mode_is_required(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        tune_gemv.main(["--dry-run"])
    assert exc.value.code == 2 and "kernel" in capsys.readouterr().err


def test_bad_clusters_argument(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        tune_gemv.main(["layer", "--clusters", "3", "--emit", "/dev/null"])
    assert exc.value.code == 2 and "--clusters" in capsys.readouterr().err


def test_markdown_table_marks_default_and_best() -> None:
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
    lines = tune_gemv.markdown_table(rows, "layer").splitlines()
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == 7
    assert lines[2].endswith("| 10.00 | default |") and lines[3].endswith("| 9.50 | **best** |")


def test_timed_in_rounds_alternates_so_equal_runs_time_equal(monkeypatch) -> None:
    """The sweep times every variant once per round, odd rounds reversed: under a GPU whose
    speed drifts over the run (its first timings fast), equal variants come out equal
    and the first one listed (choose_config's) gains nothing from going first."""
    calls = iter(range(1000))

    def drifting_replay_times(graph, replays, warmup):  # ms per replay of a chain of 4 items
        graph()
        t = 0.020 + 0.002 * next(calls)
        return [t] * replays

    # a "graph" here is its run, so each replay shows in ``ran``; a fresh process: unsettled
    monkeypatch.setattr(layers, "capture_graph", lambda fn: (fn, None))
    monkeypatch.setattr(layers, "replay_times", drifting_replay_times)
    monkeypatch.setattr(layers, "_settled", False)
    ran = []
    runs = [lambda i=i: ran.append(i) for i in range(3)]
    args = tune_gemv.parse_args(["layer", "--rounds", "2", "--replays", "5", "--dry-run"])
    timed = tune_gemv._timed_in_rounds(runs, 4, args)
    assert ran == [0, 0, 0, 0, 1, 2, 2, 1, 0]  # three settling timings of the first, discarded
    # variant 0 at calls 3 and 8: (0.026 + 0.036) / 2 ms per chain of 4 = 7.75 us each
    assert [t["us"] for t in timed] == pytest.approx([7.75] * 3)
    assert timed[0]["round_us"] == pytest.approx([6.5, 9.0])


def test_layer_norm_between_is_off_unless_asked() -> None:
    assert not tune_gemv.parse_args(["layer", "--dry-run"]).norm_between
    assert tune_gemv.parse_args(["layer", "--norm-between", "--dry-run"]).norm_between
