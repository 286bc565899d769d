"""mlpjit.bench.ncu_kernels on the CPU: the launch list, the bytes-in-flight model and the
join of an ncu CSV with the launch order."""

from __future__ import annotations

import dataclasses

import pytest

from mlpjit.bench import ncu_kernels
from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv.params import GemvParams
from mlpjit.kernels.fp8_stream.params import StreamParams


def test_launches_are_both_halves_of_every_shape_and_token_count() -> None:
    got = ncu_kernels.launches(["glm5-tp8", "deepseek-v3-shared-tp8"], [1, 8])
    assert [(g["shape"], g["tokens"], g["half"]) for g in got[:4]] == [
        ("glm5-tp8", 1, "gate_up"), ("glm5-tp8", 1, "down"),
        ("glm5-tp8", 8, "gate_up"), ("glm5-tp8", 8, "down"),
    ]  # fmt: skip
    assert len(got) == 8
    # the kernels DenseMlp runs: fp8_stream's for the layers mlpjit.layer_plan streams
    kernels = {g["request"].kernel for g in ncu_kernels.launches(["qwen3-32b-tp8"], [1, 8])}
    assert kernels == {"fp8_stream"}
    with pytest.raises(ValueError, match="shape must be one of"):
        ncu_kernels.launches(["glm6"], [1])


def test_kernel_params_follow_the_request_and_refuse_other_kernels() -> None:
    gemv, stream = (
        ncu_kernels.launches([name], [1])[0]["request"]
        for name in ("deepseek-v3-shared-tp8", "qwen3-32b-tp8")
    )
    assert isinstance(ncu_kernels.kernel_params(gemv), GemvParams)
    assert isinstance(ncu_kernels.kernel_params(stream), StreamParams)
    other = KernelRequest(kernel="fp8_layer", params=stream.params, arch="sm_90a")
    with pytest.raises(ValueError, match="kernel must be one of fp8_gemv, fp8_stream"):
        ncu_kernels.kernel_params(other)


def test_stream_in_flight_is_the_busiest_ctas_first_ring_of_stages() -> None:
    for launch in ncu_kernels.launches(["qwen3-32b-tp8", "deepseek-v3-shared-tp1"], [1, 8]):
        p = ncu_kernels.kernel_params(launch["request"])
        got = ncu_kernels.in_flight_per_sm(p)
        block_bytes = 16 * 128
        assert got % block_bytes == 0
        # no more than the ring holds, no more than the busiest range has
        assert got <= p.stages * p.stage_blocks * block_bytes
        assert got <= p.max_blocks_per_cta * block_bytes
        # and at least the ring's first stages where the range is longer than them
        assert got >= min(p.max_blocks_per_cta, p.stages) * block_bytes
    # a ring that holds the whole range: every byte of it is requested at once
    whole = StreamParams(
        rows=6144, k=1536, tokens=1, swiglu=False, limit=None, ue8m0=True, warps=6,
        blocks_per_warp=2, stages=6, cluster=1,
    )  # fmt: skip
    assert ncu_kernels.in_flight_per_sm(whole) == whole.max_blocks_per_cta * 16 * 128
    shallow = dataclasses.replace(whole, stages=2)
    assert ncu_kernels.in_flight_per_sm(shallow) == 2 * 12 * 16 * 128


