#!/usr/bin/env python3
"""Benchmark DenseMlp against the stock path and the HBM floor on one GPU.

Per shape and token count, each method runs a chain of distinct layers whose weights total at
least ``--l2-multiple`` x the GPU's L2 (so weights come from HBM, not L2), captured once in a
CUDA graph; the per-layer time is the median over ``--replays`` replays / layer count.
``--l2-resident`` chains calls of one layer instead, so its weights stay in L2: what the
kernels take when HBM is not the limit (their fixed costs).
Methods, all in the same run:
  mlpjit        DenseMlp (two fused kernels, PDL on)
  mlpjit_nopdl  the same kernels launched without programmatic dependent launch
  stock         torch: quant, block-scaled _scaled_mm, SiLU-and-mul, quant, _scaled_mm
  scaled_mm     the two block-scaled _scaled_mm GEMMs alone (inputs pre-quantized)
  bf16          BF16 weights: torch.mm, SiLU-and-mul, torch.mm
  floor         FP8 weight (+scale) bytes / device-to-device copy bandwidth (same run)
plus the host time of an eager DenseMlp call. Writes JSON (bench/results/ by default), prints
a markdown table, and with --plot draws a PNG (matplotlib). The numbers, and the command
behind docs/BENCHMARKS.md's table: docs/BENCHMARKS.md.

    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/bench_dense_mlp.py            # full run
    python3 scripts/bench_dense_mlp.py --quick                                 # smoke run
    python3 scripts/bench_dense_mlp.py --dry-run                               # no GPU needed
    python3 scripts/bench_dense_mlp.py --plot-from bench/results/X.json --plot docs/b.png
"""

# The code: mlpjit/bench/dense_mlp_bench.py.
import sys

from mlpjit.bench import dense_mlp_bench


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with this docstring as its --help."""
    return dense_mlp_bench.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
