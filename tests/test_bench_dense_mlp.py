"""scripts/bench_dense_mlp.py without a GPU: argument handling, planning, the report table."""

from __future__ import annotations

import json

import pytest
from conftest import load_script

bench = load_script("bench_dense_mlp")


def test_dry_run_plans_every_shape(capsys) -> None:
    assert bench.main(["--dry-run"]) == 0
    text = capsys.readouterr().out
    for name in bench.SHAPES:
        assert name in text
    assert "glm5-tp8: hidden 6144, intermediate 1536, 9 layers" in text


def test_quick_narrows_the_run() -> None:
    args = bench.parse_args(["--quick"])
    assert args.shape_list == ["glm5-tp8"] and args.token_list == [1, 8] and args.replays == 30


@pytest.mark.parametrize(
    "argv",
    [
        ["--shapes", "glm6"],
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


def test_requests_cover_the_benchmark() -> None:
    requests = bench.kernel_requests("sm_90a")
    assert {r.params["tokens"] for r in requests} == {1, 2, 4, 8}
    assert all(r.params["ue8m0"] and r.params["limit"] is None for r in requests)
