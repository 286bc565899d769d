#!/usr/bin/env python3
"""Time fp8_gemv configs on the GPU, per kernel or per layer, to choose TUNED_H200's entries.

  kernel  one kernel type repeated in a chain, per shape and token count: choose_config's
          pick and the other (tiles, in_regs, ctas_per_sm) that fit, optionally with
          several 512-K slices per warp (--slices-per-warp) and in clusters (--clusters).
  layer   gate_up and down alternating in one PDL chain, as in a model. How two kernels
          hand over (the PDL trigger point, SMs shared while one drains and the next
          streams) only shows in this order. choose_config's pair with every combination of
          early_launch (PDL trigger at kernel entry or after the wait), extra configs crossed
          with it (--gate-up-configs, --down-configs), and the pair in clusters (--clusters).
  compare each layer pair of a sweep's --json against the planned pair (after / before, the
          worst round, and with --norm the same sweep's --norm-between run), marking those
          that pass the table's rule: faster by more than 3% in every round back to back and
          no slower with the norm (docs/KERNEL_NOTES.md).

The GPU machine has no compiler, so compile the variants here first, then time them there
from the carried cache (nothing compiles on the GPU):

    python3 scripts/tune_fp8_gemv.py kernel --emit /tmp/tune.jsonl
    MLPJIT_CACHE_DIR=.gpu-cache mlpjit warm --from /tmp/tune.jsonl --arch sm_90a --jobs 2
    MLPJIT_CACHE_DIR=$PWD/.gpu-cache python3 scripts/tune_fp8_gemv.py kernel --json tune.json

and the same with ``layer``; ``--dry-run`` lists the variants (no GPU needed). Each variant
runs over a chain of distinct weights totalling >= --l2-multiple x the L2 size (so weights
stream from HBM), captured in one CUDA graph: the time per launch (kernel) or per layer
(layer) is the median replay divided by the chain length, averaged over --rounds rounds
(default 2) that time every variant once, odd rounds in reverse order, after the run's
first three timings are discarded (a fresh GPU's first timings come out fast), so no variant
gains from its place.
The floor of the kernel mode is the weight bytes (FP8 + float32 scales) over the
device-to-device copy bandwidth (bytes read + written per second). What the sweeps found:
docs/KERNEL_NOTES.md. The code:
mlpjit/bench/gemv_sweep.py (the variants and pairs) and tune_gemv.py (arguments, timing,
report).
"""

import sys

from mlpjit.bench import tune_gemv


def main(argv: list[str] | None = None) -> int:
    """Run the sweep with this docstring as its --help."""
    return tune_gemv.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
