#!/usr/bin/env python3
"""Write the kernel requests the GPU tests and benchmarks need, as JSON lines.

Each source below (a test module by file name, or a package module by name)
lists its kernels in ``kernel_requests(arch)``; the output feeds
``mlpjit warm --from FILE`` on a machine without a GPU, so the GPU run needs no compiler
(README: running the GPU tests and benchmarks on an H200):

    pip install -e .   # the scripts import the installed package
    python3 scripts/gpu_requests.py --arch sm_90a -o .gpu-cache/requests.jsonl
    M=mlpjit.testing.smoke,mlpjit.kernels.read_floor,mlpjit.kernels.wgmma_probe,mlpjit.kernels.queue_probe
    export MLPJIT_KERNEL_MODULES=$M
    MLPJIT_CACHE_DIR=.gpu-cache \
        mlpjit warm --from .gpu-cache/requests.jsonl --arch sm_90a --jobs 2

(the launcher tests use the smoke kernel, the read-floor tests the read_floor probe, the
wgmma-probe tests the wgmma_probe kernel and the queue-probe tests the queue_probe kernel,
which register only when their modules are
imported: MLPJIT_KERNEL_MODULES names them).

The demos (serve_demo.py, tp_demo.py at TP 8 and 2) use GLM-5 shards that
tests/gpu/test_dense_mlp_gpu.py lists already.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from mlpjit.jit.spec import KernelRequest

REPO = Path(__file__).resolve().parent.parent
SOURCES: tuple[Path | str, ...] = (
    REPO / "tests" / "gpu" / "test_dense_mlp_gpu.py",
    REPO / "tests" / "gpu" / "test_fp8_gemv_gpu.py",
    REPO / "tests" / "gpu" / "test_fp8_stream_gpu.py",
    REPO / "tests" / "gpu" / "test_fp8_layer_gpu.py",
    REPO / "tests" / "gpu" / "test_launcher_gpu.py",
    REPO / "tests" / "gpu" / "test_read_floor_gpu.py",
    REPO / "tests" / "gpu" / "test_wgmma_probe_gpu.py",
    REPO / "tests" / "gpu" / "test_queue_probe_gpu.py",
    "mlpjit.bench.dense_mlp_bench",
    "mlpjit.bench.launch",
    REPO / "tests" / "gpu" / "test_transformers_gpu.py",
    "mlpjit.bench.transformers_bench",
)


def _load(source: Path | str) -> ModuleType:
    """Import a package module by name, or a test module by file name."""
    if isinstance(source, str):
        return importlib.import_module(source)
    path = source
    spec = importlib.util.spec_from_file_location(f"_requests_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def requests(arch: str) -> list[KernelRequest]:
    """Distinct KernelRequests of every source's kernel_requests(arch), in source order."""
    seen: list[KernelRequest] = []
    for source in SOURCES:
        for r in _load(source).kernel_requests(arch):
            if r not in seen:
                seen.append(r)
    return seen


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default="sm_90a", help="target arch (default sm_90a)")
    p.add_argument("-o", "--output", type=Path, default=None, help="file (default stdout)")
    args = p.parse_args(argv)
    lines = [r.to_json_line() for r in requests(args.arch)]
    text = "\n".join(lines) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        print(f"{len(lines)} requests -> {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
