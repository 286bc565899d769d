"""DenseMlp as a torch custom op, so torch.compile(fullgraph=True) calls it without a break.

    import mlpjit.ops                      # registers torch.ops.mlpjit.dense_mlp (once)
    out = mlpjit.ops.dense_mlp(x, w13, w13_scale, w2, w2_scale, limit=None, ue8m0=True)

``dense_mlp`` calls the op wherever a call is traced or intercepted (torch.compile, fx, jit,
export, fake tensors, dispatch modes, autograd) and the layer directly in plain eager calls,
which skips the op's dispatch (8-12 us of host time per call); ``dense_mlp_op`` is the op.

The op takes tensors and plain scalars only: x bf16 [m, hidden], w13 float8_e4m3fn
[2*inter, hidden], w13_scale float32 [2*inter/128, hidden/128], w2 float8_e4m3fn
[hidden, inter], w2_scale float32 [hidden/128, inter/128], limit (float or None), ue8m0
(bool); it returns a new bf16 [m, hidden] (TP-partial, like DenseMlp). Its fake impl only
computes the output shape, so torch.compile traces it without running anything.

The real impl needs a DenseMlp for those weights: it looks one up in a per-process registry
keyed by the weights' identity (data_ptr, shape, dtype and device of all four weight tensors,
plus limit and ue8m0), and builds it once on a miss. Why identity and not the tensor objects:
under torch.compile the op receives the parameters as graph inputs, which may be different
Python objects over the same memory.

The registry is bounded (an LRU of ``registry_capacity()`` layers, 256 by default): each
entry holds a strong reference to its weights (DenseMlp uses the caller's tensors without
copying), which also keeps the keys sound, since memory that is referenced cannot be freed
and reused by another tensor at the same address. The cost is that up to that many layers'
weights outlive their model until evicted or ``clear_registry()`` is called (e.g. when a
server unloads a model). In-place updates of the weights (``copy_`` into the same storage)
are seen, as with DenseMlp.

CUDA graphs: call ``prepare(...)`` (or ``DenseMlpOp.prepare``) with the token counts before
capture, exactly as for DenseMlp; an unprepared token count raises CaptureError during
capture instead of compiling.

Registration happens when this module is first imported, never at ``import mlpjit``.
"""

import threading
from collections import OrderedDict
from collections.abc import Iterable

import torch
from torch import Tensor
from torch._C import _is_torch_function_mode_enabled, _len_torch_dispatch_stack
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from mlpjit.dense_mlp import DenseMlp
from mlpjit.scale_rule import DEFAULT_UE8M0

__all__ = [
    "DenseMlpOp",
    "OP_NAME",
    "clear_registry",
    "dense_mlp",
    "dense_mlp_op",
    "get_mlp",
    "prepare",
    "registry_capacity",
    "registry_size",
    "set_registry_capacity",
]

OP_NAME = "mlpjit::dense_mlp"
DEFAULT_CAPACITY = 256  # dense layers per process; a DeepSeek-style model has 1 to 3 of them

_lock = threading.Lock()
_registry: OrderedDict[tuple, DenseMlp] = OrderedDict()
_capacity = DEFAULT_CAPACITY


def _tensor_identity(t: Tensor) -> tuple:
    """What names a weight's memory in the registry: address, shape, dtype, device (the
    shape as torch.Size, a tuple already: copying it cost more than the rest)."""
    return (t.data_ptr(), t.shape, t.dtype, t.device)


def _registry_key(
    w13: Tensor, w13_scale: Tensor, w2: Tensor, w2_scale: Tensor, limit: float | None, ue8m0: bool
) -> tuple:
    """The registry key of one layer: its four weights' identities and its options."""
    return (
        _tensor_identity(w13),
        _tensor_identity(w13_scale),
        _tensor_identity(w2),
        _tensor_identity(w2_scale),
        None if limit is None else float(limit),
        bool(ue8m0),
    )


