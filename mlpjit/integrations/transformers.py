"""Run the dense MLPs and shared experts of a transformers FP8 model on DenseMlp.

    from mlpjit.integrations import transformers as mlpjit_hf

    names = mlpjit_hf.apply(model)  # ["model.layers.0.mlp", "model.layers.3.mlp.shared_experts"]
    model.generate(...)  # every call of those modules runs DenseMlp
    mlpjit_hf.remove(model)  # back to transformers' own forward

What it routes: every module with ``gate_proj``, ``up_proj`` and ``down_proj`` FP8 linears and
a SiLU ``act_fn``, i.e. ``down(silu(gate(x)) * up(x))``: DeepSeek-V3 / Kimi-K2 dense MLPs and
shared experts (DeepseekV3MLP), GLM-5's (GlmMoeDsaMLP), GLM-4.5's, and any module built the same
way. A linear counts as FP8 by its attributes, not its class: a float8_e4m3fn ``weight`` [N, K]
and a ``weight_scale_inv`` of float32 or float8_e8m0fnu block scales [N/128, K/128] (what
transformers' FineGrainedFP8Config loads into ``transformers.integrations.finegrained_fp8.
FP8Linear``), no bias, dynamic activation scales, ``block_size`` (128, 128) where the module
says. A module that looks like an MLP but fails a check (another activation, another block
size, unloaded or sharded weights, ...) is left alone with one WARNING naming it and why.

How: each routed module gets an instance ``forward`` (the class's is untouched) that flattens
batch and sequence to x [m, hidden] and calls a DenseMlp built on the module's own weights:
1-8 tokens run the fused kernels (on a Hopper GPU), more tokens DenseMlp's stock path, CPU
weights the reference math. Under torch.compile the same forward calls the
``mlpjit::dense_mlp`` custom op (mlpjit.ops) instead, so the graph has no break; the op finds
the same, already prepared, DenseMlp in its registry. Kernels are prepared by apply() for
``tokens``: call it before capturing CUDA graphs (a static cache with torch.compile's
"reduce-overhead" mode).

The weights are the module's parameters, not copies. DenseMlp wants gate and up as one
[2*inter, hidden] tensor, so apply() moves them into one storage once (gate rows, then up
rows) and re-points the gate and up parameters at their halves: the same Parameter objects
with the same values, no second copy kept. remove() restores each module's forward and leaves
that storage as it is (a later apply() then copies nothing); save_pretrained copes with such
disjoint views (it clones them before writing). Move or convert the model (``.to()``) before
apply(): a routed call whose weights were replaced since raises RuntimeError.

mlpjit.ops's registry keeps a reference to the weights of each routed layer, so unloading a
model frees them only after ``mlpjit.ops.clear_registry()`` (or LRU eviction).

Activation scales (mlpjit.scale_rule): by default (``ue8m0=None``) the rule the model's
``config.quantization_config`` gives: its ``scale_fmt`` "ue8m0" means power-of-two scales,
any other value float32 scales (transformers' FineGrainedFP8Config writes "float": its FP8
linears quantize with plain amax/448 scales, DeepGEMM's and the Triton kernel's float32
recipe, and the routed modules then compute the same). A model whose config gives no
scale_fmt gets mlpjit's default, UE8M0 (vLLM's and SGLang's rule with DeepGEMM, and
``mlpjit warm``'s). ``ue8m0=True`` or ``False`` overrides both.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mlpjit.kernels.blocks import BLOCK

if TYPE_CHECKING:
    from torch import Tensor, nn

    from mlpjit.dense_mlp import DenseMlp

__all__ = ["apply", "model_ue8m0", "remove", "routed"]

logger = logging.getLogger(__name__)

_PROJS = ("gate_proj", "up_proj", "down_proj")
_ROUTE = "_mlpjit_route"  # the attribute of a routed module holding its _Route
_SILU_CLASSES = ("SiLU", "SiLUActivation")  # torch.nn.SiLU, transformers.activations'


# ---- which modules qualify ------------------------------------------------------------------


def _looks_like_mlp(module: nn.Module) -> bool:
    """Has gate_proj, up_proj and down_proj submodules: an MLP apply() considers."""
    from torch import nn

    return all(isinstance(getattr(module, p, None), nn.Module) for p in _PROJS)


def _is_silu(act: object) -> bool:
    """True for torch.nn.SiLU, transformers' SiLUActivation (ACT2FN["silu"]) and F.silu."""
    import torch.nn.functional as F

    return act is F.silu or type(act).__name__ in _SILU_CLASSES


