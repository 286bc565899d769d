"""Weight block scales in the forms checkpoints carry them, converted once to float32.

The kernels and the stock path read float32 [N/128, K/128] (one scale per 128x128 weight
block). Checkpoints may instead store UE8M0 exponents (DeepGEMM-style, power-of-two scales):
as torch.float8_e8m0fnu [N/128, K/128], or as exponent bytes packed four per int32 along K
([N/128, ceil(K/128/4)], byte j of word i = exponent of block 4i+j, little-endian).

The converted values are checked once (``check_scale_values``): every scale must be finite
and >= 0. A NaN, an infinity or a negative scale (the UE8M0 byte 0xFF is the
float8_e8m0fnu NaN) is a checkpoint-loading bug that would otherwise surface as NaN outputs
at the first call. Zero is allowed: it is what ``amax / 448`` gives for an all-zero weight
block when a quantizer has no amax floor, and a zero scale times finite FP8 products is 0,
never NaN (UE8M0 cannot encode 0 at all; its smallest scale is 2^-127).

On a GPU that check is a host sync, so a layer queues it instead (``queue_scale_checks``:
CPU scales are still checked at once, they cost no sync) and ``resolve_scale_checks`` runs
every check queued in the process together, one host sync per device: a model's 78 layers
cost one sync at the first prepare() instead of 156 at construction.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from mlpjit.jit.capture import current_stream_capturing
from mlpjit.kernels.blocks import BLOCK, scale_shape

__all__ = [
    "ScaleCheck",
    "ScaleForm",
    "check_scale_values",
    "convert_scale",
    "queue_scale_checks",
    "resolve_scale_checks",
    "to_float32_scale",
]

# The form a block-scale tensor came in: decides how its bad values are described.
ScaleForm = Literal["float32", "e8m0", "packed"]


def _unpack_ue8m0(packed: Tensor, blocks: int) -> Tensor:
    """int32 [R, ceil(blocks/4)] of packed exponent bytes -> uint8 [R, blocks].

    Shifts instead of a byte view, so the result does not depend on the host's byte order.
    """
    words = packed.to(torch.int64)
    parts = [(words >> (8 * j)) & 0xFF for j in range(4)]
    exponents = torch.stack(parts, dim=-1).reshape(packed.shape[0], -1)
    return exponents[:, :blocks].to(torch.uint8)


def _describe_bad_values(scale: Tensor, name: str, form: ScaleForm) -> str:
    """The ValueError message for float32 block scales that are not all finite and >= 0:
    counts per kind of bad value, the first bad block and what is allowed."""
    s = scale.detach().to("cpu", torch.float32)
    finite = torch.isfinite(s)
    counts = (
        ("NaN", int(torch.isnan(s).sum())),
        ("+inf", int(torch.isposinf(s).sum())),
        ("-inf", int(torch.isneginf(s).sum())),
        ("negative", int((finite & (s < 0)).sum())),
    )
    total = sum(n for _, n in counts)
    found = ", ".join(f"{n} {kind}" for kind, n in counts if n)
    found += " value" if total == 1 else " values"
    i, j = (int(v) for v in (~(finite & (s >= 0))).nonzero()[0])
    where = f"first at block [{i}, {j}] ({s[i, j].item():.7g})"
    if form == "e8m0":
        # e8m0 has no sign, no infinity and no zero: NaN is its only bad value.
        found += " (the float8_e8m0fnu NaN code 0xFF)"
    elif form == "packed":
        found += " (the UE8M0 exponent byte 0xFF: the float8_e8m0fnu NaN code)"
        where += f", byte {j % 4} of int32 word [{i}, {j // 4}]"
    allowed = (
        "UE8M0 exponent bytes 0x00..0xFE (scales 2^-127..2^127)"
        if form != "float32"
        else "finite and >= 0 (0 only makes sense for an all-zero weight block)"
    )
    return f"{name} has {found}; {where}; block scales must be {allowed}"


def _capturing(scale: Tensor) -> bool:
    """True when ``scale`` is a CUDA tensor and its device's current stream is capturing a
    CUDA graph: a host sync there would invalidate the capture."""
    return current_stream_capturing(scale.device)


def check_scale_values(scale: Tensor, name: str, *, form: ScaleForm = "float32") -> None:
    """Raise ValueError naming ``name`` unless every float32 block scale is finite and >= 0.

    Meant to run once per tensor at construction, not per call: one fused elementwise test,
    one reduction and one host sync (the scales are tiny, [N/128, K/128]); only a failure
    pays for the detailed message. ``form`` is the checkpoint's form of the scales, so a NaN
    that came from the UE8M0 code 0xFF is named as such. Unchecked: meta tensors (no
    values), and CUDA tensors while their stream captures a graph (e.g. mlpjit.ops building
    a layer on a registry miss inside capture), where the sync would break the capture.
    """
    if scale.device.type == "meta" or scale.numel() == 0 or _capturing(scale):
        return
    if _all_valid(scale):
        return
    raise ValueError(_describe_bad_values(scale, name, form))


def _all_valid(values: Tensor) -> bool:
    """Every value finite and >= 0 (one host sync for a CUDA tensor)."""
    return bool((torch.isfinite(values) & (values >= 0)).all())


def to_float32_scale(scale: Tensor, rows: int, k: int, *, name: str = "w_scale") -> Tensor:
    """Return float32 [rows/128, k/128] block scales for a weight [rows, k], converting once.

    Accepts float32 [rows/128, k/128] (returned as is when contiguous: no copy),
    torch.float8_e8m0fnu [rows/128, k/128], or int32 [rows/128, ceil(k/128/4)] packed UE8M0.
    The result lives on ``scale``'s device. Raises ValueError naming ``name`` otherwise,
    also when a weight dim is not a positive multiple of 128 or a converted scale is not
    finite and >= 0 (see ``check_scale_values``: one host sync).
    """
    out, form = convert_scale(scale, rows, k, name=name)
    check_scale_values(out, name, form=form)
    return out


def convert_scale(
    scale: Tensor, rows: int, k: int, *, name: str = "w_scale"
) -> tuple[Tensor, ScaleForm]:
    """``to_float32_scale`` without the value check: (float32 scales, the form they came
    in), for a caller that checks the values later (``queue_scale_checks``)."""
    if not isinstance(scale, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(scale).__name__}")
    if rows < BLOCK or k < BLOCK or rows % BLOCK or k % BLOCK:
        # rows or k = 0 would pass the modulo test alone and give empty scales.
        raise ValueError(
            f"{name}: the weight shape [{rows}, {k}] must be a positive multiple of {BLOCK} "
            "in both dims"
        )
    n_blocks, k_blocks = scale_shape(rows, k)
    packed_cols = -(-k_blocks // 4)
    expected = (
        f"float32 or float8_e8m0fnu [{n_blocks}, {k_blocks}], "
        f"or int32 [{n_blocks}, {packed_cols}] (UE8M0 bytes packed four per int32 along K)"
    )
    shape = tuple(scale.shape)
    if scale.dtype == torch.float32 and shape == (n_blocks, k_blocks):
        return scale.contiguous(), "float32"
    if scale.dtype == torch.float8_e8m0fnu and shape == (n_blocks, k_blocks):
        return scale.to(torch.float32).contiguous(), "e8m0"
    if scale.dtype == torch.int32 and shape == (n_blocks, packed_cols):
        exponents = _unpack_ue8m0(scale, k_blocks)
        return exponents.view(torch.float8_e8m0fnu).to(torch.float32).contiguous(), "packed"
    raise ValueError(f"{name} must be {expected}; got {scale.dtype} {list(shape)}")


# ---- checks queued on the device, resolved together ------------------------------------------


class ScaleCheck:
    """The value checks of one layer's CUDA block scales, queued (see queue_scale_checks).

    ``verify()`` resolves every queued check of the process if this one is still open (one
    host sync per device), then raises this one's ValueError if a scale was bad: the same
    error, every time it is asked, until the layer is dropped.
    """

    __slots__ = ("__weakref__", "_error", "_open", "_scales")

    def __init__(self, scales: Sequence[tuple[Tensor, str, ScaleForm]]) -> None:
        self._scales = tuple(scales)
        self._open = True
        self._error: str | None = None

    @property
    def open(self) -> bool:
        """Not resolved yet (queued, or its device was capturing a graph when asked)."""
        return self._open

    @property
    def scales(self) -> tuple[Tensor, ...]:
        """The float32 scales checked (one layer's, on one device)."""
        return tuple(scale for scale, _, _ in self._scales)

    def verify(self) -> bool:
        """True when every scale is finite and >= 0; False while still open (its device's
        stream is capturing a graph: no sync possible); ValueError naming the bad scale."""
        if self._open:
            resolve_scale_checks()
        if self._error is not None:
            raise ValueError(self._error)
        return not self._open

    def settle(self, values: Tensor | None) -> None:
        """Close the check with resolve_scale_checks' verdict: None when every scale of its
        device passed, else this check's scales' values (flat, on the host, in order), in
        which the failure path finds the bad scale and keeps its message."""
        offset = 0
        for scale, name, form in self._scales if values is not None else ():
            part = values[offset : offset + scale.numel()]
            offset += scale.numel()
            if not _all_valid(part):
                self._error = _describe_bad_values(scale, name, form)
                break
        self._open = False


# Open checks of the process (weak: a layer dropped before resolution takes its check along).
_open_checks: list[weakref.ref[ScaleCheck]] = []
_checks_lock = threading.Lock()


def queue_scale_checks(scales: Sequence[tuple[Tensor, str, ScaleForm]]) -> ScaleCheck | None:
    """Check (scale, name, form) block scales as ``check_scale_values`` does, without a host
    sync: CPU scales (no sync) and empty or meta ones at once, CUDA scales (all on one
    device: one layer's) queued until ``resolve_scale_checks`` (or the returned check's
    ``verify``) runs; None when nothing was queued. ValueError at once for a bad CPU
    scale."""
    queued = []
    for scale, name, form in scales:
        if _queued(scale):
            queued.append((scale, name, form))
        else:
            check_scale_values(scale, name, form=form)
    if not queued:
        return None
    check = ScaleCheck(queued)
    with _checks_lock:
        _open_checks.append(weakref.ref(check))
    return check


def _to_host(scales: Sequence[Tensor], device: torch.device) -> Tensor:
    """The scales' values, flat, in one pinned host tensor: asynchronous copies on the
    device's current stream and one synchronize. Copies launch no kernel: a fresh process's
    first torch kernels (a concatenation, comparisons) would each be loaded on first use,
    tens of milliseconds of start-up."""
    if device.type != "cuda":
        return torch.cat([scale.reshape(-1) for scale in scales])
    host = torch.empty(sum(s.numel() for s in scales), dtype=torch.float32, pin_memory=True)
    offset = 0
    for scale in scales:
        host[offset : offset + scale.numel()].copy_(scale.reshape(-1), non_blocking=True)
        offset += scale.numel()
    torch.cuda.current_stream(device).synchronize()
    return host


def _queued(scale: Tensor) -> bool:
    """Whether ``scale``'s value check is queued (a CUDA tensor with values) or runs now."""
    return scale.device.type == "cuda" and scale.numel() > 0


def resolve_scale_checks() -> None:
    """Resolve every open ScaleCheck of the process: per device, all their scales copied to
    the host together (one host sync) and tested there (a failure is then found in the same
    host copy, with no further sync). Checks on a device whose current stream is capturing
    a graph stay open."""
    with _checks_lock:
        checks = [c for ref in _open_checks if (c := ref()) is not None and c.open]
        by_device: dict[torch.device, list[ScaleCheck]] = {}
        for check in checks:
            by_device.setdefault(check.scales[0].device, []).append(check)
        left = []
        for device, group in by_device.items():
            if current_stream_capturing(device):
                left += group
                continue
            flat = _to_host([scale for c in group for scale in c.scales], device)
            bad = not _all_valid(flat)
            offset = 0
            for check in group:
                size = sum(scale.numel() for scale in check.scales)
                check.settle(flat[offset : offset + size] if bad else None)
                offset += size
        _open_checks[:] = [weakref.ref(c) for c in left]
