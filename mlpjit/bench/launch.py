"""The launch benchmark behind scripts/bench_launch.py (its docstring: how to run it): host
time of the smoke kernel's launch through mlpjit's launcher, and the one kernel it needs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import mlpjit.testing.smoke  # noqa: F401  (registers the smoke kernel)
from mlpjit.jit.spec import KernelRequest

__all__ = ["SMOKE", "kernel_requests", "main", "measure"]

SMOKE = {"n": 4096, "scale": 2.0, "block": 128}


def kernel_requests(arch: str = "sm_90a") -> list[KernelRequest]:
    """The kernel this benchmark launches (for warming a cache without a GPU)."""
    return [KernelRequest("smoke", dict(SMOKE), arch)]


def measure(batches: int, per_batch: int) -> dict[str, float]:
    """Median and minimum host microseconds per launch over ``batches`` timed batches."""
    import torch

    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager

    device = torch.device("cuda", torch.cuda.current_device())
    kernel = load_kernel(default_manager().get(kernel_requests()[0]), device)
    x = torch.randn(SMOKE["n"], device=device)
    out = torch.empty_like(x)
    for _ in range(100):
        kernel.launch((out, x))
    torch.cuda.synchronize()
    per_launch = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            kernel.launch((out, x))
        per_launch.append((time.perf_counter() - t0) / per_batch * 1e6)
        torch.cuda.synchronize()
    if not torch.equal(out, x * SMOKE["scale"]):
        raise SystemExit("the smoke kernel computed a wrong result")
    return {"median_us": statistics.median(per_launch), "min_us": min(per_launch)}


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """Time the launches on the GPU and print them; 1 without a GPU. ``description``: the
    --help text (the script's docstring)."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--per-batch", type=int, default=200)
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_launch: needs a CUDA GPU", file=sys.stderr)
        return 1
    result = measure(args.batches, args.per_batch)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"launch host time: median {result['median_us']:.2f} us, min {result['min_us']:.2f} us"
        )
    return 0