def _linear_problem(proj: str, linear: nn.Module) -> str | None:
    """Why ``linear`` is not a 128x128 block-FP8 linear DenseMlp can take (None: it is)."""
    import torch

    weight = getattr(linear, "weight", None)
    scale = getattr(linear, "weight_scale_inv", None)
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float8_e4m3fn:
        dtype = getattr(weight, "dtype", type(weight).__name__)
        return f"{proj}.weight is {dtype}, not a float8_e4m3fn weight"
    if type(weight.data) is not torch.Tensor:
        return f"{proj}.weight is a {type(weight.data).__name__} (sharded), not a plain tensor"
    if weight.dim() != 2 or weight.device.type == "meta":
        return f"{proj}.weight is not a loaded 2-D weight ({weight.device}, {list(weight.shape)})"
    if not weight.is_contiguous():
        return f"{proj}.weight is not contiguous"
    block = getattr(linear, "block_size", (BLOCK, BLOCK))
    if block is None or tuple(block) != (BLOCK, BLOCK):
        return f"{proj}.block_size is {block}, not ({BLOCK}, {BLOCK})"
    n, k = weight.shape
    blocks = (-(-n // BLOCK), -(-k // BLOCK))
    if not isinstance(scale, torch.Tensor) or scale.dtype not in (
        torch.float32,
        torch.float8_e8m0fnu,
    ):
        return f"{proj}.weight_scale_inv is not a float32 or float8_e8m0fnu tensor"
    if tuple(scale.shape) != blocks:
        return (
            f"{proj}.weight_scale_inv has shape {list(scale.shape)}, not the {BLOCK}x{BLOCK} "
            f"block shape {list(blocks)}"
        )
    if getattr(linear, "bias", None) is not None:
        return f"{proj} has a bias"
    if getattr(linear, "activation_scale", None) is not None:
        return f"{proj} uses a static activation scale (DenseMlp quantizes per token group)"
    return None


def _shape_problem(gate: Tensor, up: Tensor, down: Tensor) -> str | None:
    """Why the three weights do not form one MLP DenseMlp takes (None: they do)."""
    inter, hidden = gate.shape
    if tuple(up.shape) != (inter, hidden) or tuple(down.shape) != (hidden, inter):
        return (
            f"gate/up/down shapes {list(gate.shape)}, {list(up.shape)}, {list(down.shape)} are "
            "not [inter, hidden], [inter, hidden], [hidden, inter]"
        )
    if hidden % BLOCK or inter % BLOCK:
        return f"hidden {hidden} and intermediate {inter} must be multiples of {BLOCK}"
    if not gate.device == up.device == down.device:
        return f"weights on different devices ({gate.device}, {up.device}, {down.device})"
    return None


def _skip_reason(module: nn.Module) -> str | None:
    """Why an MLP-looking module cannot run on DenseMlp (None: it can)."""
    act = getattr(module, "act_fn", None)
    if not _is_silu(act):
        return f"act_fn is {type(act).__name__}, not SiLU"
    if any(hasattr(m, "_hf_hook") for m in (module, *(getattr(module, p) for p in _PROJS))):
        return "it has an accelerate hook (offloaded or dispatched weights)"
    for proj in _PROJS:
        problem = _linear_problem(proj, getattr(module, proj))
        if problem is not None:
            return problem
    return _shape_problem(*(getattr(module, p).weight for p in _PROJS))


# ---- building a route -----------------------------------------------------------------------


def _adjacent(top: Tensor, bottom: Tensor) -> bool:
    """Whether ``bottom``'s rows follow ``top``'s in one storage (both contiguous)."""
    return (
        top.is_contiguous()
        and bottom.is_contiguous()
        and top.dtype == bottom.dtype
        and top.shape[1:] == bottom.shape[1:]
        and top.untyped_storage().data_ptr() == bottom.untyped_storage().data_ptr()
        and bottom.storage_offset() == top.storage_offset() + top.numel()
    )


def _merge_rows(top: nn.Parameter, bottom: nn.Parameter) -> Tensor:
    """One contiguous tensor holding ``top``'s rows then ``bottom``'s, in the parameters'
    own memory: when they are not adjacent in one storage yet, they are copied into a new
    one and re-pointed at its halves (same Parameter objects and values), so the old
    storages are freed and nothing is kept twice."""
    import torch

    a, b = top.detach(), bottom.detach()
    rows = a.shape[0] + b.shape[0]
    if _adjacent(a, b):
        return torch.as_strided(a, (rows, *a.shape[1:]), b.stride(), a.storage_offset())
    merged = torch.cat((a, b))
    top.data = merged[: a.shape[0]]
    bottom.data = merged[a.shape[0] :]
    return merged


class _Route:
    """One module routed to DenseMlp: the layer's tensors, the DenseMlp, and the module's
    forward as it was (to restore)."""

    def __init__(self, module: nn.Module, tokens: Iterable[int], ue8m0: bool) -> None:
        import torch._dynamo

        from mlpjit import ops
        from mlpjit.scales import to_float32_scale

        gate, up, down = (getattr(module, p) for p in _PROJS)
        self._linears = (gate, up, down)
        w13 = _merge_rows(gate.weight, up.weight)
        s13 = _merge_rows(gate.weight_scale_inv, up.weight_scale_inv)
        # float32 once: the op's schema takes float32 scales (no copy if they are already)
        self.w13_scale = to_float32_scale(s13, *w13.shape, name="gate_proj/up_proj scales")
        self.w2 = down.weight.detach()
        self.w2_scale = to_float32_scale(
            down.weight_scale_inv.detach(), *self.w2.shape, name="down_proj.weight_scale_inv"
        )
        self.w13 = w13
        for t in (self.w13, self.w13_scale, self.w2, self.w2_scale):
            # Static for torch.compile's CUDA graphs, as parameters are: otherwise each replay
            # would copy the weights into the graph's own input buffers, and the op would see
            # those copies' addresses (a registry miss, an unprepared DenseMlp in capture).
            torch._dynamo.mark_static_address(t)
        self.ue8m0 = ue8m0
        self.hidden = w13.shape[1]
        self._pointers = self._weight_pointers()
        self.mlp: DenseMlp = ops.prepare(
            w13, self.w13_scale, self.w2, self.w2_scale, tokens, limit=None, ue8m0=ue8m0
        )
        self._saved: object | None = None
        self._had_forward = False

    def _weight_pointers(self) -> tuple[int, ...]:
        """The addresses of the three weights and their scales now (a changed one: they were
        replaced; in-place updates keep the address and are seen, except in e8m0 scales,
        which DenseMlp holds as a float32 copy)."""
        return tuple(
            t.data_ptr()
            for linear in self._linears
            for t in (linear.weight, linear.weight_scale_inv)
        )

    def forward(self, x: Tensor) -> Tensor:
        """The routed module's forward: x [..., hidden] -> [..., hidden] in x's dtype."""
        import torch

        from mlpjit import ops

        shape = x.shape
        x2d = x.reshape(-1, self.hidden).to(torch.bfloat16).contiguous()
        if torch.compiler.is_compiling():
            out = ops.dense_mlp(
                x2d, self.w13, self.w13_scale, self.w2, self.w2_scale, None, self.ue8m0
            )
        else:
            self._check_weights()
            if x2d.shape[0] == 0:
                return x.new_zeros(shape)
            out = self.mlp(x2d)
        return out.to(x.dtype).reshape(shape)

    def _check_weights(self) -> None:
        """RuntimeError when the module's weights are no longer the ones routed (the model
        was moved or converted after apply()): DenseMlp would read stale tensors."""
        if self._weight_pointers() != self._pointers:
            raise RuntimeError(
                "the weights of a module routed by mlpjit.integrations.transformers.apply() "
                "were replaced (model moved or converted?): call remove(model), then apply(model)"
            )

    def install(self, module: nn.Module) -> None:
        """Make ``module``'s calls run ``self.forward`` (an instance attribute, over any)."""
        self._had_forward = "forward" in module.__dict__
        self._saved = module.__dict__.get("forward")
        module.__dict__["forward"] = self.forward
        module.__dict__[_ROUTE] = self

    def uninstall(self, module: nn.Module) -> None:
        """Give ``module`` back the forward it had before install()."""
        if self._had_forward:
            module.__dict__["forward"] = self._saved
        else:
            module.__dict__.pop("forward", None)
        module.__dict__.pop(_ROUTE, None)


# ---- the public functions -------------------------------------------------------------------


def _candidates(model: nn.Module) -> tuple[list[tuple[str, nn.Module]], list[str]]:
    """(modules to route, names already routed), in model order; skipped modules logged."""
    todo, done = [], []
    for name, module in model.named_modules():
        if _ROUTE in module.__dict__:
            done.append(name)
        elif _looks_like_mlp(module):
            reason = _skip_reason(module)
            if reason is None:
                todo.append((name, module))
            else:
                logger.warning("mlpjit: not routing %s to DenseMlp: %s", name or "<model>", reason)
    return todo, done


def model_ue8m0(model: nn.Module) -> bool | None:
    """The activation-scale rule ``model.config.quantization_config`` gives (its scale_fmt:
    True for "ue8m0", False for any other value), or None when it gives none."""
    from mlpjit.scale_rule import quantization_ue8m0

    config = getattr(model, "config", None)
    return quantization_ue8m0(getattr(config, "quantization_config", None))


def apply(
    model: nn.Module, tokens: Iterable[int] = range(1, 9), *, ue8m0: bool | None = None
) -> list[str]:
    """Route every dense MLP and shared expert of ``model`` (see the module docstring) to a
    DenseMlp on its own weights; return the routed modules' names, in model order.

    ``tokens``: the token counts to prepare kernels for (before CUDA graph capture). Modules
    already routed stay as they are (their kernels are prepared for ``tokens`` too); modules
    that do not qualify are left alone with a WARNING each. All-or-nothing: if building any
    layer fails (e.g. a NaN weight scale: ValueError), no module is routed.

    ``ue8m0``: the activation-scale rule; None (the default) takes it from the model's
    quantization_config (``model_ue8m0``), else mlpjit.scale_rule.DEFAULT_UE8M0.
    """
    from mlpjit.scale_rule import resolve_ue8m0

    ue8m0 = resolve_ue8m0(ue8m0, model_ue8m0(model) if ue8m0 is None else None)
    tokens = list(tokens)
    todo, done = _candidates(model)
    for name in done:
        model.get_submodule(name).__dict__[_ROUTE].mlp.prepare(tokens)
    routes = [(module, _Route(module, tokens, ue8m0)) for _, module in todo]
    for module, route in routes:
        route.install(module)
    routed_now = {name for name, _ in todo}
    return [name for name, _ in model.named_modules() if name in routed_now or name in done]


def remove(model: nn.Module) -> list[str]:
    """Undo apply(): every routed module of ``model`` gets its own forward back; returns
    their names. Parameters stay the same objects with the same values (gate and up keep
    sharing the storage apply() gave them)."""
    names = []
    for name, module in model.named_modules():
        route = module.__dict__.get(_ROUTE)
        if route is not None:
            route.uninstall(module)
            names.append(name)
    return names


def routed(model: nn.Module) -> list[str]:
    """The names of ``model``'s modules that apply() routed to DenseMlp (and not removed)."""
    return [name for name, module in model.named_modules() if _ROUTE in module.__dict__]
