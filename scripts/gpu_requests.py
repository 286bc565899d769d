#!/usr/bin/env python3
"""Write the kernel requests the GPU tests and benchmarks need, as JSON lines.

The output feeds ``mlpjit warm --requests FILE`` on a machine without a GPU, so the GPU run
needs no compiler (the GPU.md workflow):

    python3 scripts/gpu_requests.py --arch sm_90a -o .gpu-cache/requests.jsonl
    MLPJIT_CACHE_DIR=.gpu-cache mlpjit warm --from .gpu-cache/requests.jsonl --jobs 2
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    ROOT / "tests" / "gpu" / "test_dense_mlp_gpu.py",
    ROOT / "tests" / "gpu" / "test_fp8_gemv_gpu.py",
    ROOT / "tests" / "gpu" / "test_launcher_gpu.py",
    ROOT / "scripts" / "bench_dense_mlp.py",
)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_requests_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def requests(arch: str) -> list:
    """Distinct KernelRequests of every source's kernel_requests(arch)."""
    seen: list = []
    for path in SOURCES:
        for r in _load(path).kernel_requests(arch):
            if r not in seen:
                seen.append(r)
    return seen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default="sm_90a", help="target arch (default sm_90a)")
    p.add_argument("-o", "--output", type=Path, default=None, help="file (default stdout)")
    args = p.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
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
