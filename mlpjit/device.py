"""What a torch device means for mlpjit: does it run the fp8_gemv kernels, and how many SMs
size their persistent grids.

DenseMlp plans its kernels with these facts, `mlpjit warm` targets the local GPU with them,
and `mlpjit doctor` reports them, so all three agree on what a GPU can do. torch is imported
here; callers that must stay cheap without a GPU (cli, doctor) import this module lazily.
"""

from __future__ import annotations

from typing import Any

import torch

from mlpjit.kernels.hopper import SMS

__all__ = [
    "KERNEL_ARCHS",
    "check_device",
    "current_cuda_device",
    "default_device",
    "device_sms",
    "kernel_arch",
    "visible_gpus",
]

# Compute capability -> the target arch the fp8_gemv kernels are compiled for. Not listed:
# no kernels; DenseMlp runs the stock path (or the reference off Hopper).
KERNEL_ARCHS = {(9, 0): "sm_90a"}


def kernel_arch(device: torch.device) -> str | None:
    """The fp8_gemv target arch for ``device`` ("sm_90a" on Hopper), or None: no kernels."""
    if device.type != "cuda":
        return None
    return KERNEL_ARCHS.get(tuple(torch.cuda.get_device_capability(device)))


def device_sms(device: torch.device) -> int:
    """The SM count of a CUDA ``device`` (plans the persistent grids; SMS off CUDA)."""
    if device.type != "cuda":
        return SMS
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def current_cuda_device() -> torch.device | None:
    """torch's current CUDA device, or None when no CUDA GPU is visible."""
    if not torch.cuda.is_available():
        return None
    return torch.device("cuda", torch.cuda.current_device())


def default_device() -> torch.device:
    """Where new tensors go when the caller names no device: torch's current CUDA device
    when a GPU is visible, else the CPU (so a CPU-only machine never asks for CUDA)."""
    device = current_cuda_device()
    return torch.device("cpu") if device is None else device


def visible_gpus() -> list[dict[str, Any]]:
    """Every visible CUDA device as plain data: index, name, capability ("9.0"),
    kernel_arch (None: no fp8_gemv kernels, the stock path) and sms. [] without CUDA."""
    if not torch.cuda.is_available():
        return []
    devices = []
    for i in range(torch.cuda.device_count()):
        device = torch.device("cuda", i)
        major, minor = torch.cuda.get_device_capability(device)
        devices.append(
            {
                "index": i,
                "name": torch.cuda.get_device_name(device),
                "capability": f"{major}.{minor}",
                "kernel_arch": kernel_arch(device),
                "sms": device_sms(device),
            }
        )
    return devices


def check_device(device: object) -> torch.device:
    """``device`` as a torch.device that checkpoint tensors can be put on: "cpu", or a CUDA
    device that exists here ("cuda", "cuda:N"); a one-line ValueError naming it otherwise."""
    allowed = "'cpu', 'cuda' or 'cuda:N' (a torch.device or its name)"
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device must be {allowed}, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device must be {allowed}, got {device!r:.60}") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(f"device must be {allowed}, got {device!r:.60}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dev.index is not None and dev.index >= count or count == 0:
        raise ValueError(
            f"device {device!r:.60} is not available: {count} CUDA devices visible "
            f"(device must be {allowed})"
        )
    return dev
