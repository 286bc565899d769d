#!/usr/bin/env python3
"""Start-up of a multi-worker server that uses mlpjit, measured per worker.

W worker processes (torch.multiprocessing, spawn; like tensor-parallel ranks) each:
  1. import torch and mlpjit                                         -> import ms
  2. build a model of ``--layers`` dense MLPs with random FP8 weights (GLM-5 TP8 by default:
     w13 [3072, 6144], w2 [6144, 1536])                              -> build ms
  3. wait for the others (a barrier, so every worker starts preparing at once), then prepare
     token counts 1..8 for every layer                               -> prepare ms, and the
     compile manager's stats deltas: hits, misses, compiles, lock waits (and seconds)
  4. on a GPU: capture one CUDA graph of the whole model per token count -> capture ms, then
     replay decode steps                                             -> step us (m=1, m=8)

Without a GPU, ``--arch sm_90a`` (or MLPJIT_ARCH) runs the compile side only: each worker
warms the model's kernel list (layer_plan.dense_mlp_requests, once per layer, the way each
layer's prepare() asks for it) through the process's compile manager, and reports the same
breakdown without capture and decode. The measured numbers: docs/SERVER.md.

    python3 scripts/serve_demo.py --workers 4 --cold --arch sm_90a          # CPU, cold cache
    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/serve_demo.py --workers 8   # GPU, warm cache
    python3 scripts/serve_demo.py --workers 4 --cold --arch sm_90a --json out.json

``--cold`` points MLPJIT_CACHE_DIR at a fresh temporary directory (removed afterwards).
The code is mlpjit/bench/serve_demo.py.
"""

import sys

from mlpjit.bench import serve_demo


def main(argv: list[str] | None = None) -> int:
    """Run the demo with this docstring as its --help."""
    return serve_demo.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
