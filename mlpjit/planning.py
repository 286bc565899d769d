"""Which kernels to warm: the request list of a model preset, a hidden/intermediate pair, a
checkpoint, a kernel's parameter grid or a request file, and why a layer has none.

    plan = shard_plan(model_shapes("glm5", tp=8), tp=8, tokens=range(1, 9), arch="sm_90a")
    plan.requests   # both fp8_gemv kernels of each layer's TP shard, per token count
    plan.notes      # one line per layer kind that runs the stock path, saying why

Whether the kernel takes a shape is fp8_gemv's own question (``tuning.kernel_supports``,
asked through ``layer_plan.dense_mlp_requests``); this module only asks it, per half of the
shard and per token count, and words the answer. Nothing here prints: the CLI prints the
notes. User errors are UsageError (a ValueError) naming the argument. No cutlass or torch
import: the kernel's planner is pure Python.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from mlpjit.errors import UsageError

if TYPE_CHECKING:
    from mlpjit.jit.spec import KernelRequest

__all__ = [
    "LAYER_KERNELS",
    "MAX_PARAM_REQUESTS",
    "MAX_REQUESTS_BYTES",
    "LayerShape",
    "Plan",
    "check_requests",
    "checkpoint_shapes",
    "model_shapes",
    "param_grid_requests",
    "read_requests",
    "register_kernels",
    "retarget",
    "shard_plan",
    "stock_reason",
]

# The kernels whose entries are one half of a DenseMlp layer, a weight of rows x k.
LAYER_KERNELS = ("fp8_gemv", "fp8_stream")
# Largest request file read: a request line is ~300 bytes, so this is ~200k lines.
MAX_REQUESTS_BYTES = 64 << 20
# Most requests a parameter grid may multiply into (the product of its value lists): a
# sweep of every tuning knob of one shape stays far below it.
MAX_PARAM_REQUESTS = 4096


@dataclass(frozen=True)
class LayerShape:
    """One MLP layer kind to warm: its full (unsharded) sizes and how to name it."""

    hidden: int
    intermediate: int
    label: str  # e.g. "glm5 shared expert": the subject of a stock-path note


@dataclass
class Plan:
    """The distinct requests of a plan, in order, and the notes worth telling the user."""

    requests: list[KernelRequest] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def register_kernels() -> None:
    """Register mlpjit's kernels, then those of MLPJIT_KERNEL_MODULES, by importing them
    (their specs register on import; no compiler is imported). UsageError naming the
    variable for a module that does not import."""
    import importlib

    import mlpjit.kernels  # noqa: F401
    from mlpjit.jit import config

    try:
        names = config.kernel_modules()
    except ValueError as err:
        raise UsageError(str(err), argument="MLPJIT_KERNEL_MODULES") from None
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise UsageError(
                f"MLPJIT_KERNEL_MODULES: cannot import {name!r} ({err})",
                argument="MLPJIT_KERNEL_MODULES",
                value=name,
            ) from None


# --------------------------------------------------------------------- shapes


def model_shapes(
    model: str, tp: int, layers: Sequence[str] | None = None
) -> tuple[list[LayerShape], list[str]]:
    """The shapes of ``layers`` (default: models.LAYERS) of preset ``model``, and notes.

    "shared" of a model without a shared expert is skipped with a note, or a UsageError
    when it is all ``layers`` asked for; a layer whose intermediate size ``tp`` does not
    divide is a UsageError naming it (no rank could hold such a shard).
    """
    from mlpjit.models import LAYERS, get_preset

    try:
        preset = get_preset(model)
    except ValueError as err:
        raise UsageError(str(err), argument="--model", value=model) from None
    have = preset.layers()
    asked = tuple(layers or LAYERS)
    missing = [layer for layer in asked if layer not in have]
    if missing and len(missing) == len(asked):
        raise UsageError(
            f"{preset.name} has no shared expert: --layers {','.join(asked)} leaves nothing "
            f"to warm (allowed for it: {', '.join(have)})",
            argument="--layers",
            value=",".join(asked),
        )
    notes = []
    if missing:
        notes.append(f"{preset.name} has no shared expert; warming its dense layers only")
    shapes = []
    for layer in asked:
        if layer not in have:
            continue
        what = "dense MLP" if layer == "dense" else "shared expert"
        if have[layer] % tp:
            raise UsageError(
                f"tp must divide {preset.name}'s {what} intermediate size {have[layer]}, got {tp}",
                argument="--tp",
                value=tp,
            )
        shapes.append(LayerShape(preset.hidden, have[layer], f"{preset.name} {what}"))
    return shapes, notes


_CHECKPOINT_LABELS = {
    "dense": "dense MLP (config.json intermediate_size {})",
    "shared": "shared expert (config.json moe_intermediate_size * n_shared_experts = {})",
}


def checkpoint_shapes(path: str | Path, tp: int) -> list[LayerShape]:
    """Every distinct dense-MLP / shared-expert shape of the checkpoint at ``path``, each
    checked to split over ``tp`` ranks (UsageError naming the layer otherwise)."""
    from mlpjit.checkpoint import checkpoint_mlp_shapes, shard_range

    shapes = sorted(
        {
            LayerShape(h, i, _CHECKPOINT_LABELS[_layer_kind(prefix)].format(i))
            for prefix, h, i in checkpoint_mlp_shapes(path)
        },
        key=lambda s: (s.hidden, s.intermediate, s.label),
    )
    for shape in shapes:
        try:
            shard_range(shape.intermediate, 0, tp)
        except ValueError as err:
            raise UsageError(f"{shape.label}: {err}", argument="--tp", value=tp) from None
    return shapes


def _layer_kind(prefix: str) -> str:
    return "shared" if prefix.endswith("shared_experts") else "dense"


# --------------------------------------------------------------------- requests


def shard_plan(
    shapes: Sequence[LayerShape],
    *,
    tp: int,
    tokens: Sequence[int],
    arch: str,
    ue8m0: bool,
    limit: float | None = None,
    sms: int | None = None,
) -> Plan:
    """The distinct kernels of every shape's TP shard at ``tokens``, in order.

    A shape the kernel does not take runs the stock path and needs none: one note per such
    layer kind, saying why. Only when no shape has any kernel is that an error (UsageError),
    saying why for each. ``sms`` defaults to hopper.SMS (the H200's).
    """
    from mlpjit.kernels.fp8_gemv.params import MAX_TOKENS
    from mlpjit.kernels.hopper import SMS
    from mlpjit.layer_plan import dense_mlp_requests

    sms = SMS if sms is None else sms
    plan = Plan()
    for shape in shapes:
        try:
            found = dense_mlp_requests(
                shape.hidden,
                shape.intermediate,
                tp,
                tokens,
                arch,
                ue8m0=ue8m0,
                limit=limit,
                sms=sms,
            )
        except ValueError as err:  # a size or tp the planner refuses (the message names it)
            raise UsageError(f"{shape.label}: {err}") from None
        planned = {r.params.get("tokens") for r in found}
        stock = [m for m in tokens if m <= MAX_TOKENS and m not in planned]
        if stock:
            why = stock_reason(shape.hidden, shape.intermediate, tp, stock, sms)
            counts = "" if not found else f" for tokens {','.join(map(str, stock))}"
            plan.notes.append(f"{shape.label} runs the stock path at tp {tp}{counts}: {why}")
        plan.requests += [r for r in found if r not in plan.requests]
    if not plan.requests:
        raise UsageError(
            "; ".join(_why_no_kernels(s.hidden, s.intermediate, tp, tokens, sms) for s in shapes),
            argument="--tokens" if min(tokens) > MAX_TOKENS else None,
        )
    plan.notes = list(dict.fromkeys(plan.notes))
    return plan


def stock_reason(
    hidden: int, intermediate: int, tp: int, tokens: Sequence[int], sms: int | None = None
) -> str:
    """Why fp8_gemv takes no kernel of this TP shard at ``tokens`` (so it runs the stock
    path), from the kernel's own answer (tuning.kernel_supports) for each half:
    gate_up (rows 2*intermediate/tp, k hidden) and down (rows hidden, k intermediate/tp).
    A half the kernel refuses is described by the first of its documented rules it breaks
    (token count, K in 128-groups), else as not fitting its resource limits."""
    from mlpjit.kernels.blocks import BLOCK as GROUP
    from mlpjit.kernels.fp8_gemv.params import MAX_TOKENS
    from mlpjit.kernels.fp8_gemv.tuning import kernel_supports
    from mlpjit.kernels.hopper import SMS

    sms = SMS if sms is None else sms
    inter = intermediate // tp
    lo, hi = min(tokens), max(tokens)
    if lo > MAX_TOKENS:
        return (
            f"no token count in {lo}..{hi} takes the kernel path (1-{MAX_TOKENS}); larger "
            f"counts run the stock path and need no kernel"
        )
    halves = {"gate_up": (2 * inter, hidden), "down": (hidden, inter)}
    counts = [m for m in tokens if m <= MAX_TOKENS]
    refused = [
        name
        for name, (rows, k) in halves.items()
        if not all(kernel_supports(rows, k, m, sms) for m in counts)
    ]
    if "gate_up" in refused and hidden % GROUP:
        return f"hidden {hidden} is not a multiple of {GROUP}"
    if "down" in refused and inter % GROUP:
        return (
            f"tp {tp} does not divide intermediate {intermediate} into multiples of {GROUP} "
            f"(each rank gets {inter})"
        )
    shown = " or ".join(f"{n} {halves[n][0]}x{halves[n][1]}" for n in refused or halves)
    return (
        f"fp8_gemv cannot take {shown} within the shared-memory and register limits "
        f"(they run the stock path)"
    )


def _why_no_kernels(
    hidden: int, intermediate: int, tp: int, tokens: Sequence[int], sms: int
) -> str:
    """What was asked and why no kernel fits it (a plan with 0 kernels warms nothing)."""
    lo, hi = min(tokens), max(tokens)
    asked = f"hidden {hidden}, intermediate {intermediate}, tp {tp}, tokens {lo}..{hi}"
    return f"no kernels to warm for {asked}: {stock_reason(hidden, intermediate, tp, tokens, sms)}"


def param_grid_requests(
    kernel: str, params: Sequence[tuple[str, Sequence[Any]]], arch: str
) -> list[KernelRequest]:
    """One request of ``kernel`` per combination of the (name, values) lists, at most
    MAX_PARAM_REQUESTS (checked as the product grows: no huge product is built)."""
    from mlpjit.jit.spec import KernelRequest

    names = [name for name, _ in params]
    if len(set(names)) != len(names):
        raise UsageError(f"--param given twice for one name: {names}", argument="--param")
    total = 1
    for _, values in params:
        total *= len(values)
        if total > MAX_PARAM_REQUESTS:
            lists = " x ".join(str(len(v)) for _, v in params)
            raise UsageError(
                f"--param value lists multiply into {lists} requests; at most "
                f"{MAX_PARAM_REQUESTS} (warm the rest in another run)",
                argument="--param",
            )
    grid = itertools.product(*(values for _, values in params))
    return [KernelRequest(kernel, dict(zip(names, combo, strict=True)), arch) for combo in grid]


def check_requests(requests: Iterable[KernelRequest]) -> None:
    """Refuse, before any work, a request whose kernel is not registered (UsageError naming
    --kernel), whose params its kernel does not take (naming --param; the message names the
    parameter), or whose arch its kernel does not compile for (naming --arch)."""
    from mlpjit.jit.manager import check_compile_arch
    from mlpjit.jit.spec import get_spec

    for request in requests:
        try:
            spec = get_spec(request.kernel)
        except ValueError as err:
            raise UsageError(str(err), argument="--kernel", value=request.kernel) from None
        try:
            spec.make_params(request.params)
        except ValueError as err:
            raise UsageError(str(err), argument="--param") from None
    for kernel, arch in sorted({(r.kernel, r.arch) for r in requests}):
        try:
            check_compile_arch(get_spec(kernel), arch)
        except ValueError as err:
            raise UsageError(
                f"cannot warm for {arch}: {err}", argument="--arch", value=arch
            ) from None


def retarget(requests: Iterable[KernelRequest], arch: str) -> list[KernelRequest]:
    """``requests`` with every arch replaced by ``arch``."""
    from mlpjit.jit.spec import KernelRequest

    return [KernelRequest(r.kernel, r.params, arch) for r in requests]


# --------------------------------------------------------------------- request files


def read_requests(path: str | Path) -> list[KernelRequest]:
    """Requests from a JSON-lines file ({"kernel", "params", "arch"} per line, the
    MLPJIT_RECORD format), in first-seen order, duplicates dropped; UsageError naming the
    file (and line) otherwise."""
    from mlpjit.jit.spec import KernelRequest

    path = Path(path)
    requests: dict[str, KernelRequest] = {}
    for number, line in _request_lines(path):
        try:
            request = KernelRequest.from_json_line(line)
        except ValueError as err:
            raise UsageError(f"{path}:{number}: {err}", path=str(path)) from None
        requests.setdefault(request.to_json_line(), request)
    return list(requests.values())


def _open_requests(path: Path) -> BinaryIO:
    """Open a request file: a regular file of at most MAX_REQUESTS_BYTES, else UsageError.

    O_NONBLOCK so that a FIFO is refused instead of waiting for a writer; /dev/zero and the
    like are refused instead of being read until memory runs out.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"request file {path} is not a regular file", path=str(path))
        if st.st_size > MAX_REQUESTS_BYTES:
            raise UsageError(
                f"request file {path} has {st.st_size} bytes, more than the "
                f"{MAX_REQUESTS_BYTES >> 20} MiB a request list may have",
                path=str(path),
            )
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _request_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line; never reads more than MAX_REQUESTS_BYTES,
    even of a file that grows while it is read."""
    budget = MAX_REQUESTS_BYTES
    with _open_requests(path) as f:
        for number in itertools.count(1):
            raw = f.readline(budget + 1)
            if not raw:
                return
            budget -= len(raw)
            if budget < 0:
                raise UsageError(
                    f"request file {path} grew past {MAX_REQUESTS_BYTES >> 20} MiB while read",
                    path=str(path),
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UsageError(f"{path}:{number}: not UTF-8 text", path=str(path)) from None
            if line.strip():
                yield number, line


# --------------------------------------------------------------------- what an entry serves


@dataclass(frozen=True)
class ShardRole:
    """One model layer a kernel serves: preset, layer kind, TP size, half."""

    model: str
    layer: str  # "dense" or "shared" (models.LAYERS)
    tp: int
    half: str  # "gate_up" (SwiGLU fused) or "down"

    def __str__(self) -> str:
        return f"{self.model} {self.layer} tp{self.tp} {self.half}"


def shard_roles(kernel: Any, params: Any) -> list[ShardRole]:
    """The model presets' layers whose TP shard an entry of LAYER_KERNELS with these params
    serves (rows and k of the gate_up: 2*intermediate/tp x hidden, or the down:
    hidden x intermediate/tp), smallest TP first (the likeliest reading: GLM-5's 6144 x 256 down is
    its shared expert at TP 8 before its dense MLP at TP 48); [] for another kernel or a
    shape no preset has."""
    from mlpjit.models import PRESETS

    if kernel not in LAYER_KERNELS or not isinstance(params, dict):
        return []
    rows, k, swiglu = params.get("rows"), params.get("k"), params.get("swiglu")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (rows, k)):
        return []
    half = "gate_up" if swiglu else "down"
    hidden, shard = (k, rows // 2) if swiglu else (rows, k)
    roles = []
    for preset in PRESETS.values():
        if preset.hidden != hidden:
            continue
        for layer, intermediate in preset.layers().items():
            if intermediate % shard == 0:
                roles.append(ShardRole(preset.name, layer, intermediate // shard, half))
    return sorted(roles, key=lambda role: role.tp)