def _check_scale(scale: object, name: str) -> None:
    # The op's schema is plain tensors: other scale forms are converted by DenseMlp once, and
    # a converted copy would have a new data_ptr on every call (a registry miss per call).
    if not isinstance(scale, Tensor) or scale.dtype != torch.float32:
        got = scale.dtype if isinstance(scale, Tensor) else type(scale).__name__
        raise ValueError(
            f"{name} must be a float32 tensor for the mlpjit::dense_mlp op (convert UE8M0 "
            f"scales once with mlpjit.scales.to_float32_scale), got {got}"
        )


def get_mlp(
    w13: Tensor,
    w13_scale: Tensor,
    w2: Tensor,
    w2_scale: Tensor,
    limit: float | None = None,
    ue8m0: bool = DEFAULT_UE8M0,
) -> DenseMlp:
    """The registry's DenseMlp for these weights, built (and validated) once on a miss."""
    _check_scale(w13_scale, "w13_scale")
    _check_scale(w2_scale, "w2_scale")
    key = _registry_key(w13, w13_scale, w2, w2_scale, limit, ue8m0)
    with _lock:
        mlp = _registry.get(key)
        if mlp is not None:
            _registry.move_to_end(key)
            return mlp
    # Built outside the lock: validation and scale checks may take a while on big weights.
    mlp = DenseMlp(w13, w13_scale, w2, w2_scale, limit=limit, ue8m0=ue8m0)
    with _lock:
        mlp = _registry.setdefault(key, mlp)
        _registry.move_to_end(key)
        while len(_registry) > _capacity:
            _registry.popitem(last=False)
    return mlp


def prepare(
    w13: Tensor,
    w13_scale: Tensor,
    w2: Tensor,
    w2_scale: Tensor,
    tokens: Iterable[int],
    limit: float | None = None,
    ue8m0: bool = DEFAULT_UE8M0,
) -> DenseMlp:
    """Compile and load the kernels the op will use for these weights (before graph capture)."""
    mlp = get_mlp(w13, w13_scale, w2, w2_scale, limit=limit, ue8m0=ue8m0)
    mlp.prepare(tokens)
    return mlp


def clear_registry() -> None:
    """Forget every registered DenseMlp (drops the registry's references to weights)."""
    with _lock:
        _registry.clear()


def registry_size() -> int:
    """How many DenseMlp instances the registry holds."""
    with _lock:
        return len(_registry)


def registry_capacity() -> int:
    """The most DenseMlp instances the registry keeps (least recently used are evicted)."""
    return _capacity


def set_registry_capacity(capacity: int) -> None:
    """Bound the registry to ``capacity`` >= 1 layers, evicting the least recently used."""
    global _capacity
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
    with _lock:
        _capacity = capacity
        while len(_registry) > _capacity:
            _registry.popitem(last=False)


def dense_mlp(
    x: Tensor,
    w13: Tensor,
    w13_scale: Tensor,
    w2: Tensor,
    w2_scale: Tensor,
    limit: float | None = None,
    ue8m0: bool = DEFAULT_UE8M0,
) -> Tensor:
    """DenseMlp(w13, w13_scale, w2, w2_scale, limit, ue8m0)(x): bf16 [m, hidden], new tensor.

    Through torch.ops.mlpjit.dense_mlp wherever something records calls (see ``_direct``):
    torch.compile, torch.jit or torch.fx tracing, torch.export, tensor subclasses (fake or
    functional tensors), dispatch or function modes, autograd. Otherwise (a plain eager
    call, CUDA graph capture included) the registry's layer is called directly: the same
    result without the op's dispatch, 8-12 us of host time per call on the H200 test host.
    """
    if _direct(x):
        return get_mlp(w13, w13_scale, w2, w2_scale, limit=limit, ue8m0=ue8m0)(x)
    return dense_mlp_op(x, w13, w13_scale, w2, w2_scale, limit, ue8m0)


