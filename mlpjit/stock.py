"""The stock path: the dense MLP as it runs without mlpjit on Hopper, in five kernels.

quant, torch._scaled_mm (cuBLAS block-scaled FP8 GEMM), SwiGLU, quant, _scaled_mm. DenseMlp
runs it for what its kernels do not take (more than 8 tokens, shapes fp8_gemv cannot tile),
and the benchmark times it as the baseline. Activation quantization and SwiGLU come from
mlpjit.reference, so the stock path, the reference and the kernels follow one numerics rule;
only the GEMM's summation order is cuBLAS's.

torch implements the block-scaled recipes (1x128 activations, 128x128 or 1x128 weights) for
compute capability 9.x with CUDA >= 12.9 only; elsewhere (CPU, other GPUs) ``StockLayer``
and ``dense_mlp`` compute the reference math instead.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from mlpjit.jit.capture import current_stream_capturing
from mlpjit.reference import (
    GROUP,
    expand_block_rows,
    gemv_reference,
    quantize_activation,
    swiglu,
)
from mlpjit.scale_rule import DEFAULT_UE8M0

__all__ = [
    "StockLayer",
    "dense_mlp",
    "forward",
    "gemm",
    "gemm_supported",
    "quantize_operand",
    "weight_scale_operand",
]

_M_ALIGN = 4  # pad tokens so the outer-dim-major activation scales have 16-byte columns


def gemm_supported(device: torch.device) -> bool:
    """True when torch's block-scaled FP8 _scaled_mm can run on ``device`` (Hopper only)."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    major, _minor = torch.cuda.get_device_capability(device)
    # torch implements the DeepSeek-style 1x128 / 128x128 recipes for compute capability 9.x only.
    return major == 9


def weight_scale_operand(w_scale: Tensor, n: int, k: int) -> Tensor:
    """The ``scale_b`` operand of torch._scaled_mm for a weight [n, k] with scales [n/128, k/128].

    With k/128 a multiple of 4 this is the 128x128 recipe and a view of ``w_scale`` (no copy).
    cuBLAS wants the 128x128 scale rows padded to 4 blocks (16 bytes), which the legacy
    _scaled_mm layout check does not allow, so otherwise the scales are expanded once to the
    1x128 recipe ([k/128, n] contiguous, n*k/32 bytes).
    """
    scale = w_scale.float().contiguous()
    if (k // GROUP) % 4 == 0:
        return scale.t()
    return expand_block_rows(scale, n).t().contiguous()


def quantize_operand(x: Tensor, ue8m0: bool) -> tuple[Tensor, Tensor]:
    """Quantize x for _scaled_mm: rows padded to a multiple of 4; scales outer-dim-major."""
    m = x.shape[0]
    pad = (-m) % _M_ALIGN
    if pad:
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
    xq, xs = quantize_activation(x, ue8m0)
    return xq, xs.t().contiguous().t()


def gemm(xq: Tensor, xs: Tensor, w: Tensor, w_scale_b: Tensor) -> Tensor:
    """BF16 [m_padded, n] = block-scaled xq . w^T through torch._scaled_mm.

    ``xq``/``xs`` come from ``quantize_operand``; ``w_scale_b`` from ``weight_scale_operand``.
    """
    return torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=w_scale_b, out_dtype=torch.bfloat16)


def forward(
    x: Tensor,
    w13: Tensor,
    w2: Tensor,
    w13_scale_b: Tensor,
    w2_scale_b: Tensor,
    *,
    limit: float | None = None,
    ue8m0: bool = DEFAULT_UE8M0,
) -> tuple[Tensor, Tensor]:
    """The stock five kernels on a Hopper GPU -> (act BF16 [m, inter], out BF16 [m, hidden]).

    quant, _scaled_mm, SwiGLU, quant, _scaled_mm; ``*_scale_b`` from ``weight_scale_operand``.
    """
    m = x.shape[0]
    xq, xs = quantize_operand(x, ue8m0)
    act = swiglu(gemm(xq, xs, w13, w13_scale_b), limit)
    aq, as_ = quantize_operand(act, ue8m0)
    out = gemm(aq, as_, w2, w2_scale_b)
    return act[:m], out[:m]


def dense_mlp(
    x: Tensor,
    w13: Tensor,
    w13_scale: Tensor,
    w2: Tensor,
    w2_scale: Tensor,
    *,
    limit: float | None = None,
    ue8m0: bool = DEFAULT_UE8M0,
) -> Tensor:
    """The stock path x [m, hidden] -> BF16 [m, hidden] with float32 block scales: torch's
    block-scaled _scaled_mm where available, else the reference (a one-call StockLayer)."""
    return StockLayer(w13, w13_scale, w2, w2_scale)(x, limit=limit, ue8m0=ue8m0)[1]


class StockLayer:
    """One layer's math off the kernel path, with its weight-scale operands made once.

    ``path`` is "stock" when torch's block-scaled _scaled_mm runs on the weights' device,
    else "reference" (the reference math: CPU, or a GPU without that GEMM). The stock
    path's scale operands (views unless k/128 % 4 != 0) are made by ``prepare`` or by the
    first stock call outside CUDA graph capture, not at construction: most layers of a
    server never take the stock path, and a model's start-up would pay for them all. A
    call during capture with none made yet makes them inside the graph, unkept (a kept
    tensor made there would hold no values until the graph's first replay). The weights
    are the caller's tensors, read at each call; the scales must be float32
    [rows/128, k/128] (DenseMlp converts checkpoint forms once, before this).
    """

    def __init__(self, w13: Tensor, w13_scale: Tensor, w2: Tensor, w2_scale: Tensor) -> None:
        self._w13, self._w13_scale = w13, w13_scale
        self._w2, self._w2_scale = w2, w2_scale
        self.path: Literal["stock", "reference"] = (
            "stock" if gemm_supported(w13.device) else "reference"
        )
        self._scale_operands: tuple[Tensor, Tensor] | None = None

    def prepare(self) -> None:
        """Make the stock path's scale operands now (before graph capture); no-op off it."""
        if self.path == "stock" and self._scale_operands is None:
            self._scale_operands = self._make_scale_operands()

    def _make_scale_operands(self) -> tuple[Tensor, Tensor]:
        return (
            weight_scale_operand(self._w13_scale, *self._w13.shape),
            weight_scale_operand(self._w2_scale, *self._w2.shape),
        )

    def __call__(self, x: Tensor, *, limit: float | None, ue8m0: bool) -> tuple[Tensor, Tensor]:
        """x BF16 [m, hidden] -> (act BF16 [m, inter], out BF16 [m, hidden])."""
        if self.path == "stock":
            operands = self._scale_operands
            if operands is None:
                operands = self._make_scale_operands()
                if not current_stream_capturing(x.device):
                    self._scale_operands = operands
            w13_b, w2_b = operands
            return forward(x, self._w13, self._w2, w13_b, w2_b, limit=limit, ue8m0=ue8m0)
        act = gemv_reference(x, self._w13, self._w13_scale, swiglu=True, limit=limit, ue8m0=ue8m0)
        out = gemv_reference(act, self._w2, self._w2_scale, swiglu=False, ue8m0=ue8m0)
        return act, out
