#!/usr/bin/env bash
# The GPU tests on an H200 machine with a cache compiled elsewhere (README: running the GPU
# tests and benchmarks on an H200): installs carried wheels (.whl/, no index), puts the
# repository on PYTHONPATH (mlpjit need not be installed there), runs tests/gpu against
# $MLPJIT_CACHE_DIR (default .gpu-cache). The benchmarks run after it, as the README shows.
# Usage (on the GPU machine): scripts/gpu_run.sh [pytest args...]; logs land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export MLPJIT_CACHE_DIR=${MLPJIT_CACHE_DIR:-$PWD/.gpu-cache}
export PYTHONUNBUFFERED=1
chmod -R go-w "$MLPJIT_CACHE_DIR" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -q -s -rs tests/gpu "$@" 2>&1 | tee "$OUT/gpu_tests.log"
