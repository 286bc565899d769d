"""The reference: scale rule, quantization, block-scaled GEMM, SwiGLU, whole layer."""

from __future__ import annotations

import math

import pytest
import torch

from mlpjit import reference as ref


def _weights(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(n // 128, k // 128, generator=gen) * 1e-3 + 1e-4
    return w, scale


def _x(m: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=gen) * 2 + 0.1).to(torch.bfloat16)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.double(), b.double()
    return float((a64 - b64).norm() / b64.norm())


# ---- scale rule -----------------------------------------------------------------------------


def test_zero_group_gets_the_floor_scale_and_zero_codes() -> None:
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    x[1, 128:] = 1.0
    q, s = ref.quantize_activation(x, ue8m0=False)
    floor = torch.tensor(1e-10, dtype=torch.float32) / 448
    assert s[0, 0] == floor and s[0, 1] == floor and s[1, 0] == floor
    assert s[1, 1] == torch.tensor(1.0, dtype=torch.float32) / 448
    assert torch.all(q[0].float() == 0) and torch.all(q[1, :128].float() == 0)
    assert torch.all(torch.isfinite(s))


def test_zero_group_ue8m0_is_a_power_of_two_above_the_floor() -> None:
    _q, s = ref.quantize_activation(torch.zeros(1, 128, dtype=torch.bfloat16), ue8m0=True)
    assert float(s) == 2.0 ** math.ceil(math.log2(float(torch.tensor(1e-10) / 448)))


def test_ue8m0_scale_is_the_next_power_of_two() -> None:
    gen = torch.Generator().manual_seed(3)
    amax = torch.rand(1000, generator=gen) * 1e3 + 1e-6
    amax = torch.cat([amax, torch.tensor([448.0, 56.0, 448 * 2.0**-20, 1.0])])
    scale = ref.activation_scale(amax, ue8m0=True)
    plain = ref.activation_scale(amax, ue8m0=False)
    mantissa, _ = torch.frexp(scale)
    assert torch.all(mantissa == 0.5)  # exact powers of two
    assert torch.all(scale >= plain) and torch.all(scale < 2 * plain)
    expected = torch.tensor([2.0 ** math.ceil(math.log2(v)) for v in plain.double().tolist()])
    assert torch.equal(scale.double(), expected)


def test_ue8m0_rounds_up_just_above_a_power_of_two() -> None:
    # 56/448 = 2^-3 exactly; the next float above 56 must give 2^-2, not 2^-3.
    above = torch.nextafter(torch.tensor(56.0), torch.tensor(100.0))
    scales = ref.activation_scale(torch.stack([torch.tensor(56.0), above]), ue8m0=True)
    assert scales.tolist() == [0.125, 0.25]


@pytest.mark.parametrize("ue8m0", [False, True])
def test_quantization_saturates_and_round_trips(ue8m0: bool) -> None:
    x = _x(4, 512, seed=1)
    x[0, 5] = 3e4  # a large outlier: its group scale follows it
    q, s = ref.quantize_activation(x, ue8m0)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (4, 4) and s.dtype == torch.float32
    qf = q.float()
    assert torch.all(qf.abs() <= 448)
    if not ue8m0:
        # the group maximum maps to the top code
        assert qf.reshape(4, 4, 128).abs().amax(-1).eq(448).all()
    deq = qf * s.repeat_interleave(128, dim=1)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normal codes
    big = x.float().abs() > s.repeat_interleave(128, dim=1) * 2**-6 * 8
    err = (deq - x.float()).abs()[big] / x.float().abs()[big]
    assert float(err.max()) <= 2**-4 + 1e-6


def test_values_beyond_the_scale_saturate_instead_of_overflowing() -> None:
    # a scale computed by the rule cannot be exceeded, so check the clamp directly: 1e4/s > 448
    x = torch.full((1, 128), 1.0, dtype=torch.bfloat16)
    q, s = ref.quantize_activation(x * 1e4, ue8m0=True)
    assert torch.all(q.float() <= 448) and torch.all(torch.isfinite(q.float()))


# ---- GEMM -------------------------------------------------------------------------------------


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (5, 384, 1024), (8, 128, 2304)])
def test_block_scaled_gemm_matches_float64_on_dequantized_operands(
    m: int, n: int, k: int, ue8m0: bool
) -> None:
    w, ws = _weights(n, k, seed=m + n)
    xq, xs = ref.quantize_activation(_x(m, k, seed=k), ue8m0)
    out = ref.block_scaled_gemm(xq, xs, w, ws)
    x64 = xq.double() * xs.double().repeat_interleave(128, dim=1)
    w64 = w.double() * ws.double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    expected = x64 @ w64.T
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert _rel(out, expected) < 1e-6
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6 * expected.abs().max())


