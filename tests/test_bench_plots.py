"""mlpjit.bench.plots on the CPU (matplotlib's Agg backend): each plot writes a PNG from a
small synthetic result of its benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlpjit.bench import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def compile_cache_result(kernel: str, scale: float) -> dict:
    """bench_compile_cache.py's JSON, as written, for W = 1, 2, 4."""
    rows = [
        {
            "workers": w,
            "mlpjit": {
                "workers": w,
                "wall_s": scale * (1 + w / 4),
                "cpu_s": scale * w / 2,
                "compiles": 16,
            },
            "baseline": {
                "workers": w,
                "wall_s": scale * w,
                "cpu_s": scale * w,
                "compiles": 16 * w,
                "cute_cache_files": 0,
            },
        }
        for w in (1, 2, 4)
    ]
    warm = {
        "mlpjit_ready_ms": 40.0,
        "mlpjit_after_import_ms": 5.0,
        "mlpjit_process_wall_s": 0.1,
        "mlpjit_compiles": 0,
        "mlpjit_imports_cutlass": False,
        "baseline_ready_ms": 1200.0 * scale,
        "baseline_process_wall_s": 1.5 * scale,
    }
    return {
        "kernel": kernel,
        "kernels": 16,
        "arch": "sm_90a",
        "machine": {"cpus": 2},
        "rows": rows,
        "warm_start": warm,
    }


def startup_report(prepare_s: float, workers: tuple[int, ...] = (1, 8)) -> dict:
    """bench_startup.py's --json report: one run per worker count, one result per worker."""

    def result(worker: int) -> dict:
        return {
            "worker": worker,
            "construct_s": 0.1,
            "prepare_s": prepare_s + worker / 1000,
            "module_loads": 32,
            "distinct_kernels": 32,
            "cache_lookups": 32,
            "compiles": 0,
            "eager_host_us": {"dense": 20.0, "shared": 21.0},
            "torch_op_host_us": 9.0,
        }

    runs = [
        {"workers": n, "wall_s": 5.0, "results": [result(i) for i in range(n)]} for n in workers
    ]
    return {
        "model": "glm5",
        "tp": 8,
        "layers": {"dense": 3, "shared": 75},
        "distinct_kernels": 32,
        "runs": runs,
    }


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_compile_cache_plot_is_written(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "compile_cache.png"
    plots.compile_cache(
        [compile_cache_result("smoke", 1.0), compile_cache_result("fp8_gemv", 3.0)], path
    )
    assert_png(path)


def test_compile_cache_plot_takes_a_result_without_a_kernel_name(tmp_path: Path) -> None:
    """The first stored results (bench/results/compile_cache.json) predate the kernel field."""
    result = compile_cache_result("smoke", 1.0)
    del result["kernel"], result["machine"]
    plots.compile_cache([result], tmp_path / "c.png")
    assert_png(tmp_path / "c.png")


@pytest.mark.parametrize("goals", [None, {"prepare_s": {1: 100.0, 8: 150.0}}])
def test_startup_plot_is_written(tmp_path: Path, goals) -> None:
    series = {"before": [startup_report(0.3), startup_report(0.35)], "after": [startup_report(0.2)]}
    path = tmp_path / "startup.png"
    plots.startup(series, path, goals)
    assert_png(path)


def test_startup_plot_skips_failed_workers_and_missing_counts(tmp_path: Path) -> None:
    failed = startup_report(0.2, workers=(2,))
    failed["runs"][0]["results"][1] = {"worker": 1, "error": "RuntimeError: boom"}
    plots.startup({"a": [startup_report(0.3, workers=(1,))], "b": [failed]}, tmp_path / "s.png")
    assert_png(tmp_path / "s.png")


@pytest.mark.parametrize("shapes", [1, 5])
def test_dense_mlp_plot_is_written(tmp_path: Path, shapes: int) -> None:
    """Four panels to a row; a shape without a method's column leaves that line out."""
    rows = [
        {"shape": f"s{i}", "tokens": m, "mlpjit_us": 10.0 + m, "floor_us": 7.0}
        | ({"stock_us": 90.0} if i else {})
        for i in range(shapes)
        for m in (1, 2, 4, 8)
    ]
    path = tmp_path / "dense.png"
    plots.dense_mlp({"meta": {"gpu": "H200"}, "results": rows}, path, ("mlpjit", "stock", "floor"))
    assert_png(path)
