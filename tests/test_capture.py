"""mlpjit.jit.capture on the CPU: torch's view and the driver's view, with CUDA faked."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mlpjit.errors import MlpjitError
from mlpjit.jit import capture

REPO = Path(__file__).resolve().parent.parent


def test_costs_nothing_without_torch() -> None:
    """The compile manager asks on machines that never import torch: no import, False."""
    code = (
        "import sys; from mlpjit.jit import capture;"
        "assert capture.current_stream_capturing() is False;"
        "assert capture.current_stream_capturing(0) is False;"
        "assert 'torch' not in sys.modules, 'capture imported torch'; print('ok')"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


@pytest.mark.parametrize("name", ["cpu", "meta"])
def test_devices_off_cuda_never_capture(name: str) -> None:
    assert capture.current_stream_capturing(torch.device(name)) is False


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict:
    """torch.cuda with one device whose current stream captures while state["capturing"]."""
    state = {"capturing": True, "entered": []}

    @contextlib.contextmanager
    def device(which):
        state["entered"].append(which)
        yield

    def is_capturing() -> bool:
        if isinstance(state["capturing"], Exception):
            raise state["capturing"]
        return state["capturing"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", is_capturing)
    return state


def test_current_and_explicit_device(fake_cuda: dict) -> None:
    assert capture.current_stream_capturing() is True
    assert capture.current_stream_capturing(torch.device("cuda", 1)) is True
    assert capture.current_stream_capturing(2) is True
    assert fake_cuda["entered"] == [torch.device("cuda", 1), 2]  # asked on that device
    fake_cuda["capturing"] = False
    assert capture.current_stream_capturing() is False
    assert capture.current_stream_capturing(0) is False


def test_a_broken_cuda_is_no_capture_only_for_the_current_device(fake_cuda: dict) -> None:
    """The manager's guard (no device) must not fail on a broken setup; a caller naming a
    device is about to use it and hears the error."""
    fake_cuda["capturing"] = RuntimeError("CUDA driver broken")
    assert capture.current_stream_capturing() is False
    with pytest.raises(RuntimeError, match="driver broken"):
        capture.current_stream_capturing(torch.device("cuda", 0))


def test_without_cuda_the_current_device_never_captures(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert capture.current_stream_capturing() is False


class _FakeDriver:
    """cuStreamIsCapturing of cuda.bindings.driver, per handle."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=0)
    CUstreamCaptureStatus = SimpleNamespace(
        CU_STREAM_CAPTURE_STATUS_NONE=0, CU_STREAM_CAPTURE_STATUS_ACTIVE=1
    )

    def __init__(self, status: dict[int, int]) -> None:
        self.status = status

    def cuStreamIsCapturing(self, handle: int) -> tuple:  # noqa: N802 (CUDA's name)
        if handle not in self.status:
            return (400, None)  # CUDA_ERROR_INVALID_HANDLE
        return (0, self.status[handle])

    def cuGetErrorName(self, err: int) -> tuple:  # noqa: N802
        return (0, b"CUDA_ERROR_INVALID_HANDLE")

    def cuGetErrorString(self, err: int) -> tuple:  # noqa: N802
        return (0, b"invalid resource handle")


def test_raw_stream_handles(monkeypatch) -> None:
    monkeypatch.setattr(capture, "_driver", _FakeDriver({7: 0, 9: 1}))
    assert capture.stream_capturing(0) is False  # the legacy default stream: never
    assert capture.stream_capturing(7) is False
    assert capture.stream_capturing(9) is True
    with pytest.raises(MlpjitError, match=r"cuStreamIsCapturing failed: CUDA_ERROR_INVALID"):
        capture.stream_capturing(5)
