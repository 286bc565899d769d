"""Shared fixtures: every CPU test gets its own private, empty compile cache.

tests/gpu is left alone so a run on the GPU machine can use a prebuilt cache it was given
(MLPJIT_CACHE_DIR=.gpu-cache, see the README's GPU section).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import mlpjit.kernels  # noqa: F401  (registers fp8_gemv)
import mlpjit.testing.smoke  # noqa: F401  (registers the smoke kernel)

REPO = Path(__file__).resolve().parent.parent
GPU_TESTS = REPO / "tests" / "gpu"
WORKER = REPO / "tests" / "cache_worker.py"


@pytest.fixture(autouse=True)
def isolated_cache(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch) -> Path | None:
    """Point MLPJIT_CACHE_DIR at a fresh dir under tmp_path; clear the other MLPJIT_* vars."""
    if GPU_TESTS in Path(str(request.node.path)).parents:
        return None
    root = tmp_path / "mlpjit-cache"
    monkeypatch.setenv("MLPJIT_CACHE_DIR", str(root))
    for name in (
        "MLPJIT_CACHE_PATH",
        "MLPJIT_CACHE_WHEELS",
        "MLPJIT_RECORD",
        "MLPJIT_LOCK_TIMEOUT",
        "MLPJIT_ARCH",
        "MLPJIT_KERNEL_MODULES",
        "MLPJIT_REMOTE_CACHE",
        "MLPJIT_REMOTE_PREFIX",
        "MLPJIT_REMOTE_TTL",
        "MLPJIT_REMOTE_TIMEOUT",
        "MLPJIT_REMOTE_KEY_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.fixture
def cache_dir(isolated_cache: Path | None) -> Path:
    """The isolated cache root of this test (MLPJIT_CACHE_DIR)."""
    assert isolated_cache is not None
    return isolated_cache


def smoke_params(i: int) -> dict:
    """Distinct, cheap smoke-kernel parameters number ``i``."""
    return {"n": 1024 + 32 * i, "scale": 2.0, "block": 128}


@pytest.fixture
def smoke_request() -> Callable:
    """Factory: smoke_request(i, arch="sm_90a") -> KernelRequest of smoke kernel number i."""
    from mlpjit.jit.spec import KernelRequest

    def make(i: int = 0, arch: str = "sm_90a"):
        return KernelRequest("smoke", smoke_params(i), arch)

    return make


@pytest.fixture
def run_worker() -> Callable:
    """Start tests/cache_worker.py with a JSON spec; returns the Popen (stdout piped)."""

    def start(spec: str, env: dict | None = None, prefix: tuple[str, ...] = ()):
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p
        )
        full_env.update(env or {})
        return subprocess.Popen(
            [*prefix, sys.executable, str(WORKER), spec],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            text=True,
        )

    return start


@pytest.fixture(scope="module")
def exact_fp32_matmul():
    """The reference's fp32 GEMMs must not run in TF32 (whatever an earlier test set); the
    GPU test modules use it."""
    import torch

    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous
