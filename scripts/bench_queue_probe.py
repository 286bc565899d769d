#!/usr/bin/env python3
r"""Where a load issued after a flood of weight requests waits: in its own SM's queue, or
in the memory system's queue of every SM's requests.

One CTA per SM; all but the last few request a given number of KB each into shared memory
from launch on (as a kernel requests its weights before the PDL wait), the last few request
nothing; every CTA then loads 512 bytes of x from L2 at the same moment (a given time after
its start) and stamps when they arrive (mlpjit/kernels/queue_probe.py). If the quiet CTAs'
x arrives in one L2 round trip while the flooding CTAs' waits for their flood, x loaded on
an SM with nothing queued and sent on through distributed shared memory would not wait; if
both wait, only fewer bytes in flight GPU-wide would help. Compile here, run there:

    python3 scripts/bench_queue_probe.py --emit /tmp/queue.jsonl
    MLPJIT_KERNEL_MODULES=mlpjit.kernels.queue_probe MLPJIT_CACHE_DIR=.gpu-cache \
        mlpjit warm --from /tmp/queue.jsonl --arch sm_90a
    # on the GPU machine:
    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/bench_queue_probe.py --json queue.json
"""

import sys

from mlpjit.bench import queue_probe


def main(argv: list[str] | None = None) -> int:
    """Run the probe with this docstring as its --help."""
    return queue_probe.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
