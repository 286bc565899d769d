"""The tiny transformers models of the CPU tests, shared by the modules that need them:
one (fp8, bf16) pair per architecture at SMALL sizes, built once per test module, and one
CPU thread while they run. A test module imports the fixtures it uses."""

from __future__ import annotations

import pytest
import torch

from mlpjit.testing.tiny_models import ARCHS, build_pair

# Small sizes (multiples of 128) for the CPU: hidden, dense intermediate, shared intermediate.
SMALL = (256, 512, 128)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one CPU thread is fastest (several compete with each other and with any
    other load on the machine: 100x slower steps were seen with 2 threads on 2 cores)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module", params=list(ARCHS))
def pair(request):
    """(arch, fp8 model, bf16 model) on the CPU at SMALL sizes."""
    fp8, bf16 = build_pair(request.param, *SMALL, device="cpu")
    return request.param, fp8, bf16
