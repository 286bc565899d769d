#!/usr/bin/env python3
r"""What a kernel that only reads a layer's weight bytes costs: the floor a kernel of this
design can reach, per kernel and per layer, beside the copy-bandwidth floor.

For each shape, the read_floor kernel (mlpjit/kernels/read_floor.py: a producer warp's bulk
copies into a ring of shared-memory stages, consumers that wait for the previous kernel,
read each stage from shared memory and release it, and compute nothing) streams the
gate_up matrix's bytes, the down matrix's, and both in turn as a layer: as two kernels
(`layer`), and as one kernel whose consumers meet at a grid-wide barrier between the two
matrices (`fused`, as a one-kernel layer's down waits for act) or not (`flat`). Each chain
runs over distinct buffers totalling >= 4x the L2 as PDL launches, timed as CUDA graph
replays (median per kernel or layer). Every kernel's XOR of the words it read is checked
against the buffer's first. Configs name the ring's stage shape, and whether the CTAs take
fixed ranges or claim stages as they go (mlpjit/bench/read_floor.py); `--chains` picks
which of the chains to time.
Compile here, run there:

    python3 scripts/bench_read_floor.py --emit /tmp/read.jsonl
    MLPJIT_KERNEL_MODULES=mlpjit.kernels.read_floor MLPJIT_CACHE_DIR=.gpu-cache \
        mlpjit warm --from /tmp/read.jsonl --arch sm_90a
    # on the GPU machine:
    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/bench_read_floor.py --json read.json
"""

import sys

from mlpjit.bench import read_floor


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with this docstring as its --help."""
    return read_floor.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
