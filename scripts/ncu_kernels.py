#!/usr/bin/env python3
"""Hardware counters per kernel of the benchmark's layers, under Nsight Compute.

Each kernel DenseMlp runs (fp8_gemv's or fp8_stream's) runs once in isolation (no PDL
overlap with a neighbour), in a known order; ncu profiles them; --table joins ncu's CSV with
that order and each kernel's model of the weight bytes an SM has requested before its first
wait. Compile here, run there:

    python3 scripts/ncu_kernels.py --emit /tmp/ncu.jsonl
    MLPJIT_CACHE_DIR=.gpu-cache mlpjit warm --from /tmp/ncu.jsonl --arch sm_90a
    # on the GPU machine:
    ncu --clock-control none --print-units base --csv -k 'regex:Fp8(Gemv|Stream)' \\
        --metrics "$(python3 scripts/ncu_kernels.py --metrics)" \\
        python3 scripts/ncu_kernels.py --order /tmp/order.json > /tmp/ncu.csv
    python3 scripts/ncu_kernels.py --table /tmp/ncu.csv --order /tmp/order.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from mlpjit.bench.ncu_kernels import (
    DEFAULT_SHAPES,
    DEFAULT_TOKENS,
    METRICS,
    kernel_requests,
    run,
    table,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma list")
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="e.g. 1,8")
    parser.add_argument("--emit", help="write the default launches' compile requests and stop")
    parser.add_argument("--order", help="launch order file (written by a run, read by --table)")
    parser.add_argument("--table", help="ncu --csv output to join with --order")
    parser.add_argument("--json", help="with --table: also write the rows here")
    parser.add_argument("--metrics", action="store_true", help="print ncu's --metrics list")
    args = parser.parse_args(argv)
    if args.metrics:
        print(",".join(METRICS))
        return 0
    if args.emit:
        requests = kernel_requests()
        with open(args.emit, "w") as f:
            f.writelines(r.to_json_line() + "\n" for r in requests)
        print(f"{len(requests)} requests -> {args.emit}")
        return 0
    if not args.order:
        parser.error("--order FILE is needed (the launch order a run writes, --table reads)")
    if args.table:
        with open(args.table) as f, open(args.order) as g:
            rows = table(f.read(), json.load(g))
        print(
            "| shape | tokens | half | kernel | MB | CTAs | KB in flight per SM | us "
            "| DRAM % of peak |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            cells = (
                r["shape"], r["tokens"], r["half"], r.get("kernel", "fp8_gemv"),
                f"{r['mbytes']:.1f}", r["ctas"],
                f"{r['in_flight_kb']:.0f}", f"{r['us']:.2f}", f"{r['dram_pct']:.1f}",
            )  # fmt: skip
            print("| " + " | ".join(map(str, cells)) + " |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens must be comma-separated ints, got {args.tokens!r}")
    run(args.shapes.split(","), tokens, args.order)
    return 0


if __name__ == "__main__":
    sys.exit(main())
