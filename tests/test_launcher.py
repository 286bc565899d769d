"""Launcher on the CPU: argument validation and packing, the cubin parameter-list check."""

from __future__ import annotations

import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mlpjit.jit.binary import KernelBinary, KernelParam
from mlpjit.jit.launcher import PARAM_SIZES, LoadedKernel, load_kernel
from mlpjit.jit.manager import CompileManager
from mlpjit.jit.spec import KernelRequest
from mlpjit.jit.store import CacheStore
from mlpjit.testing.cubin_info import cubin_kernel_params, find_cuobjdump, param_mismatches

REPO = Path(__file__).resolve().parent.parent


def fake_binary(*params: KernelParam) -> KernelBinary:
    return KernelBinary(
        cubin=b"",
        symbol="k",
        grid=(1, 1, 1),
        block=(32, 1, 1),
        smem_bytes=0,
        pdl=True,
        params=params,
    )


@pytest.fixture
def kernel() -> LoadedKernel:
    """A LoadedKernel without a driver function: validation happens before any CUDA call."""
    binary = fake_binary(
        KernelParam("out", "ptr"), KernelParam("n", "i32"), KernelParam("a", "f32")
    )
    return LoadedKernel("ab" * 32, binary, device_index=0)


@pytest.fixture(scope="module")
def smoke_binary(tmp_path_factory: pytest.TempPathFactory) -> KernelBinary:
    """A real smoke-kernel cubin compiled for sm_90a through the cache."""
    store = CacheStore(tmp_path_factory.mktemp("smoke") / "cache", read_only=())
    request = KernelRequest("smoke", {"n": 1000, "scale": 0.5, "block": 256}, "sm_90a")
    return CompileManager(store).get(request).binary()


def test_pack_i32_and_f32_bit_patterns() -> None:
    binary = fake_binary(KernelParam("n", "i32"), KernelParam("a", "f32"))
    k = LoadedKernel("cd" * 32, binary, device_index=0)
    assert k.pack([7, 1.0]) == (7, 0x3F800000)
    assert k.pack([-1, -2.5]) == (0xFFFFFFFF, struct.unpack("<I", struct.pack("<f", -2.5))[0])
    assert k.pack([2**31 - 1, 3]) == (2**31 - 1, 0x40400000)  # an int is fine for f32


