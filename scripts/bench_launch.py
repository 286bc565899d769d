#!/usr/bin/env python3
"""Host time of one kernel launch through mlpjit's launcher (cuLaunchKernelEx + PDL).

Loads the smoke kernel (n=4096, block 128) from the cache (warm it on a CPU machine first:
`python3 scripts/gpu_requests.py` lists it), launches it 100 times to warm up, then times
batches of launches with time.perf_counter and reports the median and the minimum per
launch (the GPU work is a few microseconds; the host side is what this measures):

    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/bench_launch.py [--batches 20 --per-batch 200]

The code is mlpjit/bench/launch.py.
"""

import sys

from mlpjit.bench import launch


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with this docstring as its --help."""
    return launch.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
