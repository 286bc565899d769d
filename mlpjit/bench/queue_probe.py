"""The queue probe behind scripts/bench_queue_probe.py (its docstring: how to run it):
where a load issued after a flood of weight requests waits (mlpjit.kernels.queue_probe).

Per (flood bytes per SM, delay) the probe runs ``--launches`` times, each after the L2 has
been cleared by writing a buffer of twice its size and x has been written again (so the
flood comes from HBM and x from L2, as a kernel's weights and x do). For the flooding and
the quiet CTAs it reports the x round trip (from the load to its data, in us: p10 / median
/ p90 over CTAs and launches), and when the flooding CTAs' bytes landed, from the first
CTA's start (median / latest).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from mlpjit.bench.cli_args import positive_int
from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.queue_probe import MAX_FLOOD, STAMP_NAMES, STAMPS, X_LINE, QueueParams

__all__ = ["kernel_requests", "main", "probe_params", "run_probe", "summarize"]

ARCH = "sm_90a"
DEFAULT_FLOODS_KB = (0, 32, 96, 192)
DEFAULT_DELAYS_NS = (0, 1000, 2000, 4000)
START, ISSUED, REQUESTED, READY, LANDED = range(5)


def probe_params(floods_kb: Sequence[int], delays_ns: Sequence[int], quiet: int) -> list:
    """The probe's params per (flood, delay); a flood of 0 is every CTA quiet but one (the
    kernel needs a flooding CTA's range; its one CTA is left out of the report)."""
    out = []
    for kb in floods_kb:
        for delay in delays_ns:
            if kb == 0:
                out.append(QueueParams(16 * 1024, hopper.SMS - 1, delay, hopper.SMS))
            else:
                out.append(QueueParams(kb * 1024, quiet, delay, hopper.SMS))
    return out


def kernel_requests(
    floods_kb: Sequence[int], delays_ns: Sequence[int], quiet: int, arch: str = ARCH
) -> list[KernelRequest]:
    from mlpjit.kernels.queue_probe import SPEC

    return [
        KernelRequest(SPEC.name, SPEC.key_params(p), arch)
        for p in probe_params(floods_kb, delays_ns, quiet)
    ]


def _quantiles(values: Sequence[float]) -> str:
    if not values:
        return "-"
    q = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return f"{q[0]:.2f} / {statistics.median(values):.2f} / {q[-1]:.2f}"


def summarize(params: QueueParams, stamps: Sequence[Sequence[Sequence[int]]]) -> dict[str, Any]:
    """One config's numbers from its launches' stamps ([launch][cta][STAMPS] in ns): the x
    round trip of flooding and quiet CTAs in us, and when the flooding CTAs' bytes landed
    (median / latest, us from the launch's first start)."""
    flooders = params.ctas - params.quiet
    rows: dict[str, Any] = {"flood": [], "quiet": [], "landed": []}
    for launch in stamps:
        t0 = min(cta[START] for cta in launch)
        for i, cta in enumerate(launch):
            trip = (cta[READY] - cta[REQUESTED]) / 1e3
            if i < flooders:
                rows["flood"].append(trip)
                rows["landed"].append((cta[LANDED] - t0) / 1e3)
            else:
                rows["quiet"].append(trip)
    landed = rows["landed"]
    return {
        "flood_kb": params.flood_bytes // 1024,
        "flooders": flooders,
        "delay_us": params.delay_ns / 1e3,
        "x_flood_us": rows["flood"],
        "x_quiet_us": rows["quiet"],
        "landed_median_us": statistics.median(landed) if landed else None,
        "landed_latest_us": max(landed) if landed else None,
    }


