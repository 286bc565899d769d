"""scripts/gpu_requests.py as the GPU run uses it: every source's kernels, as JSON lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlpjit.bench import dense_mlp_bench, launch, transformers_bench
from mlpjit.jit.spec import KernelRequest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_requests.py"


def test_the_list_includes_the_package_benchmarks(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "requests.jsonl"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--arch", "sm_90a", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    listed = [KernelRequest.from_json_line(line) for line in out.read_text().splitlines()]
    assert len(listed) == len(set(map(repr, listed)))  # no duplicates
    benchmarks = (dense_mlp_bench, launch, transformers_bench)
    for r in (r for bench in benchmarks for r in bench.kernel_requests("sm_90a")):
        assert r in listed
    assert f"{len(listed)} requests -> {out}" in done.stderr
