"""PNG plots of stored benchmark results (matplotlib, Agg backend: no display, no GPU).

dense_mlp       scripts/bench_dense_mlp.py's results: per-layer time against tokens per shape
compile_cache   scripts/bench_compile_cache.py's results: W workers on a cold cache, and the
                warm start of a fresh process
startup         scripts/bench_startup.py's reports: per-worker start-up of a whole model

Each function takes the results as the scripts write them (already parsed JSON) and writes
one PNG; docs/BENCHMARKS.md gives the command behind each image.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["STARTUP_METRICS", "compile_cache", "dense_mlp", "startup"]

# (report field, panel title, scale to the plotted unit), for the start-up panels
STARTUP_METRICS: tuple[tuple[str, str, float], ...] = (
    ("prepare_s", "prepare, ms per worker", 1e3),
    ("construct_s", "construction of all layers + their scale checks, ms", 1e3),
    ("eager_host_us", "eager host time per call of the {kind} MLP, us", 1.0),
)


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (writes files, needs no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


def dense_mlp(results: Mapping[str, Any], path: str | Path, methods: Sequence[str]) -> None:
    """bench_dense_mlp.py's results: one panel per shape (four to a row), per-layer time
    against tokens for each of ``methods`` the rows hold (``floor``: dashed)."""
    plt = _pyplot()
    rows = results["results"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    columns = min(len(shapes), 4)
    lines = -(-len(shapes) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.5 * columns, 3.8 * lines), squeeze=False)
    for ax, shape in zip(axes.flat, shapes, strict=False):
        mine = [r for r in rows if r["shape"] == shape]
        tokens = [r["tokens"] for r in mine]
        for method in methods:
            key = f"{method}_us"
            if all(key in r for r in mine):
                style = "k--" if method == "floor" else "o-"
                ax.plot(tokens, [r[key] for r in mine], style, label=method)
        ax.set_title(shape)
        ax.set_xlabel("tokens")
        ax.set_ylabel("us per layer")
        ax.set_xticks(tokens)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(shapes) :]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize=8)
    gpu = results.get("meta", {}).get("gpu", "?")
    fig.suptitle(f"DenseMlp per-layer time on {gpu} (CUDA graph replay)")
    _save(fig, path)


def compile_cache(results: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """One or more bench_compile_cache.py results (e.g. the smoke and the fp8_gemv kernels):
    wall time, CPU time and compiles against the worker count for mlpjit and for each worker
    calling cute.compile, and the warm start of a fresh process (log scale)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    warm_labels, warm_values, warm_colors = [], [], []
    for i, result in enumerate(results):
        kernel = result.get("kernel", "smoke")
        color = colors[i % len(colors)]
        workers = [row["workers"] for row in result["rows"]]
        for side, name, style in (("mlpjit", "mlpjit", "o-"), ("baseline", "cute.compile", "x--")):
            label = f"{name}, {result['kernels']} {kernel} kernels"
            for ax, field in zip(axes[:3], ("wall_s", "cpu_s", "compiles"), strict=True):
                values = [row[side][field] for row in result["rows"]]
                ax.plot(workers, values, style, color=color, label=label)
        warm = result["warm_start"]
        warm_labels += [f"mlpjit\n{kernel}", f"cute.compile\n{kernel}"]
        warm_values += [warm["mlpjit_ready_ms"], warm["baseline_ready_ms"]]
        warm_colors += [color, color]
    titles = ("wall time, s (cold cache)", "CPU time of all workers, s", "compiles in total")
    for ax, title in zip(axes[:3], titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("worker processes W")
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers, [str(w) for w in workers])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    bars = axes[3].bar(range(len(warm_values)), warm_values, color=warm_colors)
    for bar, hatch in zip(bars, ["", "//"] * len(results), strict=True):
        bar.set_hatch(hatch)
    axes[3].bar_label(bars, fmt="%.0f", fontsize=8)
    axes[3].set_xticks(range(len(warm_labels)), warm_labels, fontsize=8)
    axes[3].set_yscale("log")
    axes[3].set_title("warm start of a fresh process, ms")
    axes[3].grid(alpha=0.3, axis="y")
    cpus = results[0].get("machine", {}).get("cpus", "?") if results else "?"
    fig.suptitle(f"Compile cache: W processes prepare the same kernels at once ({cpus} CPU cores)")
    _save(fig, path)


def _metric(result: Mapping[str, Any], field: str, scale: float) -> float:
    """One worker's value of a STARTUP_METRICS field (eager time: its first MLP kind's;
    construction: with the weight-scale checks, which runs that queue them report apart)."""
    value = result[field]
    if field == "construct_s":
        value += result.get("scale_check_s", 0.0)
    if isinstance(value, Mapping):
        value = next(iter(value.values()))
    return float(value) * scale


def startup(
    series: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | Path,
    goals: Mapping[str, Mapping[int, float]] | None = None,
) -> None:
    """bench_startup.py reports grouped into series (label -> reports, e.g. "before" and
    "after" a change, several runs each): one panel per STARTUP_METRICS field, one point per
    worker of every run at its run's worker count, a bar at the series' median; ``goals``
    maps a field to {worker count: goal, in the panel's unit}, drawn as dashed lines."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(STARTUP_METRICS), figsize=(5 * len(STARTUP_METRICS), 4))
    counts = sorted(
        {run["workers"] for reports in series.values() for r in reports for run in r["runs"]}
    )
    width = 0.8 / max(len(series), 1)
    first = next((report for reports in series.values() for report in reports), {})
    kind = next(iter(first.get("layers", {"first": 0})))
    for ax, (field, title, scale) in zip(axes, STARTUP_METRICS, strict=True):
        for s, (label, reports) in enumerate(series.items()):
            xs, ys, medians = [], [], []
            for c, count in enumerate(counts):
                values = [
                    _metric(r, field, scale)
                    for report in reports
                    for run in report["runs"]
                    if run["workers"] == count
                    for r in run["results"]
                    if "error" not in r
                ]
                x = c - 0.4 + width * (s + 0.5)
                xs += [x] * len(values)
                ys += values
                if values:
                    medians.append((x, statistics.median(values)))
            color = f"C{s}"
            ax.scatter(xs, ys, s=12, alpha=0.5, color=color)
            for i, (x, median) in enumerate(medians):
                ax.bar(
                    x, median, width * 0.9, color=color, alpha=0.3, label=label if i == 0 else None
                )
        field_goals = (goals or {}).get(field, {})
        at = [c for c, count in enumerate(counts) if count in field_goals]
        for c in at:
            label = "goal" if c == at[0] else None
            ax.hlines(field_goals[counts[c]], c - 0.45, c + 0.45, "k", "--", label=label)
        ax.set_title(title.format(kind=kind))
        ax.set_xticks(range(len(counts)), [f"{n} worker" + ("s" if n > 1 else "") for n in counts])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    layers = ", ".join(f"{n} {name}" for name, n in first.get("layers", {}).items())
    fig.suptitle(
        f"Start-up of {first.get('model', '?')} TP {first.get('tp', '?')} ({layers} MLPs, "
        f"{first.get('distinct_kernels', '?')} kernels), warm cache, per worker"
    )
    _save(fig, path)
