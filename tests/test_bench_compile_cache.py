"""scripts/bench_compile_cache.py's code (mlpjit/bench/compile_cache_bench.py) without running
the benchmark: the report of stored results and --plot from them (the numbers and the image
in docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO
from test_bench_plots import PNG_MAGIC, compile_cache_result

from mlpjit.bench import compile_cache_bench as bench


def test_report_is_the_table_of_a_result() -> None:
    lines = bench.report(compile_cache_result("fp8_gemv", 2.0)).splitlines()
    assert lines[0] == "Cold cache, 16 fp8_gemv kernels for sm_90a, 2 CPU cores:"
    assert lines[4] == "| 1 | 2.50 | 16 | 1.0 | 2.00 | 16 | 2.0 |"
    assert lines[6] == "| 4 | 4.00 | 16 | 4.0 | 8.00 | 64 | 8.0 |"
    assert lines[-1].startswith("Warm start of a fresh process, all 16 ready: mlpjit 40.0 ms")


def test_stored_results_give_the_documented_tables(capsys) -> None:
    """docs/BENCHMARKS.md's two compile-cache tables are the stored results' reports."""
    docs = (REPO / "docs" / "BENCHMARKS.md").read_text()
    for name in ("compile_cache.json", "compile_cache_fp8_gemv.json"):
        bench.main(["--plot-from", str(REPO / "bench" / "results" / name)])
        rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
        assert len(rows) == 1 + 4
        for row in rows:
            assert row in docs, row


def test_plot_from_stored_results_writes_a_png(tmp_path: Path, capsys) -> None:
    paths = []
    for kernel in ("smoke", "fp8_gemv"):
        paths.append(tmp_path / f"{kernel}.json")
        paths[-1].write_text(json.dumps(compile_cache_result(kernel, 1.0)))
    png = tmp_path / "plot.png"
    bench.main(["--plot", str(png), "--plot-from", *map(str, paths)])
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert f"plot: {png}" in capsys.readouterr().out


def test_plot_from_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--plot", str(tmp_path / "p.png"), "--plot-from", str(tmp_path / "no.json")])
    assert exit_info.value.code == 2
    assert not (tmp_path / "p.png").exists()
