"""The queue probe on the GPU: every CTA reads x right, its stamps come in order, x is
loaded no sooner than the delay after the CTA's start, and the flood lands after it is
issued. What scripts/bench_queue_probe.py's numbers rest on."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CASES = [(96, 2000), (0, 0)]  # (flood KB per SM, delay ns)


def kernel_requests(arch: str = "sm_90a") -> list:
    """The compile requests these tests use (for warming a cache without a GPU)."""
    from mlpjit.bench.queue_probe import kernel_requests as requests

    return [r for kb, delay in CASES for r in requests([kb], [delay], 4, arch)]


@pytest.mark.parametrize(("kb", "delay"), CASES)
def test_stamps_come_in_order_and_x_is_read_right(kb: int, delay: int) -> None:
    from mlpjit.bench import queue_probe as bench
    from mlpjit.kernels.queue_probe import STAMP_NAMES

    (params,) = bench.probe_params([kb], [delay], 4)
    runs = bench.run_probe(params, launches=2)  # raises where a CTA's x XOR is wrong
    start, issued, requested, ready, landed = (STAMP_NAMES.index(n) for n in STAMP_NAMES[:5])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for launch in runs:
        assert len({cta[STAMP_NAMES.index("smid")] for cta in launch}) == len(launch) <= sms
        for cta in launch:
            assert cta[start] <= cta[issued] <= cta[requested] < cta[ready] <= cta[landed]
            assert cta[requested] - cta[start] >= delay
    row = bench.summarize(params, runs)
    print(f"\n[queue_probe] flood {kb} KB delay {delay} ns: x trip flooding "
          f"{sorted(row['x_flood_us'])[len(row['x_flood_us']) // 2] if row['x_flood_us'] else '-'}"
          f" us, quiet {sorted(row['x_quiet_us'])[len(row['x_quiet_us']) // 2]} us")  # fmt: skip
