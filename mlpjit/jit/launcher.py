"""Load cached cubins with the CUDA driver API and launch them on torch's current stream.

A cache hit needs only torch and cuda-python: the cubin is loaded once per (key, device) with
cuModuleLoadData into the device's primary context (the one torch uses) and launched with
cuLaunchKernelEx, optionally with programmatic stream serialization (PDL). The per-launch
path does no allocation beyond what cuda-python needs: launch configs are built once per
(stream, pdl) and parameter storage is preallocated per thread, so a launch costs a few
microseconds of host time and is safe inside CUDA graph capture.
"""

from __future__ import annotations

import operator
import struct
import threading
from collections.abc import Sequence
from ctypes import addressof, c_uint64, c_void_p
from typing import TYPE_CHECKING, Any

import torch

from mlpjit.errors import CaptureError, MlpjitError
from mlpjit.jit.capture import current_stream_capturing

if TYPE_CHECKING:
    from mlpjit.jit.binary import KernelBinary, KernelParam
    from mlpjit.jit.entry import Entry

__all__ = [
    "KernelPair",
    "LoadedKernel",
    "PARAM_SIZES",
    "check_cuda",
    "cuda_driver",
    "kernel_pair",
    "load_kernel",
    "module_loads",
    "stream_handle_getter",
]

# Bytes each manifest parameter kind occupies in the kernel's parameter buffer.
PARAM_SIZES = {"ptr": 8, "i32": 4, "f32": 4}
_STATIC_SMEM_LIMIT = 48 * 1024
# Launch configs are cached per (stream, pdl); bound it so a caller cycling through many
# short-lived streams cannot grow it forever.
_MAX_CONFIGS = 64

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_F32_MAX = 3.4028234663852886e38  # larger finite doubles overflow struct's "<f"

_loaded: dict[tuple[str, int], LoadedKernel] = {}
_load_lock = threading.Lock()
_driver_module: Any = None


def cuda_driver() -> Any:
    """The cuda.bindings.driver module, imported and cuInit-ed once per process.

    Imported on first use, never at import time, so `import mlpjit` stays cheap; the
    launcher and the capture check (jit/capture.py) share it.
    """
    global _driver_module
    if _driver_module is None:
        from cuda.bindings import driver

        check_cuda(driver, driver.cuInit(0), "cuInit")
        _driver_module = driver
    return _driver_module


def check_cuda(driver: Any, result: tuple, what: str) -> tuple:
    """The values after the status of a cuda-python call's `result`; MlpjitError naming the
    call (`what`) and the CUDA error unless the status is CUDA_SUCCESS."""
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        name = driver.cuGetErrorName(err)[1]
        text = driver.cuGetErrorString(err)[1]
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        raise MlpjitError(f"{what} failed: {name} ({text})")
    return result[1:]


def _device_getter() -> Any:
    """Fastest available way to read the CUDA runtime's current device index."""
    raw = getattr(torch._C, "_cuda_getDevice", None)
    return raw if raw is not None else torch.cuda.current_device


