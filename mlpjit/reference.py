"""The reference: the stock five-kernel dense-MLP math in plain torch, every rounding spelled out.

These functions run on CPU or GPU tensors and define what the kernels compute; the kernel
tests compare against them, and DenseMlp runs them where neither the kernels nor torch's
block-scaled GEMM exist (CPU weights, non-Hopper GPUs). The production stock path on
Hopper, built from torch._scaled_mm, is mlpjit.stock; it quantizes activations and applies
SwiGLU with the functions here, so both follow one rule.

Numbers the kernels must reproduce:
- activation scale per (token, 128-group): ``max(amax, 1e-10) / 448``, with ue8m0 rounded UP
  to a power of two; ``q = saturate_e4m3(x / scale)`` (round to nearest even);
- GEMM accumulated in fp32 per 128-group and scaled by ``x_scale * w_scale``; result in BF16;
- SwiGLU: BF16 gate/up, optional clamp, ``silu = gate / (1 + exp(-gate))`` in fp32, BF16
  product.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mlpjit.kernels.blocks import BLOCK
from mlpjit.scale_rule import DEFAULT_UE8M0

__all__ = [
    "GROUP",
    "FP8_MAX",
    "SCALE_FLOOR",
    "activation_scale",
    "quantize_activation",
    "dequantize_weight",
    "block_scaled_gemm",
    "swiglu",
    "gemv_reference",
    "dense_mlp_reference",
    "expand_block_rows",
]

GROUP = BLOCK  # activation quantization group and weight scale block (along K)
FP8_MAX = 448.0  # largest finite float8_e4m3fn
SCALE_FLOOR = 1e-10  # amax floor, so an all-zero group gets a finite, nonzero scale


def _ceil_pow2(scale: Tensor) -> Tensor:
    """Round positive normal fp32 values up to a power of two, exactly (bit arithmetic).

    ``exp2(ceil(log2(s)))`` is not exact: log2 of a value just above 2^e can round to e,
    which would give a scale below amax/448 and saturate the largest element.
    """
    bits = scale.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    exponent = exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exponent << 23).view(torch.float32)


def activation_scale(amax: Tensor, ue8m0: bool) -> Tensor:
    """The stock per-group activation scale from the group's amax (float32)."""
    amax = torch.clamp(amax.float(), min=SCALE_FLOOR)
    # Divide by a tensor, not the Python float: on CUDA, torch turns division by a scalar into
    # a multiply by its rounded reciprocal, which is 1 ulp off the correctly rounded quotient
    # for most amax values, and flips FP8 rounding ties of x / scale (bf16 x hits them often).
    scale = amax / torch.full_like(amax, FP8_MAX)
    return _ceil_pow2(scale) if ue8m0 else scale


def _check_k(x: Tensor, name: str) -> None:
    if x.dim() != 2 or x.shape[1] % GROUP != 0:
        raise ValueError(
            f"{name} must be 2-D with the last dimension a multiple of {GROUP}, "
            f"got shape {tuple(x.shape)}"
        )


def quantize_activation(x: Tensor, ue8m0: bool) -> tuple[Tensor, Tensor]:
    """Per-token-group FP8 quantization: x [m, k] -> (e4m3 [m, k], float32 scales [m, k/128])."""
    _check_k(x, "x")
    m, k = x.shape
    groups = x.float().reshape(m, k // GROUP, GROUP)
    scale = activation_scale(groups.abs().amax(dim=-1), ue8m0)
    if ue8m0:
        # x * (1/scale) equals x / scale for a power-of-two scale; the kernel multiplies.
        scaled = groups * torch.reciprocal(scale).unsqueeze(-1)
    else:
        scaled = groups / scale.unsqueeze(-1)
    q = torch.clamp(scaled, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(m, k), scale


def expand_block_rows(w_scale: Tensor, n: int) -> Tensor:
    """Block scales [ceil(n/128), G] -> per-row scales [n, G] (float32)."""
    return w_scale.float().repeat_interleave(GROUP, dim=0)[:n]


def dequantize_weight(w: Tensor, w_scale: Tensor) -> Tensor:
    """FP8 weight [n, k] with float32 block scales [n/128, k/128] -> float32 [n, k]."""
    n, k = w.shape
    per_row = expand_block_rows(w_scale, n).repeat_interleave(GROUP, dim=1)[:, :k]
    return w.float() * per_row


def block_scaled_gemm(xq: Tensor, xs: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """float32 [m, n] = sum over 128-groups g of (xq_g . w_g^T) * xs[:, g] * w_scale[n/128, g].

    Each group's dot product of FP8 values is exact-ish in fp32 (products of two e4m3 values
    are exact), then scaled, as the block-scaled kernels and DeepGEMM accumulate.
    """
    m, k = xq.shape
    n = w.shape[0]
    ws_rows = expand_block_rows(w_scale, n)  # [n, G]
    xf = xq.float()
    wf = w.float()
    out = torch.zeros(m, n, dtype=torch.float32, device=xq.device)
    for g in range(k // GROUP):
        cols = slice(g * GROUP, (g + 1) * GROUP)
        partial = xf[:, cols] @ wf[:, cols].T
        out += partial * xs[:, g : g + 1] * ws_rows[:, g].unsqueeze(0)
    return out


def swiglu(gate_up: Tensor, limit: float | None) -> Tensor:
    """SwiGLU of BF16 gate_up [m, 2i] (gate columns first) -> BF16 [m, i], math in fp32."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 != 0:
        raise ValueError(f"gate_up must be 2-D with an even last dimension, got {gate_up.shape}")
    inter = gate_up.shape[1] // 2
    gate = gate_up[:, :inter].to(torch.bfloat16).float()
    up = gate_up[:, inter:].to(torch.bfloat16).float()
    if limit is not None:
        gate = torch.clamp(gate, max=float(limit))
        up = torch.clamp(up, min=-float(limit), max=float(limit))
    silu = gate / (1.0 + torch.exp(-gate))
    return (silu * up).to(torch.bfloat16)


def gemv_reference(
    x: Tensor,
    w: Tensor,
    w_scale: Tensor,
    *,
    swiglu: bool,
    limit: float | None = None,
    ue8m0: bool = DEFAULT_UE8M0,
) -> Tensor:
    """What one fp8_gemv launch computes: BF16 [m, n], or with swiglu the BF16 act [m, n/2]."""
    xq, xs = quantize_activation(x, ue8m0)
    y = block_scaled_gemm(xq, xs, w, w_scale).to(torch.bfloat16)
    return _swiglu(y, limit) if swiglu else y


_swiglu = swiglu  # gemv_reference's keyword argument shadows the function name


def dense_mlp_reference(
    x: Tensor,
    w13: Tensor,
    w13_scale: Tensor,
    w2: Tensor,
    w2_scale: Tensor,
    *,
    limit: float | None = None,
    ue8m0: bool = DEFAULT_UE8M0,
) -> Tensor:
    """The whole stock path in reference math: x [m, hidden] -> BF16 [m, hidden]."""
    act = gemv_reference(x, w13, w13_scale, swiglu=True, limit=limit, ue8m0=ue8m0)
    return gemv_reference(act, w2, w2_scale, swiglu=False, ue8m0=ue8m0)
