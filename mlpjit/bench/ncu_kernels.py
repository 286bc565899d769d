"""Per-kernel hardware counters of the benchmark's layers (the library code of
scripts/ncu_kernels.py, whose docstring says how to run it under ncu).

Each fp8_gemv kernel of DenseMlp's plan for the benchmark's shapes runs once, in isolation
(a device sync before and after), in a known order; ncu profiles them and `table` joins its
CSV with that order and with the plan's model of the weight bytes each SM has requested at
once (``in_flight_per_sm``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any

from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv.params import GemvParams
from mlpjit.testing.layers import DENSE_SHAPES

__all__ = [
    "DEFAULT_SHAPES",
    "METRICS",
    "in_flight_per_sm",
    "kernel_requests",
    "launches",
    "run",
    "table",
]

DEFAULT_SHAPES = (
    "glm5-tp8", "glm4.5-tp8", "deepseek-v3-tp8", "qwen3-32b-tp8", "glm5-tp4", "glm5-tp1",
    "deepseek-v3-shared-tp8", "deepseek-v3-shared-tp1",
)  # fmt: skip
DEFAULT_TOKENS = (1, 8)
# What `table` reads from ncu's CSV (pass them to ncu --metrics).
METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
)


def launches(
    shapes: Sequence[str] = DEFAULT_SHAPES,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    arch: str = "sm_90a",
) -> list[dict[str, Any]]:
    """The profiled launches in order: shape, tokens, half and the planned request."""
    from mlpjit.dense_mlp import kernel_requests as layer_requests

    out = []
    for name in shapes:
        if name not in DENSE_SHAPES:
            raise ValueError(f"shape must be one of {', '.join(DENSE_SHAPES)}, got {name!r}")
        hidden, inter = DENSE_SHAPES[name]
        requests = layer_requests(hidden, inter, list(tokens), arch, limit=None, ue8m0=True)
        for request in requests:  # per token count: gate_up, then down
            p = request.params
            out.append(dict(shape=name, tokens=p["tokens"],
                            half="gate_up" if p["swiglu"] else "down", rows=p["rows"], k=p["k"],
                            request=request))  # fmt: skip
    return out


def kernel_requests(arch: str = "sm_90a") -> list[KernelRequest]:
    """Every compile request of the default launches (for warming a cache without a GPU)."""
    seen: list[KernelRequest] = []
    for launch in launches(arch=arch):
        if launch["request"] not in seen:
            seen.append(launch["request"])
    return seen


def in_flight_per_sm(params: GemvParams, sms: int = hopper.SMS) -> int:
    """Weight bytes one SM has requested before its CTAs' first wait, by the kernel's
    design: each CTA requests all of its tiles' K part (registers and shared memory) at
    once, and ``ctas_per_sm`` CTAs are resident (fewer when the grid is smaller)."""
    per_cta = params.tiles * 16 * (params.k // params.splits)
    resident = min(params.ctas_per_sm, -(-params.ctas // sms))
    return per_cta * resident


def run(shapes: Sequence[str], tokens: Sequence[int], order_path: str) -> None:  # pragma: no cover
    """Launch each kernel once (GPU), writing the launch order to ``order_path``."""
    import torch

    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager
    from mlpjit.testing.layers import block_scale, random_fp8_weight

    device = torch.device("cuda", 0)
    manager = default_manager()
    gen = torch.Generator(device="cuda").manual_seed(0)
    order = []
    for launch in launches(shapes, tokens):
        params = GemvParams(**launch["request"].params)
        kernel = load_kernel(manager.get(launch["request"]), device)
        w, w_scale = random_fp8_weight(params.rows, params.k, gen, scale=block_scale(params.k, 2.0))
        x = torch.randn(params.tokens, params.k, generator=gen, device="cuda").to(torch.bfloat16)
        out = torch.empty(params.tokens, params.out_cols, dtype=torch.bfloat16, device="cuda")
        torch.cuda.synchronize()
        kernel.launch([out, x, w, w_scale])
        torch.cuda.synchronize()
        order.append(dict(
            shape=launch["shape"], tokens=launch["tokens"], half=launch["half"],
            mbytes=round(params.rows * params.k / 1e6, 3), ctas=params.ctas,
            in_flight_kb=round(in_flight_per_sm(params) / 1024, 1),
            params=dict(launch["request"].params),
        ))  # fmt: skip
    with open(order_path, "w") as f:
        json.dump(order, f, indent=1)


def table(ncu_csv: str, order: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Join ncu's CSV (one row per kernel and metric, ``--csv``) with the launch order: a
    row per launch with its time (us), DRAM throughput (% of peak) and bytes read (MB).
    ValueError when the counts differ (a launch ncu did not profile, or the wrong file)."""
    lines = [line for line in ncu_csv.splitlines() if line.startswith('"')]
    metrics: dict[str, dict[str, str]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        metrics.setdefault(row["ID"], {})[row["Metric Name"]] = row["Metric Value"]
    order = list(order)
    if len(metrics) != len(order):
        raise ValueError(
            f"ncu profiled {len(metrics)} kernels but the order file lists {len(order)} launches"
        )
    rows = []
    for launch, key in zip(order, sorted(metrics, key=int), strict=True):
        m = metrics[key]
        rows.append(dict(
            launch,
            us=_number(m.get("gpu__time_duration.sum")) / 1e3,  # ncu reports ns
            dram_pct=_number(m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed")),
            dram_mb=_number(m.get("dram__bytes_read.sum")) / 1e6,
        ))  # fmt: skip
    return rows


def _number(text: str | None) -> float:
    if text is None:
        raise ValueError("ncu CSV lacks a metric `table` needs; run ncu with --metrics "
                         + ",".join(METRICS))  # fmt: skip
    return float(text.replace(",", ""))
