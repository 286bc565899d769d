#!/usr/bin/env python3
"""DenseMlp before and after a change: a base git revision and this checkout, timed
alternately in one GPU run (A B B A back to back, B A A B with a server's norm between the
layers), as docs/KERNEL_NOTES.md's A/Bs are.

On a CPU machine, export the base and compile both trees' kernels into one cache:

    python3 scripts/ab_dense_mlp.py prepare --base main --shapes glm5-tp8 --tokens 1,4,8

then carry .gpu-cache/ab (the cache and the base tree) with the checkout to the GPU machine
(packages missing there on PYTHONPATH, as scripts/gpu_run.sh installs them; both trees keep
it behind their own):

    python3 scripts/ab_dense_mlp.py run --shapes glm5-tp8 --tokens 1,4,8
    python3 scripts/ab_dense_mlp.py report .gpu-cache/ab/ab.json

`run` prints, per mode, shape and token count, each tree's mean over its rounds, after /
before and the spread of the rounds; the JSON keeps every run. The code:
mlpjit/bench/ab_trees.py.
"""

import sys

from mlpjit.bench import ab_trees


def main(argv: list[str] | None = None) -> int:
    """Run with this docstring as the --help text."""
    return ab_trees.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
