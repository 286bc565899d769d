"""mlpjit/bench/launch.py without a GPU: the kernel it needs, and the refusal to run."""

from __future__ import annotations

import pytest
import torch

from mlpjit.bench import launch


def test_the_kernel_is_the_smoke_kernel() -> None:
    (request,) = launch.kernel_requests("sm_90a")
    assert request.kernel == "smoke" and request.arch == "sm_90a"
    assert dict(request.params) == launch.SMOKE


@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises the no-GPU path")
def test_no_gpu_is_an_error(capsys) -> None:
    assert launch.main([]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
