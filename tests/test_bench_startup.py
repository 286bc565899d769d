"""scripts/bench_startup.py's code (mlpjit/bench/startup.py) without a GPU: arguments, the
presets' layer lists, the plan, the report table and the one-line failures."""

from __future__ import annotations

import json

import pytest
import torch
from test_bench_plots import PNG_MAGIC, startup_report

from mlpjit.bench import startup as bench
from mlpjit.layer_plan import dense_mlp_requests
from mlpjit.models import PRESETS


def test_defaults_are_glm5_tp8_in_one_then_eight_workers() -> None:
    args = bench.parse_args([])
    assert (args.model, args.tp, args.workers) == ("glm5", 8, [1, 8])
    assert args.tokens == list(range(1, 9))
    assert (args.calls, args.json, args.dry_run) == (200, False, False)
    assert len(args.layers) == 78


def test_glm5_tp8_is_3_dense_mlps_then_75_shared_experts() -> None:
    layers = bench.model_layers("glm5", 8)
    assert layers == [("dense", 6144, 1536)] * 3 + [("shared", 6144, 256)] * 75


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_has_its_layer_counts(name: str) -> None:
    dense, moe = bench.LAYER_COUNTS[name]
    assert dense >= 1 and (moe > 0) == (PRESETS[name].shared_intermediate is not None)
    layers = bench.model_layers(name, 1)
    assert [kind for kind, _, _ in layers] == ["dense"] * dense + ["shared"] * moe


def test_aliases_take_their_presets_layers() -> None:
    assert bench.model_layers("kimi-k2", 8) == bench.model_layers("deepseek-v3", 8)
    assert len(bench.model_layers("deepseek-r1", 8)) == 61


def test_distinct_kernels_are_the_warm_plan() -> None:
    """What each worker loads once: mlpjit warm --model glm5 --tp 8's 32 kernels."""
    requests = bench.distinct_requests(bench.model_layers("glm5", 8), range(1, 9), "sm_90a")
    warm = [
        r
        for inter in (12288, 2048)
        for r in dense_mlp_requests(6144, inter, 8, range(1, 9), "sm_90a")
    ]
    assert len(requests) == 32
    assert {r.to_json_line() for r in requests} == {r.to_json_line() for r in warm}


