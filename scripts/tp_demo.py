#!/usr/bin/env python3
"""GLM-5 dense MLP layers as a tensor-parallel job: start-up and accuracy per rank.

Builds ``--layers`` full dense layers (GLM-5: hidden 6144, intermediate 12288) of seeded
random FP8 weights, shards them for TP size ``--tp`` (``shard_layer``) and runs the shards
with DenseMlp. The model is a chain of residual blocks, ``h = h + all_reduce(mlp_r(h))`` per
layer (residual adds keep the activations at a steady scale over any number of layers).

The check, for each ``--check-tokens`` count and each layer: the all-reduced TP output of
the layer against ``mlpjit.reference.dense_mlp_reference`` of the full (TP=1) layer given
the same input (the TP run's own input to that layer), within TOL relative L2. The final
``h`` against an independently computed reference chain is reported as information only
(``layer_errors`` says why).

Real mode (``torch.cuda.device_count() >= --tp``): one spawned process per rank on cuda:r,
torch.distributed with NCCL (NVLS / multicast off). Each rank times its import, process
group init, build (the full layers generated on its GPU from the seed, its shards kept),
prepare of every --tokens count (with the compile manager's hits, compiles and lock waits),
capture of one CUDA graph per token count of the whole L-layer step *including* the NCCL
all-reduce, and the step time (median of single-replay CUDA event times) at the smallest
and largest token count. Rank 0 runs the check; every rank's output digest must agree.

Emulated mode (fewer GPUs than --tp, or ``--emulate``): ONE process on cuda:0 (or on CPU
with ``--emulate`` and no GPU: reference math, no kernels, no graphs) builds every rank's
shards, prepares each rank's DenseMlps (the shards share kernel shapes: after the first
rank all hits), captures and times each rank's layers *without* the all-reduce, and for the
check sums the ranks' partial outputs in float32 (what the all-reduce computes; NCCL adds
bf16 values hop by hop, rounding at each of up to tp-1 steps: the JSON reports that variant
too). It does not cover NCCL, the ranks' concurrent start-up or the capture of the
all-reduce.

    python3 scripts/tp_demo.py --dry-run                       # CPU: args, shard shapes, plan
    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/tp_demo.py --emulate --json tp.json  # 1 GPU
    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/tp_demo.py --tp 8 --json tp.json     # 8 GPUs

The code is mlpjit/bench/tp_demo.py and tp_layers.py; ``tp_layers.kernel_requests(arch)``
lists the kernels the GPU run needs (the same list as ``mlpjit warm --model glm5 --tp 8
--tokens 1-8 --arch sm_90a``). Measured runs, and the bugs the first real runs found:
docs/SERVER.md.
"""

import sys

from mlpjit.bench import tp_demo


def main(argv: list[str] | None = None) -> int:
    """Run the demo with this docstring as its --help."""
    return tp_demo.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
