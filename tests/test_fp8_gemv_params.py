"""mlpjit/kernels/fp8_gemv/params.py: the shared-memory layout and the bytes-in-flight model
of paced kernels over the geometries GemvParams accepts (no compile)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlpjit.bench.ncu_kernels import in_flight_per_sm
from mlpjit.kernels.fp8_gemv import params as gemv_params


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_paced_kernels_flag_sits_after_everything_else(data) -> None:
    """Whatever the geometry GemvParams accepts with a pace (persistent grids and several
    slices per warp included), the flag is the last 16 bytes of shared memory, after the
    staged weights, x, its scales and any split slots and mbarrier; and the model of bytes in
    flight before the wait is never above the unpaced kernel's."""
    slice_k = data.draw(st.sampled_from(gemv_params.SLICE_SIZES))
    steps = slice_k // gemv_params.STEP
    in_regs = data.draw(st.integers(0, steps - 1))
    spw = data.draw(st.sampled_from((1, 2, 3)))
    splits = data.draw(st.sampled_from((1, 2, 3)))
    cluster = data.draw(st.sampled_from((1, 2))) if slice_k == 512 and splits == 1 else 1
    tiles = data.draw(st.integers(1, 3))
    fields = dict(
        rows=16 * tiles * data.draw(st.integers(1, 400)),
        k=slice_k * spw * splits * data.draw(st.integers(1, 6)),
        tokens=data.draw(st.integers(1, gemv_params.MAX_TOKENS)),
        tiles=tiles, in_regs=in_regs, ctas_per_sm=data.draw(st.integers(1, 2)),
        swiglu=False, limit=None, ue8m0=True, slices_per_warp=spw, slice_k=slice_k,
        splits=splits, cluster=cluster, send_x=cluster > 1 and data.draw(st.booleans()),
    )  # fmt: skip
    paced = data.draw(st.integers(1, max(1, spw * (steps - in_regs) - 1)))
    try:
        p = gemv_params.GemvParams(**fields, paced=paced)
    except ValueError:
        return  # shared memory, registers or residency: not a geometry the kernel takes
    plain = gemv_params.GemvParams(**fields)
    used = p.smem_weights + p.smem_act + p.smem_scales
    if p.splits > 1 or p.send_x:
        used = p.smem_mbarrier + gemv_params.MBARRIER_BYTES
    assert used <= p.smem_flag == p.smem_bytes - gemv_params.PACED_FLAG_BYTES
    assert p.smem_flag % 16 == 0 and p.smem_bytes - plain.smem_bytes <= 16 + 15
    assert in_flight_per_sm(p) <= in_flight_per_sm(plain)
