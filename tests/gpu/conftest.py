"""Fixtures of the GPU tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def exact_fp32_matmul() -> Iterator[None]:
    """The reference's fp32 GEMMs must not run in TF32 (whatever an earlier test set)."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous
