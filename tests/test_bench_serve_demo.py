"""scripts/serve_demo.py and mlpjit/bench/serve_demo.py: the compile side of a multi-worker
start-up, on CPU (the script run with the installed package, no PYTHONPATH of ours)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlpjit.bench import serve_demo

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "serve_demo.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises the CPU compile-only mode")
def test_two_cold_workers_compile_each_kernel_once(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    env = dict(os.environ)
    args = ["--workers", "2", "--cold", "--arch", "sm_90a", "--layers", "2", "--tokens", "1"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    results = data["results"]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["mode"] == "compile-only" for r in results)
    # Two kernels (gate_up, down) for m=1, shared by both layers: compiled once in total.
    assert sum(r["compiles"] for r in results) == 2
    for r in results:
        # 2 layers x 2 requests, each a hit, a compile, or ready after a lock wait.
        assert r["hits"] + r["compiles"] + r["lock_waits"] >= 4
        assert r["import_ms"] > 0 and r["prepare_ms"] > 0
        assert "capture_ms" not in r
    assert "| worker | mode |" in done.stdout
    assert "total: 2 compiles" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises the CPU compile-only mode")
def test_no_gpu_and_no_arch_is_a_usage_error() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MLPJIT_ARCH"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--workers", "1"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    assert "--arch" in done.stderr


def test_format_table_has_the_worker_phases() -> None:
    """The table is testing.layers.startup_table's (tested with tp_demo's) with a worker
    column and the spawn, import and build phases."""
    head, _, row = serve_demo.format_table([{"rank": 1, "error": "Traceback ..."}]).splitlines()
    assert head.startswith("| worker | mode | spawn ms | import ms | build ms | prepare ms |")
    assert row.startswith("| 1 | error |") and len(row.split("|")) == len(head.split("|"))
