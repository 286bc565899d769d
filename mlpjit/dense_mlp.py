"""DenseMlp: the public layer. Validates once, plans per token count, launches two kernels.

    mlp = DenseMlp(w13, w13_scale, w2, w2_scale, limit=None, ue8m0=True)
    mlp.prepare(range(1, 9))   # every worker, before CUDA graph capture
    out = mlp(x)               # x [m, hidden] bf16 -> [m, hidden] bf16 (TP-partial)

Path per token count m (``path(m)``):
- "kernel": CUDA weights on sm_90a, 1 <= m <= 8 and both shapes supported by the fp8_gemv
  kernel (fp8_gemv.tuning.kernel_supports): the gate_up kernel (SwiGLU fused) writes act, the
  down kernel writes out, each fp8_gemv's or, where layer_plan.stream_halves says so,
  fp8_stream's cluster form (no workspace). Kernels come from the compile cache and are
  loaded by prepare();
- "stock": other shapes/token counts on a Hopper GPU: torch's block-scaled _scaled_mm
  (mlpjit.stock), correct but five kernels;
- "reference": CPU weights or GPUs without block-scaled _scaled_mm: the reference math
  (mlpjit.reference).

prepare() on CPU weights (or a GPU without the kernels) compiles and loads nothing: no token
count takes the kernel path there. To fill a cache on a machine without a GPU use
``mlpjit warm --arch sm_90a``.

The weights are the caller's tensors (no copy is kept or made); weight scales are converted
to float32 once (scales.convert_scale: no copy for contiguous float32 scales) and their
values checked once (finite and >= 0, never per call): CPU scales at construction, CUDA
scales queued without a host sync and checked at the layer's first prepare() or call,
together with every other layer's queued check (one host sync per device for a whole model;
``DenseMlp.check_weight_scales(layers)`` does it at once).

Start-up: the kernels come through mlpjit.jit.loaded, the process-wide memo of loaded
kernels, so the many layers of one shape cost one cache lookup and one module load per
distinct kernel and device; the first layer of a signature (shape, options, SM count,
device) keeps its kernel pairs in the memo's scope (``loaded.derived``), so every later
layer costs one dict lookup per token count; the token counts' paths
(``kernel_supported``) are planned once per shape too.

Beside the class, each with one job: the checks of the constructor's and prepare's
arguments, ``_ActBuffers`` (the act buffers kept for eager calls) and ``_load_pairs``
(kernels through the compile cache and the memo, loaded and checked); the fallback is
mlpjit.stock.StockLayer and the device facts are mlpjit.device's.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mlpjit.device import device_sms, kernel_arch
from mlpjit.errors import CaptureError, MlpjitError
from mlpjit.jit import capture
from mlpjit.kernels.blocks import BLOCK
from mlpjit.kernels.fp8_gemv.params import KERNEL_ARGS, MAX_TOKENS, check_limit
from mlpjit.kernels.fp8_gemv.tuning import kernel_supports
from mlpjit.kernels.hopper import SMS
from mlpjit.layer_plan import dense_mlp_requests, token_counts
from mlpjit.scale_rule import DEFAULT_UE8M0, resolve_ue8m0
from mlpjit.scales import ScaleCheck, convert_scale, queue_scale_checks, resolve_scale_checks
from mlpjit.stock import StockLayer

if TYPE_CHECKING:
    from mlpjit.jit.launcher import KernelPair, LoadedKernel
    from mlpjit.jit.spec import KernelRequest

__all__ = ["DenseMlp", "MAX_TOKENS", "kernel_requests", "kernel_supported"]

_BF16 = torch.bfloat16  # x's dtype, compared by identity on every call (dtypes are singletons)

# The fp8_gemv parameter list DenseMlp._launch fills with raw pointers, in order; an
# fp8_stream kernel takes a workspace pointer too, which its cluster form never reads or
# writes (trace builds aside, which DenseMlp never asks for): it gets the kernel's output's.
_KERNEL_PARAMS = [(name, "ptr") for name in KERNEL_ARGS]
_STREAM_PARAMS = [*_KERNEL_PARAMS, ("workspace", "ptr")]


@functools.lru_cache(maxsize=4096)
def kernel_supported(hidden: int, intermediate: int, m: int, sms: int = SMS) -> bool:
    """True when both fp8_gemv kernels of a layer take m tokens on a GPU of ``sms`` SMs
    (else: the stock path). Memoized: every layer of a shape asks it for each token count."""
    if not 1 <= m <= MAX_TOKENS:
        return False
    return kernel_supports(2 * intermediate, hidden, m, sms) and kernel_supports(
        hidden, intermediate, m, sms
    )


def kernel_requests(
    hidden: int,
    intermediate: int,
    tokens: Iterable[int],
    arch: str,
    *,
    limit: float | None,
    ue8m0: bool,
    sms: int = SMS,
) -> list[KernelRequest]:
    """The compile requests (gate_up then down per supported token count) of one layer, for
    a GPU of ``sms`` SMs.

    The same requests as ``mlpjit warm`` for that shard (layer_plan.dense_mlp_requests with
    tp=1), so a cache warmed by the CLI serves prepare() without compiling. No GPU needed:
    e.g. ``kernel_requests(6144, 1536, range(1, 9), "sm_90a", limit=None, ue8m0=True)``
    (``ue8m0``: the layer's rule, ``DenseMlp.ue8m0``).
    """
    return dense_mlp_requests(
        hidden, intermediate, 1, _token_counts(tokens), arch, ue8m0=ue8m0, limit=limit, sms=sms
    )


# act buffers kept for eager calls (see _ActBuffers), shared by every DenseMlp of a process:
# (device index, thread, stream, tokens, intermediate) -> bf16 [tokens, intermediate].
_KEPT_ACT: dict[tuple[int, int, int, int, int], Tensor] = {}
_KEPT_ACT_LOCK = threading.Lock()


class _ThreadActs(threading.local):
    """One thread's view of _KEPT_ACT for one _ActBuffers: (stream, tokens) -> act."""

    def __init__(self) -> None:
        self.acts: dict[tuple[int, int], Tensor] = {}


class _ActBuffers:
    """act buffers for eager calls, made by prepare() for the thread and stream it runs on,
    one per token count: a call from there skips one allocation (3-4 us of host time on the
    H200 test host). Calls from other threads or streams allocate act as before.

    Reuse is safe because calls from one thread on one stream run in stream order, and
    gate_up writes act only after its PDL wait, that is after the previous call's down kernel
    (of this layer or any other) has finished reading it. So layers with the same
    intermediate size share one buffer per token count (_KEPT_ACT): a process keeps
    sum(tokens) x intermediate bf16 per (thread, stream), whatever its layer count. While
    the stream captures a graph, calls allocate (from the graph's pool): a replay may run on
    any stream at any time. Buffers are only ever made in prepare, never inside a call:
    torch.compile's CUDA-graph warm-up runs calls with its own memory pool active, and a
    buffer kept from there would be a live tensor in that pool.

    A call finds its buffer in its thread's own copy of the entries it has used (one dict
    lookup; entries are never removed from _KEPT_ACT, so a copy cannot go stale), and asks
    whether its stream captures on every call, since a capture may begin between any two.
    """

    def __init__(self, device: torch.device, device_index: int, intermediate: int) -> None:
        from mlpjit.jit.launcher import stream_handle_getter

        self._device = device
        self._index = device_index
        self._intermediate = intermediate
        self._stream_of = stream_handle_getter()
        self._capturing = capture.stream_capturing
        self._mine = _ThreadActs()

    def keep(self, counts: Iterable[int]) -> None:
        """Make the buffers of these token counts for the calling thread and its stream."""
        stream = self._stream_of(self._index)
        if self._capturing(stream):
            return
        inter = self._intermediate
        thread = threading.get_ident()
        with _KEPT_ACT_LOCK:
            for m in counts:
                key = (self._index, thread, stream, m, inter)
                if key not in _KEPT_ACT:
                    _KEPT_ACT[key] = torch.empty(
                        (m, inter), dtype=torch.bfloat16, device=self._device
                    )

    def get(self, x: Tensor, m: int, stream: int) -> Tensor:
        """The kept buffer for m tokens on raw stream handle ``stream`` (the caller's current
        stream), or a fresh one (not kept, or the stream is capturing)."""
        act = self._mine.acts.get((stream, m))
        if act is None:
            act = _KEPT_ACT.get((self._index, threading.get_ident(), stream, m, self._intermediate))
            if act is None:
                return x.new_empty((m, self._intermediate))
            self._mine.acts[(stream, m)] = act
        # Handle 0, the legacy default stream, never captures (capture.stream_capturing): only
        # another stream pays the driver's query.
        if stream and self._capturing(stream):
            return x.new_empty((m, self._intermediate))
        return act


# ---- argument checks (construction and prepare) ---------------------------------------------


def _check_weight(w: object, name: str, shape_doc: str) -> Tensor:
    """Type, dtype, rank, size and layout of one FP8 weight (the shapes' agreement is the
    caller's)."""
    if not isinstance(w, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {shape_doc}, got {type(w).__name__}")
    if w.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{name} must have dtype torch.float8_e4m3fn, got {w.dtype}")
    if w.dim() != 2:
        raise ValueError(f"{name} must be 2-D {shape_doc}, got shape {list(w.shape)}")
    if min(w.shape) < BLOCK:
        # A zero dim passes every "multiple of 128" test and gives empty scales and outputs.
        raise ValueError(
            f"{name} must be {shape_doc} with hidden and intermediate multiples of {BLOCK} "
            f"and >= {BLOCK} (one weight scale per {BLOCK}x{BLOCK} block), "
            f"got shape {list(w.shape)}"
        )
    if not w.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous (DenseMlp uses the caller's weights without copying), "
            f"got strides {w.stride()}"
        )
    return w


def _check_layer_weights(w13: object, w2: object) -> tuple[Tensor, Tensor, int, int]:
    """Both FP8 weights checked, on one device, with agreeing shapes: w13 [2*inter, hidden]
    (gate rows then up rows) and w2 [hidden, inter], hidden and inter multiples of 128.
    Returns (w13, w2, hidden, inter)."""
    w13 = _check_weight(w13, "w13", "[2*intermediate, hidden]")
    w2 = _check_weight(w2, "w2", "[hidden, intermediate]")
    if w13.device != w2.device:
        raise ValueError(f"w2 must be on w13's device {w13.device}, got {w2.device}")
    rows13, hidden = w13.shape
    if rows13 % 2:
        raise ValueError(f"w13 must have an even number of rows (gate then up), got {rows13}")
    inter = rows13 // 2
    if tuple(w2.shape) != (hidden, inter):
        raise ValueError(
            f"w2 must be [hidden, intermediate] = [{hidden}, {inter}] to match w13 "
            f"[{rows13}, {hidden}], got {list(w2.shape)}"
        )
    if hidden % BLOCK or inter % BLOCK:
        raise ValueError(
            f"hidden ({hidden}) and intermediate ({inter}) must be multiples of {BLOCK}"
        )
    return w13, w2, hidden, inter


def _token_counts(tokens: Iterable[int]) -> list[int]:
    """The distinct token counts, as ints in first-seen order; ValueError for anything else,
    an endless iterable included (layer_plan.token_counts reads at most MAX_TOKEN_COUNTS
    of them). Linear: duplicates are found with a set (a list membership test made
    prepare(range(1, 30000)) take seconds)."""
    return token_counts(tokens)


# ---- kernels: compiled through the cache, loaded and checked ---------------------------------


# A token count's kernels: the pair, and which of (gate_up, down) are fp8_stream's (they take
# a fifth pointer), None where neither is.
_Loaded = tuple["KernelPair", "tuple[bool, bool] | None"]


def _load_pairs(
    requests: list[KernelRequest], device: torch.device
) -> Iterator[tuple[int, _Loaded]]:
    """(m, the gate_up and down kernels of m tokens as a KernelPair, and which are
    fp8_stream's) for each token count of a layer's ``requests``, as soon as both of its
    kernels are loaded and checked (through the process-wide memo; compiled on a cache
    miss)."""
    from mlpjit.jit import launcher, loaded

    ready: dict[tuple[int, bool], tuple[KernelRequest, LoadedKernel]] = {}
    for request, kernel in zip(requests, loaded.load_kernels(requests, device), strict=True):
        m = request.params["tokens"]
        ready[(m, request.params["swiglu"])] = (request, kernel)
        if (m, True) in ready and (m, False) in ready:
            streamed = tuple(_check_kernel(*ready[(m, half)]) for half in (True, False))
            yield m, (launcher.kernel_pair(ready[(m, True)][1], ready[(m, False)][1]),
                      streamed if any(streamed) else None)  # fmt: skip


def _check_kernel(request: KernelRequest, kernel: LoadedKernel) -> bool:
    """Whether the kernel is fp8_stream's, if it takes the raw pointers DenseMlp._launch
    passes, in that order, without per-call checks: fp8_gemv's (out, x, w, w_scale), or
    fp8_stream's cluster form (those + a workspace it never touches); MlpjitError
    otherwise."""
    streamed = request.kernel == "fp8_stream"
    params = [(p.name, p.kind) for p in kernel.params]
    expected = _STREAM_PARAMS if streamed else _KERNEL_PARAMS
    if params != expected:
        raise MlpjitError(
            f"kernel {kernel.symbol} ({kernel.key[:12]}) takes {params}, expected {expected}"
        )
    if streamed and (not request.params.get("cluster") or request.params.get("trace")):
        raise MlpjitError(
            f"kernel {kernel.symbol} ({kernel.key[:12]}) is fp8_stream's grid-wide form or a "
            "trace build, which read a workspace; DenseMlp runs its cluster form only"
        )
    return streamed


# ---- the layer ------------------------------------------------------------------------------


class DenseMlp:
    """The dense SwiGLU MLP of a DeepSeek-style FP8 layer, TP-partial (no all-reduce).

    Args:
        w13: float8_e4m3fn [2*inter, hidden], gate rows then up rows, contiguous.
        w13_scale: block scales of w13: float32 or float8_e8m0fnu [2*inter/128, hidden/128],
            or UE8M0 bytes packed four per int32 along K [2*inter/128, ceil(hidden/512)].
        w2: float8_e4m3fn [hidden, inter], contiguous, on w13's device.
        w2_scale: block scales of w2, same forms ([hidden/128, inter/128] ...).
        limit: None, or L > 0 for the clamped SwiGLU (gate <= L, -L <= up <= L).
        ue8m0: round activation scales up to powers of two (default True: vLLM's rule with
            DeepGEMM on Hopper, and ``mlpjit warm``'s, so a warmed cache serves the layer;
            see mlpjit.scale_rule).

    hidden and intermediate must be multiples of 128 (>= 128). Every block scale must be
    finite and >= 0 (no UE8M0 byte 0xFF, the e8m0 NaN code), so a bad checkpoint fails with
    a ValueError naming the scale instead of giving NaN outputs: checked here for CPU
    scales; for CUDA scales (a host sync) at the first prepare() or call, every constructed
    layer's at once (or by ``check_weight_scales``), and that layer's prepare() and calls
    raise it until it is dropped. Shapes, dtypes and devices are always checked here.

    Attribute ``pdl`` (default None: as compiled, i.e. on) set to False launches the kernels
    without programmatic dependent launch, to measure what streaming weights early buys.
    """

    def __init__(
        self,
        w13: Tensor,
        w13_scale: Tensor,
        w2: Tensor,
        w2_scale: Tensor,
        limit: float | None = None,
        ue8m0: bool = DEFAULT_UE8M0,
    ) -> None:
        w13, w2, hidden, inter = _check_layer_weights(w13, w2)
        for scale, name in ((w13_scale, "w13_scale"), (w2_scale, "w2_scale")):
            if isinstance(scale, Tensor) and scale.device != w13.device:
                raise ValueError(f"{name} must be on the weights' device {w13.device}")
        if not isinstance(ue8m0, bool):
            raise ValueError(f"ue8m0 must be a bool (True or False), got {ue8m0!r}")

        self.hidden = hidden
        self.intermediate = inter
        self.limit = check_limit(limit)
        self.ue8m0 = ue8m0
        self.device = w13.device
        self._w13 = w13
        self._w2 = w2
        self._w13_scale, w13_form = convert_scale(w13_scale, 2 * inter, hidden, name="w13_scale")
        self._w2_scale, w2_form = convert_scale(w2_scale, hidden, inter, name="w2_scale")
        # The values: on the CPU now, on a GPU (a host sync) queued until the first
        # prepare() or call resolves every layer's queued check at once.
        self._scale_check: ScaleCheck | None = queue_scale_checks(
            [(self._w13_scale, "w13_scale", w13_form), (self._w2_scale, "w2_scale", w2_form)]
        )
        self.arch = kernel_arch(self.device)
        self.sms = device_sms(self.device)  # sizes the persistent grids of its kernels
        # -1 off CUDA; get_device() is the cheapest per-call device check (cpu and meta
        # tensors both say -1, so off CUDA the device itself is compared as well).
        self._index = w13.get_device()
        self._kernels: dict[int, KernelPair] = {}
        # Token counts with an fp8_stream kernel: m -> whether (gate_up, down) are (each
        # takes a fifth pointer); empty where fp8_gemv runs both halves.
        self._streamed: dict[int, tuple[bool, bool]] = {}
        self._act_buffers: _ActBuffers | None = None  # made with the first kernels loaded
        # Programmatic dependent launch: None = as compiled (on), False = off (benchmarks).
        self.pdl: bool | None = None
        self._paths: dict[int, str] = {}
        # What token counts off the kernel path run: stock (Hopper) or the reference math.
        self._fallback = StockLayer(w13, self._w13_scale, w2, self._w2_scale)
        # Each weight's data_ptr, bound once: a call still reads the current addresses (see
        # the properties) without looking the method up four times.
        self._weight_ptrs = (
            w13.data_ptr,
            self._w13_scale.data_ptr,
            w2.data_ptr,
            self._w2_scale.data_ptr,
        )

    # The weights are fixed at construction (checked once there, not per call). Update them
    # in place (copy_, or .data re-pointed to a tensor of the same shape, dtype and layout):
    # each call reads their current addresses.
    @property
    def w13(self) -> Tensor:
        return self._w13

    @property
    def w2(self) -> Tensor:
        return self._w2

    @property
    def w13_scale(self) -> Tensor:
        """w13's block scales as float32 [2*inter/128, hidden/128] (converted once)."""
        return self._w13_scale

    @property
    def w2_scale(self) -> Tensor:
        """w2's block scales as float32 [hidden/128, inter/128] (converted once)."""
        return self._w2_scale

    @classmethod
    def check_weight_scales(cls, layers: Iterable[DenseMlp] | Mapping[str, DenseMlp]) -> None:
        """Check the weight-scale values of many layers now, all of them (and every other
        layer's queued check) in one host sync per device, instead of at each layer's
        first prepare() or call. ValueError naming the first bad layer (its key in a
        mapping, else its index) and scale."""
        resolve_scale_checks()
        named = layers.items() if isinstance(layers, Mapping) else enumerate(layers)
        for name, layer in named:
            try:
                layer.check_scales()
            except ValueError as err:
                raise ValueError(f"layer {name!r}: {err}") from None

    def check_scales(self) -> None:
        """Raise the ValueError of a bad weight scale, resolving the queued checks first if
        this layer's is open (see the class); nothing once passed, or while its device's
        stream captures a graph (then the next prepare() or call checks)."""
        check = self._scale_check
        if check is not None and check.verify():
            self._scale_check = None

    def __repr__(self) -> str:
        return (
            f"DenseMlp(hidden={self.hidden}, intermediate={self.intermediate}, "
            f"limit={self.limit}, ue8m0={self.ue8m0}, device={self.device}, "
            f"prepared={sorted(self._kernels)})"
        )

    # ---- planning ---------------------------------------------------------------------------

    def path(self, m: int) -> str:
        """How a call with m tokens runs: "kernel", "stock" (torch _scaled_mm) or "reference"."""
        found = self._paths.get(m)
        if found is None:
            found = self._choose_path(m)
            self._paths[m] = found
        return found

    def _choose_path(self, m: int) -> str:
        if self.arch is not None and kernel_supported(self.hidden, self.intermediate, m, self.sms):
            return "kernel"
        return self._fallback.path

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        prefix: str,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
        device: torch.device | str | None = None,
        limit: float | None = None,
        ue8m0: bool | None = None,
    ) -> DenseMlp:
        """One TP shard of a Hugging Face FP8 checkpoint's dense MLP (``model.layers.0.mlp``)
        or shared expert (``model.layers.5.mlp.shared_experts``), read with only the slices
        the shard needs (mlpjit.checkpoint.load_dense_mlp_weights: gate and up merged into
        w13, sharded along the intermediate size as vLLM does).

        ``device``: None (the default) is torch's current CUDA device when there is one,
        else the CPU, so the same call works on a GPU server and on a CPU machine.
        ``ue8m0`` is the activation-scale rule, whatever form the checkpoint stores its
        weight scales in: None (the default) takes it from config.json's
        ``quantization_config.scale_fmt`` where it says ("ue8m0": power-of-two scales,
        anything else: float32 scales), else mlpjit.scale_rule.DEFAULT_UE8M0 (True), the
        rule ``mlpjit warm`` uses too. ValueError naming the tensor and the file for
        anything the checkpoint lacks, or naming the argument for a bad device, limit or
        ue8m0 (checked before any file is read).
        """
        from mlpjit.checkpoint import checkpoint_ue8m0, load_dense_mlp_weights
        from mlpjit.device import default_device

        check_limit(limit)
        resolve_ue8m0(ue8m0)  # a bad value fails before any file is read
        if device is None:
            device = default_device()
        weights = load_dense_mlp_weights(
            path, prefix, tp_rank=tp_rank, tp_size=tp_size, device=device
        )
        rule = resolve_ue8m0(ue8m0, checkpoint_ue8m0(path) if ue8m0 is None else None)
        return cls(**weights, limit=limit, ue8m0=rule)

    def prepare(self, tokens: Iterable[int]) -> None:
        """Compile (through the cache) and load the kernels for these token counts.

        Call it in every worker before CUDA graph capture, from the thread and on the stream
        that will make eager calls: it also makes the act buffers those calls reuse (see
        _ActBuffers). Token counts that do not take the kernel path (see ``path``) need no
        kernel: on the stock path prepare makes its weight-scale operands (else the first
        stock call does), on CPU it does nothing. Raises CaptureError if called
        while the current stream is capturing and anything is left to load, and the
        ValueError of a bad weight scale (see the class: CUDA scales are checked here, with
        every other layer's queued check, in one host sync).
        """
        asked = _token_counts(tokens)
        counts = [m for m in asked if self.path(m) == "kernel"]
        self.check_scales()
        if len(counts) < len(asked) and not self._capturing():
            self._fallback.prepare()  # the stock path's scale operands, before capture
        self._load(counts)
        if counts:
            self._act_buffers.keep(counts)

    def _load(self, counts: list[int]) -> None:
        """Compile (through the cache) and load the kernels of these kernel-path counts.

        Each count is marked loaded once both of its kernels are, so a failure leaves the
        counts loaded before it usable.
        """
        todo = [m for m in counts if m not in self._kernels]
        if not todo:
            return
        if self._capturing():
            raise CaptureError(
                f"DenseMlp.prepare({todo}) called during CUDA graph capture; "
                "prepare every token count before capture"
            )
        from mlpjit.jit import loaded

        if self._act_buffers is None:  # before any count is marked loaded below
            from mlpjit.jit.launcher import stream_handle_getter

            self._stream_of = stream_handle_getter()
            self._act_buffers = _ActBuffers(self.device, self._index, self.intermediate)
        # Layers of one signature share their pairs: the first loads them, the rest look
        # them up (loaded.derived: the kernels' own scope, so never a pair it would not give).
        shared = loaded.derived()
        signature = (
            "DenseMlp", self._index, self.hidden, self.intermediate, self.limit, self.ue8m0,
            self.sms, self.arch,
        )  # fmt: skip
        missing = []
        for m in todo:
            found = shared.get((*signature, m))
            if found is None:
                missing.append(m)
            else:
                self._mark_loaded(m, found)
        if not missing:
            return
        requests = kernel_requests(
            self.hidden,
            self.intermediate,
            missing,
            self.arch,
            limit=self.limit,
            ue8m0=self.ue8m0,
            sms=self.sms,
        )
        for m, found in _load_pairs(requests, self.device):
            shared[(*signature, m)] = found
            self._mark_loaded(m, found)

    def _mark_loaded(self, m: int, found: _Loaded) -> None:
        pair, streamed = found
        if streamed is not None:
            self._streamed[m] = streamed  # before the pair: a call finds both or neither
        self._kernels[m] = pair

    def _capturing(self) -> bool:
        """Whether the weights' device's current stream is capturing a CUDA graph."""
        return capture.current_stream_capturing(self.device)

    # ---- calls ------------------------------------------------------------------------------

    def _check_x(self, x: object) -> int:
        """Validate x; return m. Cheap checks only: this runs on every call."""
        # The common case first, with as few torch calls as possible; anything it does not
        # pass (a Tensor subclass too) goes through the checks below, which accept the same
        # tensors and name what is wrong with the others.
        index = self._index
        if (
            type(x) is Tensor
            and x.dtype is _BF16
            and x.is_contiguous()
            and x.get_device() == index
            and (index >= 0 or x.device == self.device)
        ):
            shape = x.shape
            if len(shape) == 2 and shape[1] == self.hidden and shape[0]:
                return shape[0]
        if not isinstance(x, Tensor):
            raise ValueError(
                f"x must be a torch.Tensor [m, {self.hidden}] bf16, got {type(x).__name__}"
            )
        if x.dtype != torch.bfloat16:
            raise ValueError(f"x must have dtype torch.bfloat16, got {x.dtype}")
        if x.get_device() != self._index or (self._index < 0 and x.device != self.device):
            raise ValueError(f"x must be on the weights' device {self.device}, got {x.device}")
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x must be [m, hidden={self.hidden}], got shape {list(x.shape)}")
        m = x.shape[0]
        if m == 0:
            raise ValueError("x must have at least one token (m >= 1), got m = 0")
        if not x.is_contiguous():
            raise ValueError(f"x must be contiguous, got strides {x.stride()}")
        return m

    def _check_buffer(self, buf: object, name: str, m: int, cols: int) -> None:
        """Validate a caller's act or out buffer: bf16 [m, cols], contiguous, on the device."""
        if not isinstance(buf, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor [{m}, {cols}] bf16 or None")
        if buf.dtype != torch.bfloat16:
            raise ValueError(f"{name} must have dtype torch.bfloat16, got {buf.dtype}")
        if buf.get_device() != self._index or (self._index < 0 and buf.device != self.device):
            raise ValueError(f"{name} must be on the weights' device {self.device}")
        if buf.dim() != 2 or buf.shape[0] != m or buf.shape[1] != cols:
            raise ValueError(f"{name} must have shape [{m}, {cols}], got {list(buf.shape)}")
        if not buf.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {buf.stride()}")

    def __call__(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        """x [m, hidden] bf16 contiguous on the weights' device -> out [m, hidden] bf16.

        Allocates out unless given; on the kernel path act [m, inter] is a buffer reused
        per (thread, stream, m) (see _ActBuffers), and a fresh one during graph capture. An
        unprepared kernel-path token count is prepared on first use, or raises CaptureError
        during graph capture.
        """
        m = self._check_x(x)
        if out is not None:
            self._check_buffer(out, "out", m, self.hidden)
        pair = self._kernels.get(m)
        if pair is None:
            return self._call_without_kernels(x, m, None, out)
        stream = self._stream_of(self._index)
        act = self._act_buffers.get(x, m, stream)
        if out is None:
            # new_empty: x's dtype and device are already checked; the cheapest call
            out = x.new_empty((m, self.hidden))
        self._launch(pair, x, act, out, stream, m)
        return out

    def forward_into(self, x: Tensor, act: Tensor, out: Tensor) -> Tensor:
        """Like ``__call__`` but writes act [m, inter] and out [m, hidden] into the caller's
        buffers; returns out. Nothing is allocated on the kernel path."""
        m = self._check_x(x)
        self._check_buffer(act, "act", m, self.intermediate)
        self._check_buffer(out, "out", m, self.hidden)
        pair = self._kernels.get(m)
        if pair is None:
            return self._call_without_kernels(x, m, act, out)
        self._launch(pair, x, act, out, self._stream_of(self._index), m)
        return out

    def _launch(
        self, pair: KernelPair, x: Tensor, act: Tensor, out: Tensor, stream: int, m: int
    ) -> None:
        """gate_up then down of m tokens on ``stream`` (the current stream's raw handle, read
        once per call); x, act and out are checked by the caller, the weights at construction
        (their addresses are read here: see the properties)."""
        act_ptr = act.data_ptr()
        w13, w13_scale, w2, w2_scale = self._weight_ptrs
        streamed = self._streamed.get(m) if self._streamed else None
        if streamed is None:
            pair.launch_joined(
                (act_ptr, x.data_ptr(), w13(), w13_scale(), out.data_ptr(), act_ptr, w2(),
                 w2_scale()),
                self.pdl,
                stream,
            )  # fmt: skip
            return
        # fp8_stream's fifth pointer (a workspace its cluster form never touches): the output's.
        out_ptr = out.data_ptr()
        gate_up = (act_ptr, x.data_ptr(), w13(), w13_scale()) + ((act_ptr,) if streamed[0] else ())
        down = (out_ptr, act_ptr, w2(), w2_scale()) + ((out_ptr,) if streamed[1] else ())
        pair.launch_joined(gate_up + down, self.pdl, stream)

    def _call_without_kernels(
        self, x: Tensor, m: int, act: Tensor | None, out: Tensor | None
    ) -> Tensor:
        """A call whose token count has no kernels loaded: a kernel-path count not prepared
        yet is loaded now (never during capture) and then called; any other count runs the
        fallback. ``act`` None: called as ``__call__``, else as ``forward_into``. The weight
        scales' queued check is resolved here first (a loaded kernel implies it passed)."""
        self.check_scales()
        if self.path(m) != "kernel":
            return self._call_fallback(x, act, out)
        if self._capturing():
            raise CaptureError(
                f"DenseMlp called with {m} tokens during CUDA graph capture, but that "
                f"token count is not prepared: call prepare(tokens) with {m} in it "
                "before capture (a compile or module load cannot be captured)"
            )
        self._load([m])  # not prepare(): no act buffer is made inside a call
        if act is None:
            return self(x, out)
        return self.forward_into(x, act, out)

    def _call_fallback(self, x: Tensor, act: Tensor | None, out: Tensor | None) -> Tensor:
        """The stock path or the reference math (see ``path``), into the caller's buffers
        when given."""
        new_act, new_out = self._fallback(x, limit=self.limit, ue8m0=self.ue8m0)
        if act is not None:
            act.copy_(new_act)
        if out is None:
            return new_out
        out.copy_(new_out)
        return out
