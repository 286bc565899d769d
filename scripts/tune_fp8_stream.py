#!/usr/bin/env python3
"""Time fp8_stream layers against fp8_gemv's planned pair, on the GPU, side by side.

Each dense-layer shape runs as a PDL chain of distinct layers (gate_up then down, weights
totalling >= --l2-multiple x L2) captured in one CUDA graph; the time per layer is the
median replay over the chain length, and its floor the layer's weight bytes over the
device-to-device copy bandwidth measured in the same run. Every variant of a shape and token
count is timed once per round (--rounds, default 2), odd rounds in reverse order, after the
run's first three timings are discarded (a fresh GPU's first timings come out fast), and its
time is the mean of its rounds' medians, so no variant gains from its place. Variants:
``gemv`` (fp8_gemv as planned today), ``WxR`` fp8_stream configs (W consumer warps, R ring
stages; R 0: the planner's), ``L`` / ``LWbB[sGxD]``: the whole layer in one fp8_layer kernel
(the planner's knobs, or W consumer warps of B blocks each and G / D ring stages), and
``gN`` / ``dN``: fp8_gemv with its gate_up (g) or down (d) kernel on the N-th alternative
decomposition (the planner model's best of each K-split count, slice size and slices per
warp; `gemv_alternatives`), the other half as planned, which sweeps the planner's choices
layer by layer (each row records both kernels' parameters). A WxR variant takes options
after its knobs: ``kN``/``ka`` the cluster form, ``s`` x shared in the cluster, ``g``/``d``
one half only, and a trailing ``-x``, ``-mma`` or ``-x+mma`` leaves that part of the work
out (wrong output by design: what the part costs is the difference). Before timing, every
variant's first layer is checked against mlpjit.reference (relative L2 error printed).

Compile here, time there (the GPU machine has no compiler):

    python3 scripts/tune_fp8_stream.py --emit /tmp/stream.jsonl
    MLPJIT_CACHE_DIR=.gpu-cache mlpjit warm --from /tmp/stream.jsonl --arch sm_90a --jobs 2
    MLPJIT_CACHE_DIR=$PWD/.gpu-cache python3 scripts/tune_fp8_stream.py --json out.json

``--trace`` also launches trace builds of each fp8_stream pair, one-kernel layer and fp8_gemv
pair three times after an idle GPU and prints per-CTA timestamps: each stamp's median and
latest CTA, and where the CTAs' time goes (docs/KERNEL_NOTES.md reads them).
``--grid`` adds the off-table grid (hidden x intermediate shard) of the benchmarks;
``--plot PNG --from-json JSON`` draws a --json file's times against layer size (x the
floor, one series per variant and token count; matplotlib, no GPU).
"""

# The code: mlpjit/bench/tune_stream.py.
import sys

from mlpjit.bench import tune_stream


def main(argv: list[str] | None = None) -> int:
    """Run the sweep with this docstring's first line as its --help."""
    return tune_stream.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