def test_in_flight_is_a_ctas_k_part_times_resident_ctas() -> None:
    for launch in ncu_kernels.launches(["glm5-tp8", "deepseek-v3-shared-tp8"], [1]):
        p = ncu_kernels.kernel_params(launch["request"])
        assert isinstance(p, GemvParams)
        p = dataclasses.replace(p, paced=0, late_steps=0)
        got = ncu_kernels.in_flight_per_sm(p)
        assert got % (p.tiles * 16 * (p.k // p.splits)) == 0
        # never more than the SM's resident CTAs request, never less than one CTA's share
        assert p.tiles * 16 * (p.k // p.splits) <= got
        assert got <= p.ctas_per_sm * p.tiles * 16 * (p.k // p.splits)
        assert got * min(p.ctas, hopper.SMS) >= p.rows * p.k / max(1, p.ctas_per_sm) / 2


HEADER = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
          "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name",
          "Metric Unit", "Metric Value")  # fmt: skip
VALUES = {  # what ncu --print-units base --csv writes: thousands separators included
    "0": (("dram__bytes_read.sum", "byte", "18,874,368"),
          ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "40.5"),
          ("gpu__time_duration.sum", "nsecond", "9,790")),
    "1": (("dram__bytes_read.sum", "byte", "9,437,184"),
          ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "31"),
          ("gpu__time_duration.sum", "nsecond", "6,460")),
}  # fmt: skip


def _quoted(cells) -> str:
    return ",".join(f'"{c}"' for c in cells)


CSV = "\n".join(
    ["==PROF== Connected to process 1", _quoted(HEADER)]
    + [
        _quoted((i, "1", "python3", "h", f"kernel_Fp8Gemv_{i}", "1", "7", "(256, 1, 1)",
                 "(132, 1, 1)", "0", "9.0", "Command line profiler metrics", *metric))
        for i, metrics in VALUES.items()
        for metric in metrics
    ]
)  # fmt: skip


def test_table_joins_ncu_rows_with_the_order_by_id() -> None:
    order = [dict(shape="glm5-tp8", half="gate_up"), dict(shape="glm5-tp8", half="down")]
    rows = ncu_kernels.table(CSV, order)
    assert [r["half"] for r in rows] == ["gate_up", "down"]
    assert rows[0]["us"] == pytest.approx(9.79) and rows[1]["dram_pct"] == 31.0
    assert rows[0]["dram_mb"] == pytest.approx(18.874368)
    with pytest.raises(ValueError, match="profiled 2 kernels but the order file lists 1"):
        ncu_kernels.table(CSV, order[:1])
    missing = "\n".join(line for line in CSV.splitlines() if "dram__bytes" not in line)
    with pytest.raises(ValueError, match="--metrics"):
        ncu_kernels.table(missing, order)


def test_gemv_in_flight_leaves_out_late_and_paced_steps() -> None:
    """GLM-5 TP 8's gate_up at 2 tokens: a persistent grid of one CTA per SM, 12 warps of
    one 512-K slice (8 steps of 1 KB: 3 in registers, 5 staged)."""
    base = GemvParams(
        rows=3072, k=6144, tokens=2, tiles=1, in_regs=3, ctas_per_sm=1, swiglu=True,
        limit=None, ue8m0=True,
    )  # fmt: skip
    assert base.persistent and base.warps == 12
    kb = 1024
    assert ncu_kernels.in_flight_per_sm(base) == 12 * 8 * kb
    late = dataclasses.replace(base, late_steps=2)
    assert ncu_kernels.in_flight_per_sm(late) == 12 * 6 * kb
    # warp 0: all 8 steps; the other 11: 3 register steps and 1 (or 2) staged in flight
    assert ncu_kernels.in_flight_per_sm(dataclasses.replace(base, paced=1)) == (8 + 11 * 4) * kb
    assert ncu_kernels.in_flight_per_sm(dataclasses.replace(base, paced=2)) == (8 + 11 * 5) * kb
    # nothing in registers, 3 slices per warp (24 staged steps): warp 0's 24 and 1 per other
    wide = GemvParams(
        rows=6144, k=1536, tokens=2, tiles=4, in_regs=0, ctas_per_sm=2, swiglu=False,
        limit=None, ue8m0=True, slices_per_warp=3, paced=1,
    )  # fmt: skip
    assert wide.warps == 4 and wide.ctas == 96
    assert ncu_kernels.in_flight_per_sm(wide) == (24 + 3 * 1) * kb