def test_dequantize_weight() -> None:
    w, ws = _weights(256, 384, seed=2)
    deq = ref.dequantize_weight(w, ws)
    assert deq[130, 300] == w[130, 300].float() * ws[1, 2]
    assert deq.shape == (256, 384) and deq.dtype == torch.float32


# ---- SwiGLU -----------------------------------------------------------------------------------


def test_swiglu_matches_float64_and_rounds_to_bf16() -> None:
    gen = torch.Generator().manual_seed(4)
    gate_up = (torch.randn(3, 512, generator=gen) * 4).to(torch.bfloat16)
    act = ref.swiglu(gate_up, None)
    g, u = gate_up[:, :256].double(), gate_up[:, 256:].double()
    expected = g / (1 + torch.exp(-g)) * u
    assert act.dtype == torch.bfloat16 and act.shape == (3, 256)
    torch.testing.assert_close(act.double(), expected, rtol=2**-8, atol=1e-30)


def test_swiglu_clamp() -> None:
    # gate = min(gate, L) only; up = clamp(up, -L, L)
    gate = torch.tensor([[10.0, -10.0, 0.5, 7.0]])
    up = torch.tensor([[3.0, 3.0, -9.0, 0.25]])
    act = ref.swiglu(torch.cat([gate, up], dim=1).to(torch.bfloat16), limit=1.0)

    def silu(v: float) -> float:
        return v / (1 + math.exp(-v))

    expected = [silu(1.0) * 1.0, silu(-10.0) * 1.0, silu(0.5) * -1.0, silu(1.0) * 0.25]
    torch.testing.assert_close(act.float(), torch.tensor([expected]), rtol=2**-8, atol=0)
    unclamped = ref.swiglu(torch.cat([gate, up], dim=1).to(torch.bfloat16), limit=None)
    assert float(unclamped[0, 0]) > 29  # silu(10) * 3 without the limit


def test_gemv_reference_composition() -> None:
    w, ws = _weights(512, 512, seed=5)
    x = _x(3, 512, seed=6)
    xq, xs = ref.quantize_activation(x, True)
    plain = ref.gemv_reference(x, w, ws, swiglu=False, ue8m0=True)
    assert torch.equal(plain, ref.block_scaled_gemm(xq, xs, w, ws).to(torch.bfloat16))
    act = ref.gemv_reference(x, w, ws, swiglu=True, limit=2.0, ue8m0=True)
    assert torch.equal(act, ref.swiglu(plain, 2.0))


@pytest.mark.parametrize("ue8m0", [False, True])
def test_dense_mlp_reference_close_to_full_precision(ue8m0: bool) -> None:
    hidden, inter = 512, 384
    w13, s13 = _weights(2 * inter, hidden, seed=7)
    w2, s2 = _weights(hidden, inter, seed=8)
    x = _x(4, hidden, seed=9)
    out = ref.dense_mlp_reference(x, w13, s13, w2, s2, ue8m0=ue8m0)
    assert out.dtype == torch.bfloat16 and out.shape == (4, hidden)
    # unquantized activations, same weights, float64 everywhere
    gu = x.double() @ ref.dequantize_weight(w13, s13).double().T
    g, u = gu[:, :inter], gu[:, inter:]
    full = (g / (1 + torch.exp(-g)) * u) @ ref.dequantize_weight(w2, s2).double().T
    assert _rel(out, full) < 0.08  # FP8 activation quantization error, twice


def test_activation_scale_is_the_correctly_rounded_quotient():
    """2.625 / 448 is exactly 3/512; 2.625 * RN(1/448) rounds one ulp above it."""
    amax = torch.tensor([2.625, 448.0, 1.0])
    scale = ref.activation_scale(amax, ue8m0=False)
    assert scale.tolist() == [3 / 512, 1.0, float(torch.tensor(1.0) / torch.tensor(448.0))]
    assert (amax * torch.tensor(1 / 448)).tolist()[0] != 3 / 512
