"""The stock path on the CPU: operand layouts for _scaled_mm, the reference where that GEMM
is missing, and StockLayer (DenseMlp's fallback). The _scaled_mm runs are in tests/gpu."""

from __future__ import annotations

import pytest
import torch

from mlpjit import reference as ref
from mlpjit import stock


def _weights(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(n // 128, k // 128, generator=gen) * 1e-3 + 1e-4
    return w, scale


def _x(m: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=gen) * 2 + 0.1).to(torch.bfloat16)


def test_stock_path_on_cpu_is_the_reference() -> None:
    hidden, inter = 512, 256
    w13, s13 = _weights(2 * inter, hidden, seed=10)
    w2, s2 = _weights(hidden, inter, seed=11)
    x = _x(3, hidden, seed=12)
    expected = ref.dense_mlp_reference(x, w13, s13, w2, s2, limit=0.5, ue8m0=True)
    got = stock.dense_mlp(x, w13, s13, w2, s2, limit=0.5, ue8m0=True)
    assert torch.equal(got, expected)


def test_stock_operand_layouts() -> None:
    ws = torch.rand(4, 8)
    b = stock.weight_scale_operand(ws, 512, 1024)  # k/128 = 8: 128x128 recipe, a view
    assert b.shape == (8, 4) and b.data_ptr() == ws.data_ptr()
    ws18 = torch.rand(4, 18)
    b18 = stock.weight_scale_operand(ws18, 512, 2304)  # k/128 = 18: expanded 1x128 recipe
    assert b18.shape == (18, 512) and b18.is_contiguous()
    assert b18[3, 200] == ws18[1, 3]
    xq, xs = stock.quantize_operand(_x(3, 256, seed=13), ue8m0=False)
    assert xq.shape == (4, 256) and xs.shape == (4, 2)
    assert xs.stride() == (1, 4)  # outer-dim-major
    assert torch.all(xq[3].float() == 0)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_no_block_scaled_gemm_off_cuda(device: str) -> None:
    assert not stock.gemm_supported(torch.device(device))


@pytest.mark.parametrize(("limit", "ue8m0"), [(None, False), (0.5, True)])
def test_stock_layer_off_hopper_runs_the_reference(limit: float | None, ue8m0: bool) -> None:
    """DenseMlp's fallback on CPU weights: the reference's act and out, bit for bit."""
    hidden, inter = 512, 256
    w13, s13 = _weights(2 * inter, hidden, seed=14)
    w2, s2 = _weights(hidden, inter, seed=15)
    layer = stock.StockLayer(w13, s13, w2, s2)
    assert layer.path == "reference"
    x = _x(5, hidden, seed=16)
    act, out = layer(x, limit=limit, ue8m0=ue8m0)
    want_act = ref.gemv_reference(x, w13, s13, swiglu=True, limit=limit, ue8m0=ue8m0)
    assert torch.equal(act, want_act)
    assert torch.equal(out, ref.dense_mlp_reference(x, w13, s13, w2, s2, limit=limit, ue8m0=ue8m0))


def test_stock_scale_operands_are_made_on_first_use_or_prepare(monkeypatch) -> None:
    """Not at construction (a model's start-up would pay for every layer's); in a call
    during graph capture made inside the graph and not kept."""
    hidden, inter = 512, 384  # down: k/128 = 3 blocks, the expanded 1x128 recipe
    w13, s13 = _weights(2 * inter, hidden, seed=20)
    w2, s2 = _weights(hidden, inter, seed=21)
    monkeypatch.setattr(stock, "gemm_supported", lambda device: True)
    used = []
    monkeypatch.setattr(stock, "forward", lambda x, w13, w2, a, b, **kw: used.append((a, b)))
    want = (stock.weight_scale_operand(s13, *w13.shape), stock.weight_scale_operand(s2, *w2.shape))
    x = _x(9, hidden, seed=22)

    layer = stock.StockLayer(w13, s13, w2, s2)
    assert layer.path == "stock" and layer._scale_operands is None
    monkeypatch.setattr(stock, "current_stream_capturing", lambda device: True)
    layer(x, limit=None, ue8m0=True)
    assert layer._scale_operands is None  # made in the capture: not kept
    monkeypatch.setattr(stock, "current_stream_capturing", lambda device: False)
    layer(x, limit=None, ue8m0=True)
    kept = layer._scale_operands
    assert kept is not None and all(torch.equal(a, b) for a, b in zip(kept, want, strict=True))
    assert all(torch.equal(a, b) for call in used for a, b in zip(call, want, strict=True))

    prepared = stock.StockLayer(w13, s13, w2, s2)
    prepared.prepare()
    assert all(torch.equal(a, b) for a, b in zip(prepared._scale_operands, want, strict=True))
