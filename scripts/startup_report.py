"""Start-up numbers shared by the multi-process demos (serve_demo.py, tp_demo.py)."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

STAT_FIELDS = ("hits", "misses", "compiles", "lock_waits", "wait_seconds", "compile_seconds")


def ms(seconds: float) -> float:
    """Seconds as milliseconds, rounded for a table."""
    return round(seconds * 1000.0, 1)


def stats_delta(before: Any, after: Any) -> dict[str, float]:
    """What a process's compile manager did between two CacheStats snapshots."""
    out = {}
    for name in STAT_FIELDS:
        delta = getattr(after, name) - getattr(before, name)
        out[name] = round(delta, 3) if isinstance(delta, float) else delta
    return out


def timed_prepare(mlps: Sequence[Any], tokens: Sequence[int]) -> dict[str, Any]:
    """prepare(tokens) on every layer, timed, with what the compile manager did meanwhile,
    whether cutlass got imported (it should not on a warm cache) and the paths taken."""
    import time

    from mlpjit.jit.manager import default_manager

    manager = default_manager()
    before = manager.stats
    t0 = time.perf_counter()
    for mlp in mlps:
        mlp.prepare(tokens)
    return {
        "prepare_ms": ms(time.perf_counter() - t0),
        **stats_delta(before, manager.stats),
        "cutlass_imported": "cutlass" in sys.modules,
        "paths": sorted({mlp.path(m) for mlp in mlps for m in tokens}),
    }


def format_table(
    results: list[dict], header: Sequence[str], row: Callable[[dict], list[str]]
) -> str:
    """A markdown table, one row per process, plus a totals line over the ones that worked."""
    rows = [list(header), ["---"] * len(header), *(row(r) for r in results)]
    lines = ["| " + " | ".join(cells) + " |" for cells in rows]
    ok = [r for r in results if "error" not in r]
    if ok:
        lines.append(
            f"\ntotal: {sum(r['compiles'] for r in ok)} compiles, {sum(r['hits'] for r in ok)} "
            f"hits, {sum(r['lock_waits'] for r in ok)} lock waits; prepare ms median "
            f"{statistics.median(r['prepare_ms'] for r in ok):.0f}, max "
            f"{max(r['prepare_ms'] for r in ok):.0f}"
        )
    return "\n".join(lines)
