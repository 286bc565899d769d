"""Per-kernel hardware counters of the benchmark's layers (the library code of
scripts/ncu_kernels.py, whose docstring says how to run it under ncu).

Every kernel DenseMlp runs for the benchmark's shapes (fp8_gemv's or fp8_stream's, as
mlpjit.layer_plan picks them) runs once, in isolation (one layer call between two device
syncs), in a known order; ncu profiles them and `table` joins its CSV with that order and
with each kernel's model of the weight bytes an SM has requested before its first wait
(``in_flight_per_sm``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any

from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.blocks import BLOCK
from mlpjit.kernels.fp8_gemv.params import STEP, GemvParams
from mlpjit.kernels.fp8_stream.params import TILE_ROWS, StreamParams
from mlpjit.testing.layers import DENSE_SHAPES

__all__ = [
    "DEFAULT_SHAPES",
    "KERNEL_REGEX",
    "METRICS",
    "in_flight_per_sm",
    "kernel_requests",
    "kernel_params",
    "launches",
    "run",
    "table",
]

DEFAULT_SHAPES = (
    "glm5-tp8", "glm4.5-tp8", "deepseek-v3-tp8", "qwen3-32b-tp8", "glm5-tp4", "glm5-tp1",
    "deepseek-v3-shared-tp8", "deepseek-v3-shared-tp1",
)  # fmt: skip
DEFAULT_TOKENS = (1, 8)
# ncu's -k filter: the symbols of both kernels' builds (CuTe DSL names them after the class).
KERNEL_REGEX = "regex:Fp8(Gemv|Stream)"
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


def kernel_params(request: KernelRequest) -> GemvParams | StreamParams:
    """The params of a planned request: fp8_gemv's or fp8_stream's; ValueError for any
    other kernel."""
    kinds = {"fp8_gemv": GemvParams, "fp8_stream": StreamParams}
    if request.kernel not in kinds:
        raise ValueError(
            f"kernel must be one of {', '.join(kinds)}, got {request.kernel!r}"
        )
    return kinds[request.kernel](**request.params)


def in_flight_per_sm(params: GemvParams | StreamParams, sms: int = hopper.SMS) -> int:
    """Weight bytes one SM has in flight before its CTAs' first wait (what x's loads queue
    behind), by the kernel's design, times the CTAs resident per SM (fewer when the grid is
    smaller). fp8_gemv: each warp requests its register steps and its staged steps at once,
    but for its late steps (after x's loads); with ``paced``, warp 0 requests all of its
    steps and every other warp keeps only its register steps and ``paced`` staged steps in
    flight (a persistent grid: its first row tile). fp8_stream: the producer fills the
    ring's ``stages`` before it first waits for a slot, so the busiest CTA's first
    ``stages`` stages (all of its range where the ring holds it)."""
    if isinstance(params, StreamParams):
        per_cta = TILE_ROWS * BLOCK * max(
            sum(params.stage_fills(b0, b1)[: params.stages]) for b0, b1 in params.cta_ranges()
        )
    else:
        step = 16 * STEP  # a warp's 64-K step of its 16 rows
        regs, staged = params.in_regs * params.spw, params.staged * params.spw
        if params.paced:
            per_cta = step * (regs + staged + (params.warps - 1) * (regs + params.paced))
        else:
            per_cta = step * params.warps * (regs + staged - params.late_steps)
    resident = min(params.ctas_per_sm, -(-params.ctas // sms))
    return per_cta * resident


def run(shapes: Sequence[str], tokens: Sequence[int], order_path: str) -> None:  # pragma: no cover
    """Call each shape's DenseMlp once per token count (GPU), so its two kernels run in
    launches' order, writing that order to ``order_path``."""
    import torch

    from mlpjit.dense_mlp import DenseMlp
    from mlpjit.testing.layers import random_fp8_layer

    gen = torch.Generator(device="cuda").manual_seed(0)
    planned = launches(shapes, tokens)
    order = []
    for name in shapes:
        mlp = DenseMlp(**random_fp8_layer(*DENSE_SHAPES[name], gen), ue8m0=True)
        mlp.prepare(tokens)
        for m in tokens:
            x = torch.randn(m, mlp.hidden, generator=gen, device="cuda").to(torch.bfloat16)
            torch.cuda.synchronize()
            mlp(x)
            torch.cuda.synchronize()
        for launch in (p for p in planned if p["shape"] == name):
            params = kernel_params(launch["request"])
            order.append(dict(
                shape=name, tokens=launch["tokens"], half=launch["half"],
                kernel=launch["request"].kernel, mbytes=round(params.rows * params.k / 1e6, 3),
                ctas=params.ctas, in_flight_kb=round(in_flight_per_sm(params) / 1024, 1),
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