def stream_handle_getter() -> Any:
    """Fastest available way to read torch's current stream handle for a device index."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class _ParamBuffers(threading.local):
    """Per-thread parameter storage: one 8-byte slot per parameter and the pointer array.

    cuLaunchKernelEx copies the values before returning, so reusing the storage across
    launches is safe; making it thread-local keeps concurrent launches from racing on it.
    """

    def __init__(self, count: int) -> None:
        self.slots = (c_uint64 * max(count, 1))()
        base = addressof(self.slots)
        self.pointers = (c_void_p * max(count, 1))(*(base + 8 * i for i in range(max(count, 1))))
        self.address = addressof(self.pointers)


class _PairBuffers(threading.local):
    """Per-thread parameter storage of a KernelPair: the first kernel's slots then the
    second's, in one array, with a pointer array for each kernel.

    ``parts`` is (slots, first's pointer array address, second's), read with one lookup of
    the thread's storage on the per-call path.
    """

    def __init__(self, first: int, second: int) -> None:
        self.slots = (c_uint64 * (first + second))()  # exactly: filled with one [:] = slots
        base = addressof(self.slots)
        # A kernel without parameters reads none: its one pointer is never followed.
        self.pointers = [
            (c_void_p * max(count, 1))(*(base + 8 * (start + i) for i in range(max(count, 1))))
            for start, count in ((0, first), (first, second))
        ]
        self.parts = (self.slots, *(addressof(p) for p in self.pointers))


class LoadedKernel:
    """A kernel function loaded on one device, ready to launch with cuLaunchKernelEx."""

    def __init__(
        self,
        key: str,
        binary: KernelBinary,
        device_index: int,
        function: Any = None,
        context: Any = None,
        module: Any = None,
    ) -> None:
        for param in binary.params:
            if param.kind not in PARAM_SIZES:
                raise ValueError(
                    f"kernel {key[:12]} parameter {param.name!r} has kind {param.kind!r}; "
                    f"allowed kinds: {sorted(PARAM_SIZES)}"
                )
        self.key = key
        self.symbol = binary.symbol
        self.grid = tuple(binary.grid)
        self.block = tuple(binary.block)
        self.smem_bytes = binary.smem_bytes
        self.pdl = binary.pdl
        self.cluster = tuple(binary.cluster)
        self.params: tuple[KernelParam, ...] = tuple(binary.params)
        self.device = torch.device("cuda", device_index)
        self._index = device_index
        self._names = tuple(p.name for p in self.params)
        self._kinds = tuple(p.kind for p in self.params)
        self.function = function  # the CUfunction handle (KernelPair launches it directly)
        self._context = context
        self._module = module  # kept so the module outlives every launch of its function
        self._buffers = _ParamBuffers(len(self.params))
        self._configs: dict[tuple[int, bool], Any] = {}
        self._stream_of = stream_handle_getter()
        self._current_device = _device_getter()

    def __repr__(self) -> str:
        return f"LoadedKernel({self.symbol!r}, key={self.key[:12]}, device={self.device})"

    def pack(self, args: Sequence[torch.Tensor | int | float]) -> tuple[int, ...]:
        """Validate `args` against the manifest's parameter list; return the raw slot values.

        Pointers become data_ptr(), i32 two's-complement 32-bit, f32 its IEEE bit pattern.
        Tensors must be contiguous and on this kernel's device (the kernels are compiled for
        compact static layouts, so a strided tensor would be read wrongly, not rejected).
        """
        slots = self._buffers.slots
        self._pack_into(args, slots)
        return tuple(slots[i] for i in range(len(self.params)))

    def _pack_into(self, args: Sequence[torch.Tensor | int | float], slots: Any) -> None:
        kinds = self._kinds
        if len(args) != len(kinds):
            raise ValueError(
                f"kernel {self.symbol} takes {len(kinds)} arguments {list(self._names)}, "
                f"got {len(args)}"
            )
        # Hot path (every DenseMlp call): exact-type checks first, the general ones after.
        for i, arg in enumerate(args):
            kind = kinds[i]
            if kind == "ptr":
                if type(arg) is not torch.Tensor and not isinstance(arg, torch.Tensor):
                    raise ValueError(
                        f"argument {self._names[i]!r} must be a torch.Tensor on {self.device}, "
                        f"got {type(arg).__name__}"
                    )
                if arg.get_device() != self._index:
                    raise ValueError(
                        f"argument {self._names[i]!r} must be on {self.device}, "
                        f"got a tensor on {arg.device}"
                    )
                if not arg.is_contiguous():
                    raise ValueError(f"argument {self._names[i]!r} must be contiguous")
                slots[i] = arg.data_ptr()
            elif kind == "i32":
                if type(arg) is int and _I32_MIN <= arg <= _I32_MAX:
                    slots[i] = arg & 0xFFFFFFFF
                else:
                    slots[i] = self._pack_i32(i, arg)
            elif type(arg) is float:
                slots[i] = (
                    _U32.unpack(_F32.pack(arg))[0]
                    if abs(arg) < _F32_MAX
                    else self._pack_f32(i, arg)
                )
            else:
                slots[i] = self._pack_f32(i, arg)

    def _pack_i32(self, i: int, arg: Any) -> int:
        if isinstance(arg, (bool, torch.Tensor, float)):
            raise ValueError(f"argument {self._names[i]!r} must be an int (i32), got {arg!r}")
        try:
            value = operator.index(arg)
        except TypeError:
            raise ValueError(
                f"argument {self._names[i]!r} must be an int (i32), got {type(arg).__name__}"
            ) from None
        if not _I32_MIN <= value <= _I32_MAX:
            raise ValueError(f"argument {self._names[i]!r} = {value} does not fit in i32")
        return value & 0xFFFFFFFF

    def _pack_f32(self, i: int, arg: Any) -> int:
        if isinstance(arg, (bool, torch.Tensor)) or not isinstance(arg, (int, float)):
            raise ValueError(
                f"argument {self._names[i]!r} must be a float (f32), got {type(arg).__name__}"
            )
        try:
            return _U32.unpack(_F32.pack(arg))[0]
        except OverflowError:
            raise ValueError(f"argument {self._names[i]!r} = {arg!r} does not fit in f32") from None

    def _build_config(self, stream: int, pdl: bool) -> Any:
        """The CUlaunchConfig for (stream, pdl), built once; never mutated afterwards."""
        driver = cuda_driver()
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = self.grid
        config.blockDimX, config.blockDimY, config.blockDimZ = self.block
        config.sharedMemBytes = self.smem_bytes
        config.hStream = stream
        attrs = []
        if pdl:
            attr = driver.CUlaunchAttribute()
            attr.id = (
                driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            )
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        if self.cluster != (1, 1, 1):
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            dim = attr.value.clusterDim
            dim.x, dim.y, dim.z = self.cluster
            attrs.append(attr)
        config.attrs = attrs
        config.numAttrs = len(attrs)
        if len(self._configs) >= _MAX_CONFIGS:
            self._configs.clear()
        self._configs[(stream, pdl)] = config
        return config

    def launch(
        self,
        args: Sequence[torch.Tensor | int | float],
        stream: Any = None,
        pdl: bool | None = None,
    ) -> None:
        """Launch on `stream` (default: torch's current stream of this device).

        `stream` may be a torch.cuda.Stream or a raw CUstream handle (int); `pdl` overrides
        the manifest's programmatic-stream-serialization flag. Raises ValueError naming the
        parameter for a bad argument, MlpjitError for a driver error.
        """
        buffers = self._buffers
        self._pack_into(args, buffers.slots)
        if stream is None:
            handle = self._stream_of(self._index)
        else:
            handle = getattr(stream, "cuda_stream", stream)
        self._launch(buffers, handle, self.pdl if pdl is None else bool(pdl))

    def launch_unchecked(
        self, slots: Sequence[int], pdl: bool | None = None, stream: int | None = None
    ) -> None:
        """Launch with raw parameter slots and no argument checks, on the raw stream handle
        ``stream`` (default: torch's current stream of this device).

        ``slots`` are the values ``pack`` would return (pointers as ints). For callers that
        validated their tensors themselves: DenseMlp checks its weights once and x per call,
        reads the current stream once for both of its launches, and this skips ``launch``'s
        per-argument checks (about 2 us per launch on the H200 test host). Nothing catches a
        wrong pointer here: it faults inside the kernel.
        """
        count = len(self._kinds)
        if len(slots) != count:
            raise ValueError(
                f"kernel {self.symbol} takes {count} parameter slots, got {len(slots)}"
            )
        buffers = self._buffers
        buffers.slots[:count] = slots
        if stream is None:
            stream = self._stream_of(self._index)
        self._launch(buffers, stream, self.pdl if pdl is None else bool(pdl))

    def launch_config(self, stream: int, pdl: bool | None) -> Any:
        """The CUlaunchConfig of a launch on raw stream handle ``stream`` (``pdl`` None: the
        manifest's flag), built once per (stream, pdl) and never mutated afterwards."""
        use_pdl = self.pdl if pdl is None else bool(pdl)
        config = self._configs.get((stream, use_pdl))
        return config if config is not None else self._build_config(stream, use_pdl)

    def _launch(self, buffers: _ParamBuffers, handle: int, use_pdl: bool) -> None:
        config = self._configs.get((handle, use_pdl))
        if config is None:
            config = self._build_config(handle, use_pdl)
        driver = cuda_driver()
        # Handle 0 (torch's default stream) is the null stream of the current context. With
        # the runtime's current device ours that is our primary context (torch's), so the
        # common case launches without a driver query.
        if handle == 0 and self._current_device() != self._index:
            self._launch_in_own_context(driver, config, buffers)
            return
        result = driver.cuLaunchKernelEx(config, self.function, buffers.address, 0)
        if result[0]:  # CUresult is an int enum; CUDA_SUCCESS is 0
            errors = driver.CUresult
            if handle == 0 and result[0] in (
                errors.CUDA_ERROR_INVALID_CONTEXT,
                errors.CUDA_ERROR_INVALID_HANDLE,
            ):
                # The null stream of a context that is not ours: a thread with no driver
                # context yet (the runtime sets it lazily), or another context of this device.
                self._launch_in_own_context(driver, config, buffers)
                return
            check_cuda(driver, result, f"cuLaunchKernelEx({self.symbol})")

    def _launch_in_own_context(self, driver: Any, config: Any, buffers: _ParamBuffers) -> None:
        """Launch on the null stream of this kernel's context, made current for the call."""
        current = driver.cuCtxGetCurrent()[1]
        if current is not None and int(current) == int(self._context):
            result = driver.cuLaunchKernelEx(config, self.function, buffers.address, 0)
        else:
            check_cuda(driver, driver.cuCtxPushCurrent(self._context), "cuCtxPushCurrent")
            try:
                result = driver.cuLaunchKernelEx(config, self.function, buffers.address, 0)
            finally:
                driver.cuCtxPopCurrent()
        check_cuda(driver, result, f"cuLaunchKernelEx({self.symbol})")


class KernelPair:
    """Two kernels of one device launched back to back on one stream from raw slots:
    DenseMlp's per-call path (gate_up, then down reading its output).

    One call does what two ``launch_unchecked`` calls would, with the per-launch host work
    done once for both: one (stream, pdl) lookup of both launch configs, one current-device
    check on the default stream, one per-thread parameter buffer holding both kernels' slots
    (the driver copies the values before cuLaunchKernelEx returns). Anything off the fast
    path (the default stream of another device's context, a failed launch) goes through each
    kernel's ``launch_unchecked``, which handles contexts and errors. Shared by every layer
    with the same two kernels (``kernel_pair``).
    """

    def __init__(self, first: LoadedKernel, second: LoadedKernel) -> None:
        if first.device != second.device:
            raise ValueError(
                f"second must be on first's device {first.device}, got {second.device}"
            )
        self.first = first
        self.second = second
        self.device = first.device
        self._index = first.device.index
        self._counts = (len(first.params), len(second.params))
        self._buffers = _PairBuffers(*self._counts)
        # (stream, pdl) -> (cuLaunchKernelEx, first config, first function, second ...)
        self._plans: dict[tuple[int, bool | None], tuple] = {}
        self._current_device = _device_getter()

    def __repr__(self) -> str:
        return f"KernelPair({self.first!r}, {self.second!r})"

    def _plan(self, stream: int, pdl: bool | None) -> tuple:
        """The launch call and both (config, function) for (stream, pdl), made once."""
        first, second = self.first, self.second
        plan = (
            cuda_driver().cuLaunchKernelEx,
            first.launch_config(stream, pdl),
            first.function,
            second.launch_config(stream, pdl),
            second.function,
        )
        if len(self._plans) >= _MAX_CONFIGS:
            self._plans.clear()
        self._plans[(stream, pdl)] = plan
        return plan

    def launch(
        self, first_slots: Sequence[int], second_slots: Sequence[int], pdl: bool | None, stream: int
    ) -> None:
        """Launch ``first`` then ``second`` on raw stream handle ``stream`` with these raw
        parameter slots (as ``LoadedKernel.launch_unchecked`` takes them: no checks beyond
        their counts); ``pdl`` None: each kernel's manifest flag."""
        count_first, count_second = self._counts
        if len(first_slots) != count_first or len(second_slots) != count_second:
            raise ValueError(
                f"kernels {self.first.symbol} and {self.second.symbol} take "
                f"{count_first} and {count_second} parameter slots, got {len(first_slots)} "
                f"and {len(second_slots)}"
            )
        self.launch_joined((*first_slots, *second_slots), pdl, stream)

    def launch_joined(self, slots: Sequence[int], pdl: bool | None, stream: int) -> None:
        """``launch`` with both kernels' slots in one sequence, the first's then the
        second's: DenseMlp's per-call path, which builds one tuple and skips ``launch``'s
        two length checks (its prepare checks each kernel's parameter list). A sequence of
        another length still raises ValueError (ctypes', before anything is launched)."""
        buffer, first_params, second_params = self._buffers.parts
        buffer[:] = slots
        if stream == 0 and self._current_device() != self._index:
            # The default stream of whatever context is current: each kernel's own path.
            count_first = self._counts[0]
            self.first.launch_unchecked(slots[:count_first], pdl, stream)
            self.second.launch_unchecked(slots[count_first:], pdl, stream)
            return
        plan = self._plans.get((stream, pdl))
        if plan is None:
            plan = self._plan(stream, pdl)
        launch, first_config, first_function, second_config, second_function = plan
        if launch(first_config, first_function, first_params, 0)[0]:  # retried, or raised
            self.first.launch_unchecked(slots[: self._counts[0]], pdl, stream)
        if launch(second_config, second_function, second_params, 0)[0]:
            self.second.launch_unchecked(slots[self._counts[0] :], pdl, stream)


_pairs: dict[tuple[str, str, int], KernelPair] = {}


def kernel_pair(first: LoadedKernel, second: LoadedKernel) -> KernelPair:
    """The KernelPair of two loaded kernels, one per process for each (first, second) of a
    device: the layers of one shape share it."""
    key = (first.key, second.key, first.device.index)
    pair = _pairs.get(key)
    if pair is None or pair.first is not first or pair.second is not second:
        pair = _pairs[key] = KernelPair(first, second)
    return pair


def module_loads() -> int:
    """How many cubins this process has loaded with cuModuleLoadData (one per key and
    device: ``load_kernel`` loads each once)."""
    with _load_lock:
        return len(_loaded)


def _check_param_layout(driver: Any, function: Any, binary: KernelBinary, key: str) -> None:
    """Compare the manifest's parameter list with the loaded function's (cuFuncGetParamInfo).

    A mismatch means the manifest does not describe this cubin, and launching would pass
    garbage; skipped quietly on drivers without the query.
    """
    query = getattr(driver, "cuFuncGetParamInfo", None)
    if query is None:
        return
    for index, param in enumerate(binary.params):
        err, _offset, size = query(function, index)
        if err != driver.CUresult.CUDA_SUCCESS:
            if index == 0:
                return  # query unsupported here; nothing to compare against
            raise MlpjitError(
                f"cache entry {key[:12]}: manifest lists {len(binary.params)} parameters but "
                f"kernel {binary.symbol} has only {index}"
            )
        if size != PARAM_SIZES[param.kind]:
            raise MlpjitError(
                f"cache entry {key[:12]}: parameter {param.name!r} is {param.kind} in the "
                f"manifest but {size} bytes in kernel {binary.symbol}"
            )
    err = query(function, len(binary.params))[0]
    if binary.params and err == driver.CUresult.CUDA_SUCCESS:
        raise MlpjitError(
            f"cache entry {key[:12]}: kernel {binary.symbol} takes more than the "
            f"{len(binary.params)} parameters its manifest lists"
        )


def _load_module(key: str, binary: KernelBinary, index: int) -> LoadedKernel:
    """Load ``binary``'s cubin into device ``index``'s primary context: the module, its
    function, the opt-in shared memory it needs, and the parameter-list check."""
    driver = cuda_driver()
    device = check_cuda(driver, driver.cuDeviceGet(index), "cuDeviceGet")[0]
    # The primary context is the one torch's runtime uses, so our function and torch's
    # streams share a context. Retained for the life of the process, like the module.
    context = check_cuda(
        driver, driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain"
    )[0]
    check_cuda(driver, driver.cuCtxPushCurrent(context), "cuCtxPushCurrent")
    try:
        module = check_cuda(
            driver, driver.cuModuleLoadData(binary.cubin), f"cuModuleLoadData({key[:12]})"
        )[0]
        function = check_cuda(
            driver,
            driver.cuModuleGetFunction(module, binary.symbol.encode()),
            f"cuModuleGetFunction({binary.symbol})",
        )[0]
        if binary.smem_bytes > _STATIC_SMEM_LIMIT:
            limit = check_cuda(
                driver,
                driver.cuDeviceGetAttribute(
                    driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                    device,
                ),
                "cuDeviceGetAttribute",
            )[0]
            if binary.smem_bytes > limit:
                raise MlpjitError(
                    f"kernel {binary.symbol} needs {binary.smem_bytes} bytes of shared memory; "
                    f"device {index} allows at most {limit} per block"
                )
            check_cuda(
                driver,
                driver.cuFuncSetAttribute(
                    function,
                    driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    binary.smem_bytes,
                ),
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
            )
        _check_param_layout(driver, function, binary, key)
    finally:
        driver.cuCtxPopCurrent()
    return LoadedKernel(key, binary, index, function=function, context=context, module=module)


def load_kernel(entry: Entry, device: torch.device | str | int) -> LoadedKernel:
    """Load `entry`'s cubin on `device` once per process; later calls return the same kernel.

    Raises CaptureError if the kernel is not loaded yet and the device's current stream is
    capturing a CUDA graph (a module load cannot be captured: call prepare() first).
    """
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    loaded = _loaded.get((entry.key, index))
    if loaded is not None:
        return loaded
    if current_stream_capturing(index):
        raise CaptureError(
            f"kernel {entry.key[:12]} is not loaded on cuda:{index} and the current stream is "
            "capturing a CUDA graph; load it (DenseMlp.prepare) before capture"
        )
    with _load_lock:
        loaded = _loaded.get((entry.key, index))
        if loaded is None:
            loaded = _load_module(entry.key, entry.binary(), index)
            _loaded[(entry.key, index)] = loaded
    return loaded
