"""Benchmark: W worker processes preparing the same 16 smoke kernels on a cold cache.

mlpjit:   each worker calls CompileManager().warm(requests) on one shared MLPJIT_CACHE_DIR.
baseline: each worker calls cute.compile on the same 16 kernels itself, with CuTe DSL's own
          file cache dir set (CUTE_DSL_CACHE_DIR); cute.compile never uses it (it compiles
          "compile only", which forces no_cache: cutlass/base_dsl/compiler.py,
          CompileCallable._compile, and base_dsl/dsl.py), so every worker compiles all 16.
Also: the warm start of a fresh process (all 16 kernels ready), mlpjit (cache lookups) vs the
baseline (which must compile again). Prints a markdown table; writes
bench/results/compile_cache.json (the numbers: docs/BENCHMARKS.md).

    python3 scripts/bench_compile_cache.py [--workers 1 2 4 8] [--kernels 16]
    python3 scripts/bench_compile_cache.py --kernel fp8_gemv \
        --out bench/results/compile_cache_fp8_gemv.json

``--kernel fp8_gemv`` takes the 16 GLM-5 TP8 DenseMlp kernels instead of the smoke kernel.
``--plot PNG`` draws the results (matplotlib); with ``--plot-from JSON...`` it draws (and
prints the tables of) earlier results instead of running, e.g. docs/compile_cache.png:

    python3 scripts/bench_compile_cache.py --plot docs/compile_cache.png --plot-from \
        bench/results/compile_cache.json bench/results/compile_cache_fp8_gemv.json
"""

# The code: mlpjit/bench/compile_cache_bench.py (its workers run it with -m).
from mlpjit.bench import compile_cache_bench


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with this docstring's first line as its --help."""
    compile_cache_bench.main(argv, description=__doc__)


if __name__ == "__main__":
    main()
