"""mlpjit.device on the CPU: what a device means for the kernels, with torch.cuda faked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mlpjit import device

SMS = 132  # the SM count kernels are planned for off CUDA (H200, H100 SXM)


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """torch.cuda answering for two GPUs: an H20 (sm 9.0, 78 SMs) and an A100 (sm 8.0)."""
    gpus = [
        {"name": "NVIDIA H20", "capability": (9, 0), "sms": 78},
        {"name": "NVIDIA A100", "capability": (8, 0), "sms": 108},
    ]

    def index(dev: torch.device) -> int:
        return dev.index

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: len(gpus))
    monkeypatch.setattr(cuda, "current_device", lambda: 1)
    monkeypatch.setattr(cuda, "get_device_capability", lambda d: gpus[index(d)]["capability"])
    monkeypatch.setattr(cuda, "get_device_name", lambda d: gpus[index(d)]["name"])
    monkeypatch.setattr(
        cuda,
        "get_device_properties",
        lambda d: SimpleNamespace(multi_processor_count=gpus[index(d)]["sms"]),
    )
    return gpus


@pytest.mark.parametrize("name", ["cpu", "meta"])
def test_off_cuda_no_kernels_and_the_default_sm_count(name: str) -> None:
    assert device.kernel_arch(torch.device(name)) is None
    assert device.device_sms(torch.device(name)) == SMS


def test_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.current_cuda_device() is None
    assert device.visible_gpus() == []


def test_hopper_runs_the_kernels_others_do_not(fake_gpus: list[dict]) -> None:
    assert device.kernel_arch(torch.device("cuda", 0)) == "sm_90a"
    assert device.kernel_arch(torch.device("cuda", 1)) is None
    assert device.device_sms(torch.device("cuda", 0)) == 78
    assert device.current_cuda_device() == torch.device("cuda", 1)
    assert device.KERNEL_ARCHS == {(9, 0): "sm_90a"}


def test_visible_gpus_as_plain_data(fake_gpus: list[dict]) -> None:
    assert device.visible_gpus() == [
        {"index": 0, "name": "NVIDIA H20", "capability": "9.0", "kernel_arch": "sm_90a", "sms": 78},
        {"index": 1, "name": "NVIDIA A100", "capability": "8.0", "kernel_arch": None, "sms": 108},
    ]
