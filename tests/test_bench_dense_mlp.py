"""scripts/bench_dense_mlp.py's code (mlpjit/bench/dense_mlp_bench.py) without a GPU: argument
handling, planning, the report table."""

from __future__ import annotations

import json

import pytest

from mlpjit.bench import dense_mlp_bench as bench


def test_dry_run_plans_every_shape(capsys) -> None:
    assert bench.main(["--dry-run"]) == 0
    text = capsys.readouterr().out
    for name in bench.SHAPES:
        assert name in text
    assert "glm5-tp8: hidden 6144, intermediate 1536, 9 layers" in text


def test_default_shapes() -> None:
    """GLM-5 TP 8/4/1, GLM-4.5 TP 8, DeepSeek-V3 dense TP 8 and shared TP 8 and 1, Qwen3-32B
    TP 8: the shards the kernel work is measured on."""
    assert bench.SHAPES == {
        "glm5-tp8": (6144, 1536),
        "glm5-tp4": (6144, 3072),
        "glm5-tp1": (6144, 12288),
        "glm4.5-tp8": (5120, 1536),
        "deepseek-v3-tp8": (7168, 2304),
        "deepseek-v3-shared-tp8": (7168, 256),
        "deepseek-v3-shared-tp1": (7168, 2048),
        "qwen3-32b-tp8": (5120, 3200),
    }
    assert bench.parse_args([]).shape_list == list(bench.SHAPES)


def test_shapes_takes_any_preset_shard(capsys) -> None:
    args = bench.parse_args(["--shapes", "qwen3-8b-tp8, glm5-shared-tp4"])
    assert args.shape_list == ["qwen3-8b-tp8", "glm5-shared-tp4"]
    assert bench.main(["--dry-run", "--shapes", "glm5-shared-tp4"]) == 0
    assert "glm5-shared-tp4: hidden 6144, intermediate 512," in capsys.readouterr().out


def test_grid_adds_the_off_table_shapes(capsys) -> None:
    args = bench.parse_args(["--shapes", "glm5-tp8", "--grid"])
    assert args.shape_list[0] == "glm5-tp8" and len(args.shape_list) == 1 + 36
    assert "h3072-i1152" in args.shape_list
    assert bench.parse_args(["--shapes", "h2048-i256"]).shape_list == ["h2048-i256"]
    assert bench.main(["--dry-run", "--shapes", "h2048-i256", "--tokens", "1,8"]) == 0
    assert bench.parse_args(["--shapes", "h2560-i2304"]).shape_list == ["h2560-i2304"]
    assert "h2048-i256: hidden 2048, intermediate 256," in capsys.readouterr().out


def test_l2_resident_chains_calls_of_one_layer(capsys) -> None:
    assert bench.main(["--dry-run", "--l2-resident", "--shapes", "glm5-tp8"]) == 0
    text = capsys.readouterr().out
    calls = bench.L2_RESIDENT_CALLS
    assert f"glm5-tp8: hidden 6144, intermediate 1536, {calls} calls of one layer" in text
    assert bench.parse_args([]).l2_resident is False


def test_quick_narrows_the_run() -> None:
    args = bench.parse_args(["--quick"])
    assert args.shape_list == ["glm5-tp8"] and args.token_list == [1, 8] and args.replays == 30


@pytest.mark.parametrize(
    "argv",
    [
        ["--shapes", "glm6"],
        ["--shapes", "kimi-k2-tp8"],
        ["--shapes", "glm4.5-shared-tp8"],
        ["--tokens", "0"],
        ["--tokens", "a,b"],
        ["--methods", "cublas"],
        ["--replays", "0"],
        ["--l2-multiple", "0"],
        ["--plot-from", "/nonexistent.json"],
    ],
)
def test_bad_arguments_exit(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def test_chain_covers_four_l2s() -> None:
    for hidden, inter in bench.SHAPES.values():
        n = bench.layers_needed(hidden, inter, 60 * 2**20, 4.0)
        assert n >= 2 and n * bench.layer_bytes(hidden, inter) >= 4 * 60 * 2**20


def test_table_from_saved_json(tmp_path, capsys) -> None:
    row = {
        "shape": "glm5-tp8",
        "tokens": 1,
        "mlpjit_us": 8.0,
        "floor_us": 7.0,
        "floor_ratio": 8 / 7,
        "stock_us": 40.0,
        "speedup_vs_stock": 5.0,
        "host_us": 12.5,
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"meta": {}, "results": [row]}))
    assert bench.main(["--plot-from", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].count("|") == table[1].count("|") == table[2].count("|")
    assert "| glm5-tp8 | 1 | 8.00 | 7.00 | 1.143 | - | 40.00 |" in table[2]


def test_plot_from_saved_json(tmp_path, capsys) -> None:
    row = {"shape": "glm5-tp8", "tokens": 1, "mlpjit_us": 8.0, "floor_us": 7.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"meta": {}, "results": [row, {**row, "tokens": 8}]}))
    png = tmp_path / "plot.png"
    assert bench.main(["--plot-from", str(path), "--plot", str(png)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 10_000
    assert capsys.readouterr().out.endswith(f"plot: {png}\n")


def test_requests_cover_the_benchmark() -> None:
    requests = bench.kernel_requests("sm_90a")
    assert {r.params["tokens"] for r in requests} == {1, 2, 4, 8}
    assert all(r.params["ue8m0"] and r.params["limit"] is None for r in requests)


@pytest.mark.parametrize("shapes", [tuple(bench.SHAPES), ("qwen3-8b-tp8", "glm5-shared-tp2")])
def test_requests_hold_both_kernels_of_every_shape_on_the_kernel_path(shapes) -> None:
    """Whatever the kernels take today: each benchmarked shape and token count that runs
    DenseMlp's kernels has its gate_up and down request in the list."""
    from mlpjit.dense_mlp import kernel_supported

    requests = bench.kernel_requests("sm_90a", shapes)
    have = {(r.params["rows"], r.params["k"], r.params["tokens"]) for r in requests}
    on_kernel_path = 0
    for name in shapes:
        hidden, inter = bench.DENSE_SHAPES[name]
        for m in bench.DEFAULT_TOKENS:
            if kernel_supported(hidden, inter, m):
                on_kernel_path += 1
                assert {(2 * inter, hidden, m), (hidden, inter, m)} <= have, (name, m)
    assert on_kernel_path >= 4  # glm5-tp8 / qwen3-8b-tp8 at every token count, at least


def test_norm_between_shows_in_the_dry_run_and_the_table(tmp_path, capsys) -> None:
    assert not bench.parse_args([]).norm_between
    assert bench.main(["--quick", "--norm-between", "--dry-run"]) == 0
    assert "a torch kernel (no PDL) before every layer" in capsys.readouterr().out
    assert bench.main(["--quick", "--dry-run"]) == 0
    assert "before every layer" not in capsys.readouterr().out
    row = {"shape": "glm5-tp8", "tokens": 1, "mlpjit_us": 10.0, "floor_us": 7.0, "norm_us": 2.5}
    path = tmp_path / "r.json"
    rows = [row, {**row, "tokens": 8, "norm_us": None}]
    path.write_text(json.dumps({"meta": {}, "results": rows}))
    assert bench.main(["--plot-from", str(path)]) == 0
    head, _, with_norm, without = capsys.readouterr().out.splitlines()
    assert head.endswith("| norm us |") and with_norm.endswith("| 2.50 |")
    assert without.endswith("| - |")