def test_dry_run_lists_the_layers(capsys) -> None:
    assert bench.main(["--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "glm5 TP 8: 78 MLPs (3 dense, 75 shared), tokens 1-8, 32 distinct kernels" in text
    assert "s here, part of each worker's prepare)" in text
    assert "shared: hidden 6144, intermediate 256 x 75 layers" in text


@pytest.mark.parametrize(
    "argv",
    [
        ["--workers", "0"],
        ["--workers", "1,x"],
        ["--workers", ","],
        ["--tp", "0"],
        ["--tp", "7"],  # does not divide GLM-5's sizes
        ["--model", "llama"],
        ["--tokens", "0-3"],
        ["--calls", "0"],
        ["--warmup", "-1"],
    ],
)
def test_bad_arguments_exit_with_a_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2


def test_workers_list_keeps_its_order() -> None:
    assert bench.parse_workers("8, 1,4") == [8, 1, 4]


def test_a_missing_kernel_is_one_line_naming_the_warm_command() -> None:
    args = bench.parse_args(["--model", "glm5", "--tp", "4"])
    error = "CompilerUnavailableError: mlpjit kernel fp8_gemv (key 0123) is not in any cache"
    line = bench.failure_line(args, error)
    assert "\n" not in line and "mlpjit warm --model glm5 --tp 4 --arch sm_90a" in line
    assert line.endswith(f"({error})")
    assert bench.failure_line(args, "RuntimeError: boom") == "bench_startup: RuntimeError: boom"


def test_table_has_a_row_per_worker_and_shows_errors() -> None:
    good = {
        "worker": 0,
        "construct_s": 0.0312,
        "prepare_s": 0.0871,
        "module_loads": 32,
        "distinct_kernels": 32,
        "cache_lookups": 32,
        "eager_host_us": {"dense": 11.2, "shared": 10.9},
        "launch_host_us": {"dense": 6.0, "shared": 5.9},
        "alloc_host_us": {"dense": 2.5, "shared": 2.4},
        "op_host_us": {"dense": 21.0, "shared": 20.5},
        "op_eager_host_us": {"dense": 13.0, "shared": 12.8},
        "torch_op_host_us": 8.1,
        "construct_syncs_per_layer": 0.0,
        "scale_check_s": 0.0021,
        "plan_s": 0.0123,
    }
    runs = [
        {"workers": 1, "results": [good]},
        {"workers": 2, "results": [good, {"worker": 1, "error": "RuntimeError: boom"}]},
    ]
    lines = bench.format_table(runs).splitlines()
    assert len(lines) == 2 + 3
    assert lines[2] == (
        "| 1 | 0 | 0.031 | 0.0 | 0.002 | 0.087 | 0.012 | 32 | 32 | 32 | "
        "dense 11.2 / 6.0 / 2.5 / 21.0 / 13.0 ; shared 10.9 / 5.9 / 2.4 / 20.5 / 12.8 | 8.1 |"
    )
    assert lines[4] == "| 2 | 1 | error: RuntimeError: boom |"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_refuses_in_one_line(capsys) -> None:
    assert bench.main(["--workers", "1"]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA GPU visible" in out


def test_plot_from_named_runs_groups_them_into_series(tmp_path, capsys) -> None:
    """The stored results file holds named runs; --series groups them, --plot draws them."""
    runs = {"a:startup_old": startup_report(0.3), "b:startup_new": startup_report(0.2)}
    stored = tmp_path / "startup.json"
    stored.write_text(json.dumps({"note": "two runs", "runs": runs}))
    png = tmp_path / "startup.png"
    argv = ["--plot", str(png), "--plot-from", str(stored)]
    assert bench.main([*argv, "--series", "before=old", "--series", "after=new"]) == 0
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert capsys.readouterr().out == f"plot: {png}\n"
    grouped = bench.group_series(bench.stored_runs([stored]), [("x", "startup")])
    assert list(grouped) == ["x"] and len(grouped["x"]) == 2
    assert list(bench.group_series(bench.stored_runs([stored]), None)) == list(runs)


def test_plot_from_one_report_names_it_after_its_file(tmp_path) -> None:
    report = tmp_path / "after.json"
    report.write_text(json.dumps(startup_report(0.2, workers=(1,))))
    assert list(bench.stored_runs([report])) == ["after"]


def test_a_series_that_matches_no_run_is_one_line(tmp_path, capsys) -> None:
    stored = tmp_path / "r.json"
    stored.write_text(json.dumps(startup_report(0.2, workers=(1,))))
    argv = ["--plot", str(tmp_path / "p.png"), "--plot-from", str(stored), "--series", "b=zz"]
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--series b: no run name holds its text (r)" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--plot", "p.png"],
        ["--plot-from", "/nonexistent.json", "--plot", "p.png"],
        ["--series", "noequals"],
        ["--series", "=x"],
    ],
)
def test_bad_plot_arguments_exit_with_a_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2


def test_profile_rows_rank_by_cumulative_time_and_print_as_a_table() -> None:
    import cProfile

    def slow() -> int:
        return sum(i * i for i in range(20000))

    def fast() -> int:
        return 1

    profiler = cProfile.Profile()
    profiler.enable()
    slow()
    fast()
    profiler.disable()
    rows = bench.profile_rows(profiler, 50)
    names = [r["function"] for r in rows]
    slow_row = next(r for r in rows if r["function"].endswith("(slow)"))
    fast_row = next(r for r in rows if r["function"].endswith("(fast)"))
    assert names.index(slow_row["function"]) < names.index(fast_row["function"])
    assert slow_row["calls"] == 1 and slow_row["cum_ms"] >= slow_row["own_ms"] >= 0
    assert slow_row["function"].startswith("tests/test_bench_startup.py:")
    assert [r["cum_ms"] for r in rows] == sorted((r["cum_ms"] for r in rows), reverse=True)
    assert len(bench.profile_rows(profiler, 1)) == 1
    table = bench.format_profile(rows[:2]).splitlines()
    assert table[0] == "| cum ms | own ms | calls | function |" and len(table) == 4


def test_profile_takes_a_positive_count() -> None:
    assert bench.parse_args(["--profile", "30"]).profile == 30
    assert bench.parse_args([]).profile is None
    with pytest.raises(SystemExit):
        bench.parse_args(["--profile", "0"])
