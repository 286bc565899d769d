"""scripts/serve_demo.py: the compile side of a multi-worker start-up, on CPU (run with the
installed package, no PYTHONPATH of ours)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

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


def test_format_table_marks_failed_workers() -> None:
    demo = load_script("serve_demo")
    ok = {
        "rank": 0,
        "mode": "gpu",
        "spawn_ms": 400.0,
        "import_ms": 2000.0,
        "build_ms": 50.0,
        "prepare_ms": 30.0,
        "hits": 48,
        "compiles": 0,
        "compile_seconds": 0.0,
        "lock_waits": 0,
        "wait_seconds": 0.0,
        "cutlass_imported": False,
        "capture_ms": 120.0,
        "step_us": {"1": 21.5, "8": 24.25},
    }
    table = demo.format_table([ok, {"rank": 1, "error": "Traceback ..."}])
    lines = table.splitlines()
    assert len(lines[0].split("|")) == len(lines[2].split("|")) == len(lines[3].split("|"))
    assert "21.5 / 24.2" in lines[2]
    assert lines[3].startswith("| 1 | error |")
    assert "total: 0 compiles, 48 hits" in table
