#!/usr/bin/env python3
"""Start-up of a whole model's MLPs: every dense MLP and shared expert of a model preset,
built and prepared in W worker processes at once on the GPU, measured per worker.

Each worker (spawned, like a TP rank; worker i on GPU i modulo the visible GPUs):
  1. imports torch and the mlpjit modules DenseMlp.prepare uses           -> import s
  2. initializes CUDA                                                      -> cuda init s
  3. makes seeded random FP8 weights of the preset's TP shards, one set per layer (not timed;
     synchronized), then waits for the others (a barrier: all start at once)
  4. constructs every layer (DenseMlp: checks, scale checks)               -> construct s
  5. prepares every layer with the token counts (default 1-8)              -> prepare s,
     cuModuleLoadData calls and distinct kernels, the cache lookups behind them
  4b. resolves the weight-scale checks construction queued (DenseMlp.check_weight_scales:
     one host sync for all layers)                                          -> scale check s
  6. (after a second barrier: no worker's timed launches overlap another's start-up on a
     shared GPU) eager host time per call at m=1 of the first dense MLP and the first
     shared expert (median of --calls calls, each timed until it returns, with
     torch.cuda.synchronize only around the loop), split into: the two launches alone
     (launch host us), the output's allocation alone (alloc host us), a DenseMlp call
     (eager host us), a call through the torch op
     torch.ops.mlpjit.dense_mlp (op host us) and mlpjit.ops.dense_mlp's eager call that
     skips the op's dispatch (op eager host us); and one torch op (x.mul(1)) the same way:
     this CPU's scale
  7. host syncs of constructing one layer of each kind (construct syncs per layer), and a
     cold planning of the model's shapes in this process (plan s, part of prepare s)

A model has first-k dense MLP layers and a shared expert in each MoE layer (LAYER_COUNTS;
GLM-5: 3 dense + 75 shared = 78 MLPs, 32 distinct kernels at TP 8 for tokens 1-8).

It needs a warm cache and never compiles: warm one where nvidia-cutlass-dsl is installed,
    MLPJIT_CACHE_DIR=.gpu-cache mlpjit warm --model glm5 --tp 8 --arch sm_90a
carry it to the GPU machine, and there run
    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/bench_startup.py --model glm5 --tp 8 \\
        --workers 1,8 --json
A kernel missing from the cache fails the run with one line (the workers cannot compile).
``--dry-run`` lists the layers and kernels without a GPU; ``--profile N`` runs each worker's
prepare under cProfile and reports its N functions of most cumulative time. The top of this
file imports no torch and nothing of mlpjit that does, so a spawned worker's import time is
its own.

``--plot PNG --plot-from JSON...`` draws stored reports instead (matplotlib, no GPU): a file
is one --json report or {"runs": {name: report, ...}}; ``--series LABEL=TEXT`` puts the runs
whose name holds TEXT into one series (default: a series per run). docs/startup.png:
    python3 scripts/bench_startup.py --plot docs/startup.png --plot-from \\
        bench/results/startup_glm5_tp8_h200.json --series before=old --series after=new
"""

# The code: mlpjit/bench/startup.py (its top imports no torch either).
import sys

from mlpjit.bench import startup


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with this docstring as its --help."""
    return startup.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