@pytest.mark.parametrize(
    "args, match",
    [
        ([], "takes 3 arguments"),
        ([None, 1, 1.0, 4], "takes 3 arguments"),
        ([5, 1, 1.0], "'out' must be a torch.Tensor"),
        ([torch.zeros(4), 1, 1.0], "'out' must be on cuda:0"),
    ],
)
def test_launch_rejects_bad_pointer_args(kernel: LoadedKernel, args: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        kernel.launch(args)


@pytest.mark.parametrize(
    "value, match",
    [
        (2**31, "does not fit in i32"),
        (-(2**31) - 1, "does not fit in i32"),
        (1.5, "must be an int"),
        (True, "must be an int"),
        ("3", "must be an int"),
    ],
)
def test_bad_i32(value: object, match: str) -> None:
    k = LoadedKernel("ef" * 32, fake_binary(KernelParam("n", "i32")), device_index=0)
    with pytest.raises(ValueError, match=f"'n'.*{match}|{match}"):
        k.pack([value])


@pytest.mark.parametrize("value", ["1.0", None, torch.tensor(1.0), 1e39])
def test_bad_f32(value: object) -> None:
    k = LoadedKernel("ef" * 32, fake_binary(KernelParam("a", "f32")), device_index=0)
    with pytest.raises(ValueError, match="'a'"):
        k.pack([value])


def test_load_kernel_needs_a_cuda_device(smoke_binary: KernelBinary) -> None:
    from mlpjit.jit.entry import Entry

    entry = Entry("12" * 32, {}, smoke_binary.cubin, Path("."))
    with pytest.raises(ValueError, match="CUDA device"):
        load_kernel(entry, torch.device("cpu"))


def test_launcher_import_is_lazy() -> None:
    """Importing the launcher adds no cuda-python or cutlass module beyond what torch loads."""
    code = (
        "import sys, torch; before=set(sys.modules);"
        "import mlpjit.jit.launcher, mlpjit.testing.cubin_info;"
        "bad=[m for m in set(sys.modules)-before if m.startswith(('cuda','cutlass'))];"
        "bad+=[m for m in sys.modules if m.startswith('cutlass')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_cuobjdump_is_available() -> None:
    assert Path(find_cuobjdump()).is_file()


def test_smoke_manifest_params_match_the_cubin(smoke_binary: KernelBinary) -> None:
    found = cubin_kernel_params(smoke_binary.cubin, smoke_binary.symbol)
    assert [p.ordinal for p in found] == list(range(len(smoke_binary.params)))
    assert [p.size for p in found] == [PARAM_SIZES[p.kind] for p in smoke_binary.params]
    assert [p.offset for p in found] == [0, 8]
    assert param_mismatches(smoke_binary) == []


def test_param_check_catches_a_wrong_manifest(smoke_binary: KernelBinary) -> None:
    extra = replace(smoke_binary, params=(*smoke_binary.params, KernelParam("n", "i32")))
    assert any("manifest lists 3 parameters, cubin has 2" in p for p in param_mismatches(extra))
    wrong = replace(smoke_binary, params=(KernelParam("out", "ptr"), KernelParam("x", "i32")))
    assert any("'x' is i32 (4 bytes) but 8 bytes" in p for p in param_mismatches(wrong))


def test_unknown_symbol_is_reported(smoke_binary: KernelBinary) -> None:
    from mlpjit.errors import MlpjitError

    with pytest.raises(MlpjitError, match="no .nv.info.nope section"):
        cubin_kernel_params(smoke_binary.cubin, "nope")


class _RecordingDriver:
    """The real cuda.bindings.driver types, with the launch call recorded instead of made."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        self._real = driver
        self.calls: list[tuple] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def cuLaunchKernelEx(self, config, function, params, extra):  # noqa: N802 (CUDA's name)
        from ctypes import c_uint32, c_void_p

        count = 2
        pointers = (c_void_p * count).from_address(params)
        values = tuple(c_uint32.from_address(pointers[i]).value for i in range(count))
        self.calls.append((config, function, values, extra))
        return (self._real.CUresult.CUDA_SUCCESS,)


def test_launch_builds_the_config_and_parameter_array(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exercise launch() down to cuLaunchKernelEx with real cuda-python structs (no GPU)."""
    from mlpjit.jit import launcher

    fake = _RecordingDriver()
    monkeypatch.setattr(launcher, "_driver_module", fake)
    binary = replace(
        fake_binary(KernelParam("n", "i32"), KernelParam("a", "f32")),
        grid=(7, 2, 1),
        block=(128, 1, 1),
        smem_bytes=60000,
    )
    k = LoadedKernel("aa" * 32, binary, device_index=0, function="FUNC")
    k.launch([5, 1.0], stream=1234)
    k.launch([-3, 2.0], stream=1234, pdl=False)
    k.launch([6, 0.5], stream=1234)
    (c1, f1, v1, e1), (c2, _, v2, _), (c3, _, v3, _) = fake.calls
    assert f1 == "FUNC" and e1 == 0
    assert v1 == (5, 0x3F800000) and v2 == (0xFFFFFFFD, 0x40000000) and v3 == (6, 0x3F000000)
    assert (c1.gridDimX, c1.gridDimY, c1.gridDimZ) == (7, 2, 1)
    assert (c1.blockDimX, c1.blockDimY, c1.blockDimZ) == (128, 1, 1)
    assert c1.sharedMemBytes == 60000 and int(c1.hStream) == 1234
    assert c1.numAttrs == 1 and c2.numAttrs == 0
    attr = c1.attrs[0]
    assert attr.id == fake.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1
    assert c3 is c1  # configs are built once per (stream, pdl)


def test_cluster_launch_sets_the_cluster_dimension(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster kernel launches with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, with or without
    PDL; a plain kernel never gets the attribute."""
    from mlpjit.jit import launcher

    fake = _RecordingDriver()
    monkeypatch.setattr(launcher, "_driver_module", fake)
    params = (KernelParam("n", "i32"), KernelParam("a", "f32"))
    binary = replace(fake_binary(*params), grid=(132, 1, 1), cluster=(2, 1, 1))
    k = LoadedKernel("cc" * 32, binary, device_index=0, function="FUNC")
    k.launch([1, 1.0], stream=99)
    k.launch([2, 1.0], stream=99, pdl=False)
    (c1, _, _, _), (c2, _, _, _) = fake.calls
    ids = fake.CUlaunchAttributeID
    assert [a.id for a in c1.attrs] == [
        ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
    ]
    assert c1.numAttrs == 2 and c2.numAttrs == 1
    dim = c2.attrs[0].value.clusterDim
    assert c2.attrs[0].id == ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (dim.x, dim.y, dim.z) == (2, 1, 1)


def test_launch_unchecked_passes_raw_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The DenseMlp hot path: raw values go to the parameter array as given, same configs."""
    from mlpjit.jit import launcher

    fake = _RecordingDriver()
    monkeypatch.setattr(launcher, "_driver_module", fake)
    binary = fake_binary(KernelParam("n", "i32"), KernelParam("a", "f32"))
    k = LoadedKernel("bb" * 32, binary, device_index=0, function="FUNC")
    monkeypatch.setattr(k, "_stream_of", lambda index: 4321)
    k.launch_unchecked((7, 0x40400000))
    k.launch([8, 3.0], stream=4321)
    k.launch_unchecked((9, 0x3F800000), pdl=False)
    (c1, _, v1, _), (c2, _, v2, _), (c3, _, v3, _) = fake.calls
    assert v1 == (7, 0x40400000) and v2 == (8, 0x40400000) and v3 == (9, 0x3F800000)
    assert int(c1.hStream) == 4321 and c2 is c1 and c3.numAttrs == 0
    with pytest.raises(ValueError, match="takes 2 parameter slots, got 1"):
        k.launch_unchecked((1,))
    assert len(fake.calls) == 3


def _null_stream_kernel(
    monkeypatch: pytest.MonkeyPatch, fake: _RecordingDriver, *, device: int, current: int
) -> LoadedKernel:
    """A kernel on device `device` (context 77) launching on torch's default stream (handle
    0) while the runtime's current device is `current`, through `fake`."""
    from mlpjit.jit import launcher

    monkeypatch.setattr(launcher, "_driver_module", fake)
    binary = fake_binary(KernelParam("n", "i32"), KernelParam("a", "f32"))
    k = LoadedKernel("cc" * 32, binary, device_index=device, function="FUNC", context=77)
    monkeypatch.setattr(k, "_stream_of", lambda index: 0)
    monkeypatch.setattr(k, "_current_device", lambda: current)
    return k


def test_launch_unchecked_on_the_null_stream_checks_the_context_only_off_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Handle 0 is the current context's null stream: with the current device ours it is
    launched directly; otherwise the slow path compares (and switches) contexts."""
    fake = _RecordingDriver()
    queried: list[int] = []

    def current_context():  # the context in use is the kernel's own (77)
        queried.append(1)
        return (fake.CUresult.CUDA_SUCCESS, 77)

    monkeypatch.setattr(fake, "cuCtxGetCurrent", current_context, raising=False)
    k = _null_stream_kernel(monkeypatch, fake, device=1, current=1)
    k.launch_unchecked((1, 0))
    assert len(fake.calls) == 1 and not queried
    monkeypatch.setattr(k, "_current_device", lambda: 0)
    k.launch_unchecked((2, 0))
    assert len(fake.calls) == 2 and queried == [1]
    assert [c[2][0] for c in fake.calls] == [1, 2] and int(fake.calls[1][0].hStream) == 0


@pytest.mark.parametrize("error", ["CUDA_ERROR_INVALID_CONTEXT", "CUDA_ERROR_INVALID_HANDLE"])
def test_null_stream_launch_in_a_thread_without_our_context(
    monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    """A fresh thread may have no driver context yet (or another context of the device is
    current): the launch is retried with the kernel's own context pushed."""
    fake = _RecordingDriver()
    stack: list[int] = []
    real_launch = fake.cuLaunchKernelEx

    def launch(config, function, params, extra):
        if not stack:
            return (getattr(fake.CUresult, error),)
        return real_launch(config, function, params, extra)

    def push(ctx):
        stack.append(ctx)
        return (fake.CUresult.CUDA_SUCCESS,)

    def pop():
        return (fake.CUresult.CUDA_SUCCESS, stack.pop())

    monkeypatch.setattr(fake, "cuLaunchKernelEx", launch, raising=False)
    monkeypatch.setattr(
        fake, "cuCtxGetCurrent", lambda: (fake.CUresult.CUDA_SUCCESS, None), raising=False
    )
    monkeypatch.setattr(fake, "cuCtxPushCurrent", push, raising=False)
    monkeypatch.setattr(fake, "cuCtxPopCurrent", pop, raising=False)
    k = _null_stream_kernel(monkeypatch, fake, device=0, current=0)
    k.launch_unchecked((3, 0))
    assert [c[2][0] for c in fake.calls] == [3] and stack == []  # pushed 77, popped it


# ---- KernelPair: DenseMlp's two launches per call ------------------------------------------


def _pair_kernels(fake: _RecordingDriver, monkeypatch: pytest.MonkeyPatch):
    from mlpjit.jit import launcher

    monkeypatch.setattr(launcher, "_driver_module", fake)
    params = (KernelParam("n", "i32"), KernelParam("a", "f32"))
    first = LoadedKernel("1a" * 32, fake_binary(*params), device_index=0, function="GATE_UP")
    second_binary = replace(fake_binary(*params), pdl=False, grid=(3, 1, 1))
    second = LoadedKernel("2b" * 32, second_binary, device_index=0, function="DOWN")
    return first, second


def test_pair_launches_both_kernels_in_order_with_their_own_configs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlpjit.jit.launcher import KernelPair

    fake = _RecordingDriver()
    first, second = _pair_kernels(fake, monkeypatch)
    pair = KernelPair(first, second)
    pair.launch((1, 2), (3, 4), None, 555)
    pair.launch((5, 6), (7, 8), False, 555)
    pair.launch((9, 10), (11, 12), None, 555)
    functions = [call[1] for call in fake.calls]
    assert functions == ["GATE_UP", "DOWN"] * 3
    assert [call[2] for call in fake.calls] == [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12)]
    configs = [call[0] for call in fake.calls]
    # pdl None: each manifest's flag (PDL for the first only); False: off for both.
    assert [c.numAttrs for c in configs[:4]] == [1, 0, 0, 0]
    assert configs[4] is configs[0] and configs[5] is configs[1]  # built once per (stream, pdl)
    assert configs[0] is first.launch_config(555, None)  # the kernels' own configs
    assert int(configs[1].hStream) == 555 and configs[1].gridDimX == 3
    with pytest.raises(ValueError, match="take 2 and 2 parameter slots, got 2 and 3"):
        pair.launch((1, 2), (3, 4, 5), None, 555)
    assert len(fake.calls) == 6


def test_pair_on_another_devices_default_stream_takes_each_kernels_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Handle 0 while the runtime's current device is not the kernels': each kernel's
    launch_unchecked (which makes its own context current for the launch)."""
    from mlpjit.jit.launcher import KernelPair

    fake = _RecordingDriver()
    first, second = _pair_kernels(fake, monkeypatch)
    pair = KernelPair(first, second)
    own: list[tuple] = []
    for kernel in (first, second):
        monkeypatch.setattr(
            kernel, "launch_unchecked", lambda s, p=None, h=None, k=kernel: own.append((k, s, h))
        )
    monkeypatch.setattr(pair, "_current_device", lambda: 1)
    pair.launch((1, 2), (3, 4), None, 0)
    assert own == [(first, (1, 2), 0), (second, (3, 4), 0)] and fake.calls == []
    monkeypatch.setattr(pair, "_current_device", lambda: 0)
    pair.launch((5, 6), (7, 8), None, 0)  # the kernels' device is current: launched directly
    assert len(own) == 2 and [call[2] for call in fake.calls] == [(5, 6), (7, 8)]


def test_pair_retries_a_failed_launch_through_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch that fails goes again through the kernel's launch_unchecked, which retries
    with its own context or raises one line naming the call."""
    from mlpjit.errors import MlpjitError
    from mlpjit.jit.launcher import KernelPair

    fake = _RecordingDriver()
    first, second = _pair_kernels(fake, monkeypatch)
    failing = fake.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    monkeypatch.setattr(fake, "cuLaunchKernelEx", lambda *args: (failing,), raising=False)
    name = (fake.CUresult.CUDA_SUCCESS, b"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")
    monkeypatch.setattr(fake, "cuGetErrorName", lambda err: name, raising=False)
    text = (fake.CUresult.CUDA_SUCCESS, b"too many resources requested for launch")
    monkeypatch.setattr(fake, "cuGetErrorString", lambda err: text, raising=False)
    with pytest.raises(MlpjitError, match=r"cuLaunchKernelEx\(k\) failed: CUDA_ERROR_LAUNCH_OUT"):
        KernelPair(first, second).launch((1, 2), (3, 4), None, 555)


def test_pair_launch_joined_gives_each_kernel_its_own_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """launch_joined: the first kernel's slots then the second's in one sequence (kernels of
    3 and 2 parameters here), each launch reading its own, full 64-bit values; a sequence
    of another length raises before anything is launched; the paths off the fast one get
    each kernel's part."""
    from ctypes import c_uint64, c_void_p

    from mlpjit.jit import launcher
    from mlpjit.jit.launcher import KernelPair

    fake = _RecordingDriver()
    monkeypatch.setattr(launcher, "_driver_module", fake)
    counts = {"GATE_UP": 3, "DOWN": 2}
    status = {"GATE_UP": fake.CUresult.CUDA_SUCCESS, "DOWN": fake.CUresult.CUDA_SUCCESS}

    def launch(config, function, params, extra):
        pointers = (c_void_p * counts[function]).from_address(params)
        values = tuple(c_uint64.from_address(p).value for p in pointers)
        fake.calls.append((function, values))
        return (status[function],)

    monkeypatch.setattr(fake, "cuLaunchKernelEx", launch, raising=False)
    ptr = KernelParam("p", "ptr")
    first = LoadedKernel("6f" * 32, fake_binary(ptr, ptr, ptr), device_index=0, function="GATE_UP")
    second = LoadedKernel("7a" * 32, fake_binary(ptr, ptr), device_index=0, function="DOWN")
    pair = KernelPair(first, second)
    slots = tuple((0x7F00 + i) << 32 | (0x1000 * i) for i in range(5))
    pair.launch_joined(slots, None, 555)
    pair.launch(slots[:3], slots[3:], False, 555)
    assert fake.calls == [("GATE_UP", slots[:3]), ("DOWN", slots[3:])] * 2
    for wrong in (slots[:4], (*slots, 1)):
        with pytest.raises(ValueError):
            pair.launch_joined(wrong, None, 555)
    assert len(fake.calls) == 4
    own: list[tuple] = []
    for kernel in (first, second):
        monkeypatch.setattr(
            kernel, "launch_unchecked", lambda s, p=None, h=None, k=kernel: own.append((k, s, h))
        )
    status["GATE_UP"] = fake.CUresult.CUDA_ERROR_LAUNCH_FAILED  # retried by the kernel
    pair.launch_joined(slots, None, 555)
    assert own == [(first, slots[:3], 555)] and fake.calls[-1] == ("DOWN", slots[3:])
    monkeypatch.setattr(pair, "_current_device", lambda: 1)  # another device's null stream
    pair.launch_joined(slots, None, 0)
    assert own[1:] == [(first, slots[:3], 0), (second, slots[3:], 0)] and len(fake.calls) == 6
    with pytest.raises(ValueError):
        pair.launch_joined(slots[:4], None, 0)
    assert len(own) == 3


def test_kernel_pair_is_shared_per_kernels_and_needs_one_device() -> None:
    from mlpjit.jit.launcher import KernelPair, kernel_pair

    params = (KernelParam("n", "i32"),)
    first = LoadedKernel("3c" * 32, fake_binary(*params), device_index=0)
    second = LoadedKernel("4d" * 32, fake_binary(*params), device_index=0)
    pair = kernel_pair(first, second)
    assert isinstance(pair, KernelPair) and kernel_pair(first, second) is pair
    again = LoadedKernel("3c" * 32, fake_binary(*params), device_index=0)
    assert kernel_pair(again, second).first is again  # another kernel object: a new pair
    elsewhere = LoadedKernel("4d" * 32, fake_binary(*params), device_index=1)
    with pytest.raises(ValueError, match="second must be on first's device cuda:0"):
        KernelPair(first, elsewhere)


def test_module_loads_counts_the_loaded_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlpjit.jit import launcher

    monkeypatch.setattr(launcher, "_loaded", {})
    assert launcher.module_loads() == 0
    kernel = LoadedKernel("5e" * 32, fake_binary(), device_index=0)
    launcher._loaded[(kernel.key, 0)] = kernel
    assert launcher.module_loads() == 1
