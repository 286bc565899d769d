"""Launcher on the GPU: load the smoke kernel from a prebuilt cache, launch, graphs, capture.

The kernel is compiled beforehand on a CPU machine (no compiler needed here):
    MLPJIT_CACHE_DIR=.gpu-cache python3 -m mlpjit warm --kernel smoke --param n=4096 \
        --param scale=2.0 --param block=128 --arch sm_90a
then on the GPU machine: MLPJIT_CACHE_DIR=.gpu-cache python3 -m pytest -q tests/gpu.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mlpjit.errors import CaptureError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SMOKE = {"n": 4096, "scale": 2.0, "block": 128}


def kernel_requests(arch: str = "sm_90a") -> list:
    """The compile requests these tests use (for warming a cache without a GPU)."""
    from mlpjit.jit.spec import KernelRequest

    return [KernelRequest("smoke", dict(SMOKE), arch)]


@pytest.fixture(scope="module")
def entry():
    """The smoke entry from the cache (an alias hit when the compiler is not installed)."""
    from mlpjit.jit.manager import default_manager

    return default_manager().get(kernel_requests()[0])


@pytest.fixture(scope="module")
def kernel(entry):
    from mlpjit.jit.launcher import load_kernel

    return load_kernel(entry, torch.device("cuda", torch.cuda.current_device()))


def tensors() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(SMOKE["n"], device="cuda")
    return torch.full_like(x, float("nan")), x


@pytest.mark.parametrize("pdl", [None, True, False])
def test_launch_computes(kernel, pdl) -> None:
    out, x = tensors()
    kernel.launch((out, x), pdl=pdl)
    torch.cuda.synchronize()
    assert torch.equal(out, x * SMOKE["scale"])


def test_launch_on_a_side_stream(kernel) -> None:
    out, x = tensors()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernel.launch((out, x))
    kernel.launch((out, x), stream=stream)  # explicit stream argument, same stream
    stream.synchronize()
    assert torch.equal(out, x * SMOKE["scale"])


def in_a_fresh_thread(work) -> None:
    """Run ``work()`` in a new thread (no driver context made current yet) and synchronize
    there; its exception, if any, is raised here."""
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
            torch.cuda.synchronize()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not errors, errors


def test_unchecked_launch_from_a_fresh_thread(kernel) -> None:
    """A new thread on the default stream (no driver context made current yet), both the
    checked and the unchecked launch."""
    out, x = tensors()
    out2 = torch.full_like(out, float("nan"))
    torch.cuda.synchronize()

    def work() -> None:
        kernel.launch_unchecked((out.data_ptr(), x.data_ptr()))
        kernel.launch((out2, x))

    in_a_fresh_thread(work)
    assert torch.equal(out, x * SMOKE["scale"]) and torch.equal(out2, out)


def test_chain_of_pdl_launches(kernel) -> None:
    """out = x*2, then y = out*2 with PDL: griddepcontrol.wait keeps the order."""
    out, x = tensors()
    y = torch.empty_like(out)
    for _ in range(20):
        kernel.launch((out, x))
        kernel.launch((y, out))
    torch.cuda.synchronize()
    assert torch.equal(y, x * SMOKE["scale"] ** 2)


def test_load_is_cached_per_key_and_device(entry, kernel) -> None:
    from mlpjit.jit.launcher import load_kernel

    assert load_kernel(entry, torch.device("cuda", kernel.device.index)) is kernel


def test_launch_inside_graph_capture(kernel) -> None:
    out, x = tensors()
    kernel.launch((out, x))  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=stream):
        kernel.launch((out, x))
    torch.cuda.synchronize()
    x.copy_(torch.randn_like(x))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x * SMOKE["scale"])


def test_loading_during_capture_raises(entry) -> None:
    from mlpjit.jit.entry import Entry
    from mlpjit.jit.launcher import load_kernel

    # Same code under a key this process has not loaded yet.
    fresh = Entry("0" * 64, entry.manifest, entry.cubin, Path("."))
    out, x = tensors()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), pytest.raises(CaptureError, match="capturing"):
        out.copy_(x)
        load_kernel(fresh, x.device)
    torch.cuda.synchronize()
    loaded = load_kernel(fresh, x.device)  # fine once the capture is over
    loaded.launch((out, x))
    torch.cuda.synchronize()
    assert torch.equal(out, x * SMOKE["scale"])


def test_bad_arguments_on_the_gpu(kernel) -> None:
    out, x = tensors()
    with pytest.raises(ValueError, match="'x' must be on cuda"):
        kernel.launch((out, x.cpu()))
    with pytest.raises(ValueError, match="'out' must be contiguous"):
        kernel.launch((torch.empty(2 * SMOKE["n"], device="cuda")[::2], x))


def test_kernel_pair_chains_two_launches(kernel) -> None:
    """KernelPair (DenseMlp's call): out = x*2, then y = out*2, on the default stream, on a
    side stream, inside a graph capture and from a fresh thread (no driver context yet)."""
    from mlpjit.jit.launcher import KernelPair

    pair = KernelPair(kernel, kernel)
    out, x = tensors()
    y = torch.full_like(out, float("nan"))
    want = x * SMOKE["scale"] ** 2

    def launch(stream: int, pdl: bool | None = None) -> None:
        pair.launch((out.data_ptr(), x.data_ptr()), (y.data_ptr(), out.data_ptr()), pdl, stream)

    for pdl in (None, False):
        launch(torch.cuda.current_stream().cuda_stream, pdl)
        torch.cuda.synchronize()
        assert torch.equal(y, want)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    y.fill_(float("nan"))
    with torch.cuda.stream(side):
        launch(side.cuda_stream)
    side.synchronize()
    assert torch.equal(y, want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        launch(side.cuda_stream)
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, want)
    y.fill_(float("nan"))
    torch.cuda.synchronize()
    in_a_fresh_thread(lambda: launch(0))
    assert torch.equal(y, want)