def _direct(x: object) -> bool:
    """Whether a call may skip the custom op: nothing traces or intercepts it. Compiling
    first: under torch.compile it is the only condition dynamo evaluates."""
    return (
        not torch.compiler.is_compiling()
        and type(x) is Tensor  # no FakeTensor, FunctionalTensor, fx Proxy or other subclass
        and not x.requires_grad  # the op has no autograd formula: let torch say so
        and not torch.jit.is_tracing()
        and not is_in_torch_dispatch_mode()  # make_fx, export, FakeTensorMode, FlopCounterMode
        and not _len_torch_dispatch_stack()
        and not _is_torch_function_mode_enabled()
    )


# Annotations stay real objects here (no `from __future__ import annotations`): torch infers
# the op schema from them.
@torch.library.custom_op(OP_NAME, mutates_args=())
def dense_mlp_op(
    x: Tensor,
    w13: Tensor,
    w13_scale: Tensor,
    w2: Tensor,
    w2_scale: Tensor,
    limit: float | None = None,
    ue8m0: bool = DEFAULT_UE8M0,
) -> Tensor:
    """The mlpjit::dense_mlp op: ``dense_mlp`` as one node torch.compile traces."""
    return get_mlp(w13, w13_scale, w2, w2_scale, limit=limit, ue8m0=ue8m0)(x)


@dense_mlp_op.register_fake
def _dense_mlp_fake(
    x: Tensor,
    w13: Tensor,
    w13_scale: Tensor,
    w2: Tensor,
    w2_scale: Tensor,
    limit: float | None = None,
    ue8m0: bool = DEFAULT_UE8M0,
) -> Tensor:
    # Shape checks only (they hold for symbolic m too); dtypes are DenseMlp's job at run time.
    if x.dim() != 2 or w13.dim() != 2 or w2.dim() != 2:
        raise ValueError(
            f"x, w13 and w2 must be 2-D, got shapes {list(x.shape)}, {list(w13.shape)}, "
            f"{list(w2.shape)}"
        )
    hidden = w13.shape[1]
    if x.shape[1] != hidden or w2.shape[1] * 2 != w13.shape[0] or w2.shape[0] != hidden:
        raise ValueError(
            f"x must be [m, hidden] with w13 [2*inter, hidden] and w2 [hidden, inter], got "
            f"x {list(x.shape)}, w13 {list(w13.shape)}, w2 {list(w2.shape)}"
        )
    return x.new_empty((x.shape[0], hidden), dtype=torch.bfloat16)


class DenseMlpOp(torch.nn.Module):
    """An nn.Module calling the mlpjit::dense_mlp op on its weights (torch.compile friendly).

    The weights are buffers (FP8 weights cannot require grad): ``module.to(device)`` moves
    them, after which ``prepare`` must be called again on the new device.
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
        super().__init__()
        get_mlp(w13, w13_scale, w2, w2_scale, limit=limit, ue8m0=ue8m0)  # validate now
        self.register_buffer("w13", w13)
        self.register_buffer("w13_scale", w13_scale)
        self.register_buffer("w2", w2)
        self.register_buffer("w2_scale", w2_scale)
        self.limit = None if limit is None else float(limit)
        self.ue8m0 = ue8m0

    def prepare(self, tokens: Iterable[int]) -> DenseMlp:
        """Compile and load this layer's kernels for these token counts (before capture)."""
        return prepare(
            self.w13,
            self.w13_scale,
            self.w2,
            self.w2_scale,
            tokens,
            limit=self.limit,
            ue8m0=self.ue8m0,
        )

    def forward(self, x: Tensor) -> Tensor:
        """x bf16 [m, hidden] -> bf16 [m, hidden] through ``dense_mlp`` (the
        torch.ops.mlpjit.dense_mlp op wherever a call is traced)."""
        return dense_mlp(
            x, self.w13, self.w13_scale, self.w2, self.w2_scale, self.limit, self.ue8m0
        )

    def extra_repr(self) -> str:
        """Shapes and options, for print(model)."""
        return (
            f"hidden={self.w13.shape[1]}, intermediate={self.w2.shape[1]}, limit={self.limit}, "
            f"ue8m0={self.ue8m0}"
        )
