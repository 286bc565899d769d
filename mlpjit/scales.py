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
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from mlpjit.jit.capture import current_stream_capturing
from mlpjit.kernels.blocks import BLOCK, scale_shape

__all__ = ["ScaleForm", "check_scale_values", "to_float32_scale"]

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
    if bool((torch.isfinite(scale) & (scale >= 0)).all()):
        return
    raise ValueError(_describe_bad_values(scale, name, form))


def to_float32_scale(scale: Tensor, rows: int, k: int, *, name: str = "w_scale") -> Tensor:
    """Return float32 [rows/128, k/128] block scales for a weight [rows, k], converting once.

    Accepts float32 [rows/128, k/128] (returned as is when contiguous: no copy),
    torch.float8_e8m0fnu [rows/128, k/128], or int32 [rows/128, ceil(k/128/4)] packed UE8M0.
    The result lives on ``scale``'s device. Raises ValueError naming ``name`` otherwise,
    also when a weight dim is not a positive multiple of 128 or a converted scale is not
    finite and >= 0 (see ``check_scale_values``: one host sync).
    """
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
    form: ScaleForm
    if scale.dtype == torch.float32 and shape == (n_blocks, k_blocks):
        out, form = scale.contiguous(), "float32"
    elif scale.dtype == torch.float8_e8m0fnu and shape == (n_blocks, k_blocks):
        out, form = scale.to(torch.float32).contiguous(), "e8m0"
    elif scale.dtype == torch.int32 and shape == (n_blocks, packed_cols):
        exponents = _unpack_ue8m0(scale, k_blocks)
        out = exponents.view(torch.float8_e8m0fnu).to(torch.float32).contiguous()
        form = "packed"
    else:
        raise ValueError(f"{name} must be {expected}; got {scale.dtype} {list(shape)}")
    check_scale_values(out, name, form=form)
    return out
