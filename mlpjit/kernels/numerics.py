"""The numerics both kernels share, as device functions: the stock activation scale rule on
one 16-value chunk and the SwiGLU epilogue (the contract is in DESIGN.md's section 1).

Imports cutlass: imported by kernel modules only, on a cache miss.
"""

from __future__ import annotations

import struct

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from mlpjit.kernels import ptx

__all__ = ["div_rn", "quantize16", "rcp", "swiglu"]

FP8_MAX = 448.0
SCALE_FLOOR = 1e-10
LOG2E = 1.4426950408889634
LN2_HI = 0.693145751953125  # ln 2 split for an accurate exp (Cody-Waite)
LN2_LO = 1.428606765330187e-06
EXP_ARG_MAX = 88.0  # exp(88) < 2^127: |argument| bound of the SiLU's exp


def _f32(value: float) -> float:
    """value rounded to the nearest float32 (as a Python float)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


INV_FP8_MAX = _f32(1.0 / FP8_MAX)  # RN(1/448): the reciprocal for the scale division


@cute.jit
def div_rn(a: Float32, b: Float32, rcp_b: Float32) -> Float32:
    """a / b correctly rounded, given rcp_b = RN(1/b) (Markstein: one fma correction).

    Replaces div.rn.f32, whose out-of-line slow path forces ptxas to spill registers around
    the call; our operands are normal and finite, where the fast path is all div.rn does.
    """
    q = a * rcp_b
    r = ptx.fma_rn(Float32(0.0) - q, b, a)
    return ptx.fma_rn(r, rcp_b, q)


@cute.jit
def rcp(b: Float32) -> Float32:
    """1/b for a normal finite b: MUFU.RCP plus one Newton step (fma), ~0.5 ulp."""
    y = ptx.rcp_approx(b)
    e = ptx.fma_rn(Float32(0.0) - b, y, Float32(1.0))
    return ptx.fma_rn(y, e, y)


@cute.jit
def quantize16(words: list, ue8m0: cutlass.Constexpr):
    """16 BF16 values (8 packed words) of a lane -> (4 words of e4m3, the group's scale).

    The 8 consecutive lanes holding one 128-group must call it together (the amax is a
    butterfly over lane bits 0-2). The amax runs on the packed BF16 pairs with
    max.xorsign.abs: each step takes |.| of its inputs, so only the final sign is junk
    (dropped by the last fabs); |x| and max are exact, so this is the float32 amax bit for
    bit, in 7 + 3 instructions instead of 16 unpacks and 16 max.
    """
    pair = [ptx.absmax_bf16x2(words[2 * i], words[2 * i + 1]) for i in range(4)]
    pair = ptx.absmax_bf16x2(
        ptx.absmax_bf16x2(pair[0], pair[1]), ptx.absmax_bf16x2(pair[2], pair[3])
    )
    lo, hi = ptx.bf16x2_to_f32x2(pair)
    amax = ptx.fmax(ptx.fabs(lo), ptx.fabs(hi))
    for off in cutlass.range_constexpr(3):
        amax = ptx.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1 << off))
    scale = div_rn(ptx.fmax(amax, Float32(SCALE_FLOOR)), Float32(FP8_MAX), Float32(INV_FP8_MAX))
    qv = []
    if cutlass.const_expr(ue8m0):
        # Round up to a power of two exactly: bump the exponent if any mantissa bit is set;
        # then 1/scale is exact too (biased exponent 254 - E), and x * (1/scale) = x / scale.
        bits = ptx.f32_as_i32(scale)
        bump = (((bits & 0x7FFFFF) + 0x7FFFFF) >> 23) << 23
        exponent = (bits & 0x7F800000) + bump
        scale = ptx.i32_as_f32(exponent)
        inv_bits = (254 << 23) - exponent
        # 1/scale is a power of two in [2^-120, 2^42]: its BF16 (the upper half) is exact,
        # and so is the BF16 product x * 2^m wherever it is normal; below 2^-126 both this
        # and the float32 product convert to a zero of x's sign. Two values per multiply.
        inv2 = ptx.prmt(inv_bits, inv_bits, 0x3232)
        for wd in cutlass.range_constexpr(8):
            lo, hi = ptx.bf16x2_to_f32x2(ptx.mul_bf16x2(words[wd], inv2))
            qv.append(lo)
            qv.append(hi)
    else:
        inv = rcp(scale)
        for wd in cutlass.range_constexpr(8):
            lo, hi = ptx.bf16x2_to_f32x2(words[wd])
            qv.append(div_rn(lo, scale, inv))
            qv.append(div_rn(hi, scale, inv))
    packed = [
        ptx.cvt_e4m3x4(qv[4 * i], qv[4 * i + 1], qv[4 * i + 2], qv[4 * i + 3]) for i in range(4)
    ]
    return packed, scale


@cute.jit
def swiglu(gate_f: Float32, up_f: Float32, limit: cutlass.Constexpr) -> Float32:
    """silu(bf16 gate) * bf16 up in fp32, with the optional clamp (``limit``, or None)."""
    gate = ptx.bf16_round(gate_f)
    up = ptx.bf16_round(up_f)
    if cutlass.const_expr(limit is not None):
        lim = Float32(limit)
        gate = ptx.fmin(gate, lim)
        up = ptx.fmax(ptx.fmin(up, lim), Float32(-limit))
    # exp(-gate) = 2^j * exp(f), f = -gate - j ln2 in [-ln2/2, ln2/2]: ex2.approx is
    # accurate on the small reduced argument and exact on the integer j.
    # Clamp the argument first: from |gate| ~ 1e10 on, j carries too few bits for f to
    # stay small, and ex2(f) = inf times ex2(j) = 0 made exp NaN (silu 0 for a large
    # positive gate). Inside the clamp nothing changes; outside, exp(-gate) is 0 or
    # over 2^126 either way.
    neg = ptx.fmax(ptx.fmin(Float32(0.0) - gate, Float32(EXP_ARG_MAX)), Float32(-EXP_ARG_MAX))
    j = ptx.rint(neg * Float32(LOG2E))
    f = ptx.fma_rn(j, Float32(-LN2_HI), neg)
    f = ptx.fma_rn(j, Float32(-LN2_LO), f)
    e = ptx.ex2_approx(f * Float32(LOG2E)) * ptx.ex2_approx(j)
    # Keep the denominator finite (exp overflows for gate < -88): silu is then ~0 either way.
    den = Float32(1.0) + ptx.fmin(e, Float32(2.0**126))
    silu = div_rn(gate, den, rcp(den))
    return silu * up