def run_probe(params: QueueParams, launches: int) -> list:
    """Launch the probe ``launches`` times on GPU 0, each after L2 is cleared and x written
    again; every launch's stamps ([cta][STAMPS], ns). RuntimeError where a CTA read x
    wrong."""
    import torch

    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager
    from mlpjit.kernels.queue_probe import SPEC

    device = torch.device("cuda", 0)
    request = KernelRequest(SPEC.name, SPEC.key_params(params), ARCH)
    kernel = load_kernel(default_manager().get(request), device)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    scrub = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    buf = torch.randint(0, 256, (params.ctas * params.flood_bytes,), dtype=torch.uint8,
                        device=device)  # fmt: skip
    x = torch.empty(params.ctas * X_LINE, dtype=torch.uint8, device=device)
    out = torch.zeros(params.ctas * STAMPS, dtype=torch.int64, device=device)
    runs = []
    xor = STAMP_NAMES.index("x xor")
    for i in range(launches + 1):  # the first one loads the module and warms the clocks
        scrub.fill_(i & 0xFF)
        x.random_(0, 256)
        torch.cuda.synchronize()
        kernel.launch([out, buf, x])
        torch.cuda.synchronize()
        stamps = out.view(params.ctas, STAMPS).tolist()
        lines = x.view(torch.int32).view(params.ctas, X_LINE // 4).tolist()
        for cta, (row, words) in enumerate(zip(stamps, lines, strict=True)):
            want = 0
            for word in words:
                want ^= word & 0xFFFFFFFF
            if row[xor] & 0xFFFFFFFF != want:
                raise RuntimeError(
                    f"queue_probe: CTA {cta} read x wrong (XOR {row[xor] & 0xFFFFFFFF:#x}, "
                    f"expected {want:#x})"
                )
        if i:
            runs.append(stamps)
    return runs


def _ints(text: str, name: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        parser.error(f"{name} must be a comma list of ints, got {text!r}")
    if not values or any(v < 0 for v in values):
        parser.error(f"{name} must be a non-empty comma list of ints >= 0, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None, description: str | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--floods",
        default=",".join(map(str, DEFAULT_FLOODS_KB)),
        help=f"KB each flooding CTA (one per SM) requests, e.g. 0,96,192 (at most "
        f"{MAX_FLOOD // 1024}; 0: every CTA quiet but one)",
    )
    p.add_argument(
        "--delays",
        default=",".join(map(str, DEFAULT_DELAYS_NS)),
        help="ns after its start each CTA loads x, e.g. 0,2000",
    )
    p.add_argument("--quiet", type=positive_int, default=4, help="CTAs that request nothing")
    p.add_argument("--launches", type=positive_int, default=5, help="launches per config")
    p.add_argument("--emit", help="write the compile requests as JSON lines; no GPU needed")
    p.add_argument("--json", help="write every CTA's numbers as JSON")
    args = p.parse_args(argv)
    args.flood_list = _ints(args.floods, "--floods", p)
    args.delay_list = _ints(args.delays, "--delays", p)
    try:
        probe_params(args.flood_list, args.delay_list, args.quiet)
    except ValueError as err:
        p.error(str(err))
    return args


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    args = parse_args(argv, description)
    if args.emit:
        items = kernel_requests(args.flood_list, args.delay_list, args.quiet)
        with open(args.emit, "w") as f:
            f.writelines(r.to_json_line() + "\n" for r in items)
        print(f"{len(items)} requests -> {args.emit}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_queue_probe: needs a CUDA GPU (--emit works without one)", file=sys.stderr)
        return 2
    print(torch.cuda.get_device_name(0))
    print("| flood KB/SM | delay us | x trip, flooding CTAs (p10 / median / p90 us) "
          "| x trip, quiet CTAs | flood landed (median / latest us) |")  # fmt: skip
    print("|---|---|---|---|---|")
    results = []
    for params, kb in zip(
        probe_params(args.flood_list, args.delay_list, args.quiet),
        [kb for kb in args.flood_list for _ in args.delay_list],
        strict=True,
    ):
        row = summarize(params, run_probe(params, args.launches))
        if kb == 0:  # the one flooding CTA is only there to give the kernel a range
            row.update(flood_kb=0, x_flood_us=[], landed_median_us=None, landed_latest_us=None)
        results.append(row)
        landed = (
            f"{row['landed_median_us']:.2f} / {row['landed_latest_us']:.2f}"
            if row["landed_median_us"] is not None
            else "-"
        )
        print(f"| {kb} | {row['delay_us']:.1f} | {_quantiles(row['x_flood_us'])} "
              f"| {_quantiles(row['x_quiet_us'])} | {landed} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "results": results}, f)
    return 0
