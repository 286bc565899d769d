"""The code behind scripts/: benchmarks, demos and the tuning sweeps, tested on the
CPU (tests/test_bench_*.py); never imported by the package itself. Each script keeps its
usage docstring (its --help) and calls the matching module's ``main(argv, description)``.

cli_args.py             argparse value types and options the command lines share
decode_step.py          one repeatable decode step of a transformers model (bench_transformers)
transformers_bench.py   bench_transformers: arguments, guarded sections, timing, MLP chains
transformers_report.py  bench_transformers' report and JSON results
gemv_sweep.py           tune_fp8_gemv: the variants and (gate_up, down) pairs it times
tune_gemv.py            tune_fp8_gemv: arguments, timing on the GPU, report
tp_layers.py            tp_demo: seeded full layers, TP shards, the accuracy check
tp_demo.py              tp_demo: the real and emulated runs
serve_demo.py           serve_demo: the start-up of W spawned workers
launch.py               bench_launch: the host time of one launch
dense_mlp_bench.py      bench_dense_mlp: DenseMlp against the stock path and the floor
startup.py              bench_startup: a model's MLPs prepared in W spawned workers (no torch
                        at its top: a worker re-imports it)
tune_stream.py          tune_fp8_stream: fp8_stream / fp8_layer variants beside fp8_gemv
compile_cache_bench.py  bench_compile_cache: W workers on a cold cache (run with -m as a
                        worker)
ncu_kernels.py          ncu_kernels: per-kernel hardware counters under Nsight Compute
plots.py                PNGs of stored results: DenseMlp per-layer times (bench_dense_mlp),
                        compile-cache scaling (bench_compile_cache) and start-up
                        (bench_startup)
"""
