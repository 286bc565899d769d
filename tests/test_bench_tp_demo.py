"""scripts/tp_demo.py and mlpjit/bench/tp_demo.py on CPU: the dry run, usage errors, the
CPU emulation end to end, the table and the real mode's failure path.

The script runs as a user runs it: with the installed package, no PYTHONPATH of ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlpjit.bench import tp_demo

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "tp_demo.py"


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_dry_run_checks_every_rank_without_cuda() -> None:
    done = _run("--dry-run")
    assert done.returncode == 0, done.stderr
    assert "w13 [3072, 6144] s13 [24, 48], w2 [6144, 1536] s2 [48, 12]" in done.stdout
    assert "checked for ranks 0..7" in done.stdout
    assert "kernel_requests: 16 kernels" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "5"], "--tp"),
        (["--tp", "0"], "--tp"),
        (["--tokens", "0-3"], "--tokens"),
        (["--tokens", "1-9"], "1..8"),
        (["--tokens", "1,2", "--check-tokens", "8"], "--check-tokens"),
        (["--layers", "x"], "--layers"),
        (["--hidden", "500"], "hidden"),
    ],
)
def test_bad_args_are_usage_errors(args: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        tp_demo.parse_args([*args, "--dry-run"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises the no-GPU paths")
def test_no_gpu_needs_dry_run_or_emulate() -> None:
    done = _run("--tp", "2")
    assert done.returncode == 2
    assert "--dry-run" in done.stderr and "--emulate" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises the CPU emulation")
def test_cpu_emulation_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    args = ["--emulate", "--hidden", "512", "--intermediate", "2048", "--tp", "4"]
    args += ["--layers", "2", "--tokens", "1-3", "--check-tokens", "1,3", "--json", str(out)]
    done = _run(*args)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["mode"] == "emulated" and data["passed"] is True
    assert [r["rank"] for r in data["results"]] == [0, 1, 2, 3]
    assert set(data["check_rel_l2"]) == {"1", "3"}
    assert all(0 < v < 1e-2 for v in data["check_rel_l2"].values())
    assert all(len(e["layers"]) == 2 for e in data["check"].values())
    assert set(data["emulation"]["bf16_sum"]) == {"1", "3"}
    assert all(r["paths"] == ["reference"] and "step_us" not in r for r in data["results"])
    assert data["env"]["NCCL_NVLS_ENABLE"] is None or data["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert "EMULATION" in done.stdout and "not covered" in done.stdout.lower()
    assert "-> PASS" in done.stdout and "| rank | mode |" in done.stdout


def test_format_table() -> None:
    ok = {
        "rank": 0,
        "mode": "real",
        "import_ms": 2000.0,
        "init_ms": 900.0,
        "build_ms": 50.0,
        "prepare_ms": 30.0,
        "hits": 48,
        "compiles": 0,
        "compile_seconds": 0.0,
        "lock_waits": 0,
        "wait_seconds": 0.0,
        "cutlass_imported": False,
        "capture_ms": 120.0,
        "step_us": {"1": 61.5, "8": 70.25},
    }
    table = tp_demo.format_table([ok, {"rank": 1, "error": "Traceback ..."}])
    lines = table.splitlines()
    assert lines[0].startswith("| rank | mode | import ms | init ms | build ms | prepare ms |")
    assert len(lines[0].split("|")) == len(lines[2].split("|")) == len(lines[3].split("|"))
    assert "61.5 / 70.2" in lines[2] and "| 900 |" in lines[2]
    assert lines[3].startswith("| 1 | error |")
    assert "total: 0 compiles, 48 hits" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises the failure path without CUDA")
def test_real_mode_collects_each_rank_failure() -> None:
    """Spawn, per-rank JSON and clean-up: without CUDA every rank fails and says why."""
    code = (
        "import json; from mlpjit.bench import tp_demo; "
        "opts = dict(tp=2, layers=1, hidden=512, intermediate=2048, "
        "tokens=[1], check_tokens=[1], steps=1, timeout=120); "
        "print(json.dumps(tp_demo.run_real(opts)))"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["rank"] for r in results] == [0, 1]
    assert all("error" in r and "Traceback" in r["error"] for r in results)
