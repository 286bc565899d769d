"""The code behind scripts/: benchmarks, demos and the fp8_gemv tuning sweep, tested on the
CPU (tests/test_bench_*.py); never imported by the package itself. Each script keeps its
usage docstring (its --help) and calls the matching module's ``main(argv, description)``.

cli_args.py             argparse value types the command lines share
decode_step.py          one repeatable decode step of a transformers model (bench_transformers)
transformers_bench.py   bench_transformers: arguments, guarded sections, timing, MLP chains
transformers_report.py  bench_transformers' report and JSON results
gemv_sweep.py           tune_fp8_gemv: the variants and (gate_up, down) pairs it times
tune_gemv.py            tune_fp8_gemv: arguments, timing on the GPU, report
tp_layers.py            tp_demo: seeded full layers, TP shards, the accuracy check
tp_demo.py              tp_demo: the real and emulated runs
serve_demo.py           serve_demo: the start-up of W spawned workers
launch.py               bench_launch: the host time of one launch
plots.py                PNGs of stored results: compile-cache scaling (bench_compile_cache)
                        and start-up (bench_startup)
"""
