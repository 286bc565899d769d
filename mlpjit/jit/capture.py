"""Is a CUDA graph being captured? The one place mlpjit asks.

A compile, a module load, a wait on a file lock or a host sync inside a capture either
breaks the capture or cannot be replayed, so every step that would do one asks here first
and refuses (CaptureError) or skips (the weight-scale value check) while capturing.

Two questions, two functions:

- ``current_stream_capturing(device)``: is torch's current stream of ``device`` (default:
  the current device) capturing? For loads, compiles and checks, once per event.
- ``stream_capturing(handle)``: is the raw CUstream ``handle`` capturing? One driver query,
  for DenseMlp's per-call path, which already holds the current stream's handle.

torch is looked up in ``sys.modules``, never imported here: a process that has not imported
torch cannot be capturing with it, and the compile manager (which also runs on build
machines without torch's CUDA) asks at no cost.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["current_stream_capturing", "stream_capturing"]

# cuda.bindings.driver, taken from the launcher (which imports it and calls cuInit) on the
# first nonzero handle; kept here so the per-call query does no import.
_driver: Any = None


def current_stream_capturing(device: Any = None) -> bool:
    """True when torch's current stream of ``device`` is capturing a CUDA graph.

    ``device``: a torch.device or a CUDA device index; a non-CUDA device never captures.
    None asks about the current device and answers False when CUDA is unavailable or its
    query fails (a broken CUDA setup is not a capture: the compile manager's guard must not
    turn it into an error). With an explicit device, errors propagate: the caller is about
    to use that device and should hear why it cannot.
    """
    torch = sys.modules.get("torch")
    if torch is None:  # never imported: nobody can be capturing with it
        return False
    if device is None:
        try:
            return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
        except Exception:  # noqa: BLE001 (see the docstring)
            return False
    if isinstance(device, torch.device) and device.type != "cuda":
        return False
    with torch.cuda.device(device):
        return bool(torch.cuda.is_current_stream_capturing())


def stream_capturing(handle: int) -> bool:
    """True when the CUDA stream ``handle`` is capturing a graph (or its capture failed).

    Handle 0, the legacy default stream, never is: capture there is not allowed. Raises
    MlpjitError naming the CUDA error if the driver query fails.
    """
    if handle == 0:
        return False
    driver = _driver if _driver is not None else _load_driver()
    result = driver.cuStreamIsCapturing(handle)
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        from mlpjit.jit.launcher import check_cuda

        check_cuda(driver, result, "cuStreamIsCapturing")
    return result[1] != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def _load_driver() -> Any:
    """cuda.bindings.driver from the launcher, which imports it and calls cuInit once."""
    global _driver
    from mlpjit.jit.launcher import cuda_driver

    _driver = cuda_driver()
    return _driver
