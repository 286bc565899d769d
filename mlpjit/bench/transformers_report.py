"""The decode-step benchmark's report (scripts/bench_transformers.py): speed-ups against
bf16, the markdown tables and notes, and its JSON results (saved, merged across runs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "add_speedups",
    "markdown_report",
    "merge_results",
    "mlp_sums",
    "mlp_table",
    "step_table",
    "write_json",
]


def add_speedups(rows: list[dict]) -> None:
    """speedup_vs_bf16 on each measured row: the bf16 row's step time (same model, context
    and mode) / this row's."""
    bf16 = {
        (r["model"], r["context"], r["mode"]): r["step_us"]
        for r in rows
        if r["variant"] == "bf16" and "step_us" in r
    }
    for r in rows:
        base = bf16.get((r["model"], r["context"], r["mode"]))
        if base is not None and "step_us" in r and r["variant"] != "bf16":
            r["speedup_vs_bf16"] = base / r["step_us"]


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def step_table(rows: list[dict], models: dict[str, dict], modes: Sequence[str]) -> str:
    """One line per model, context and variant; per mode the step time and the speedup
    against bf16 in the same mode; the floor and the logits' error against bf16."""
    head = ["model", "context", "variant"]
    for mode in modes:
        head += [f"{mode} us", f"{mode} vs bf16"]
    head += ["floor us", "best x floor", "logits rel_l2 vs bf16"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["context"], r["variant"]), {})[r["mode"]] = r
    for (model, context, variant), by_mode in groups.items():
        cells = [model, str(context), variant]
        floors, ratios, errs = [], [], []
        for mode in modes:
            r = by_mode.get(mode)
            if r is None:
                cells += ["-", "-"]
            elif "step_us" not in r:
                cells += ["failed", "-"]
            else:
                speedup = r.get("speedup_vs_bf16")
                cells += [_fmt(r["step_us"]), "-" if speedup is None else f"{speedup:.2f}x"]
                floors.append(r.get("floor_us"))
                ratios.append(r.get("floor_ratio"))
                if "logits_rel_l2_vs_bf16" in r:
                    errs.append(r["logits_rel_l2_vs_bf16"])
        floor = next((f for f in floors if f is not None), None)
        best = min((x for x in ratios if x is not None), default=None)
        cells += [_fmt(floor), _fmt(best, ".2f"), _fmt(max(errs) if errs else None, ".2e")]
        lines.append("| " + " | ".join(cells) + " |")
    for model, info in models.items():
        status = info.get("hf_fp8")
        if status and status != "available":
            cell = "not available (see below)"
            lines.append(f"| {model} | - | hf_fp8 | {cell} |" + " |" * (len(head) - 4))
    return "\n".join(lines)


def mlp_table(rows: list[dict]) -> str:
    head = [
        "model", "module", "hidden", "intermediate", "per step", "path",
        "mlpjit us", "bf16 us", "vs bf16", "floor us", "x floor",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        speedup = r.get("speedup_vs_bf16")
        cells = [
            r["model"], r["module"], str(r["hidden"]), str(r["intermediate"]), str(r["count"]),
            r.get("path", "-"), _fmt(r.get("mlpjit_us"), ".2f"), _fmt(r.get("bf16_us"), ".2f"),
            "-" if speedup is None else f"{speedup:.2f}x", _fmt(r.get("floor_us"), ".2f"),
            _fmt(r.get("floor_ratio"), ".2f"),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mlp_sums(mlps: list[dict]) -> dict[str, dict[str, float]]:
    """Per model, the routed MLPs' time per step (count x per-MLP time) for mlpjit and bf16,
    where both shapes were measured."""
    sums: dict[str, dict[str, float]] = {}
    for model in dict.fromkeys(r["model"] for r in mlps):
        mine = [r for r in mlps if r["model"] == model]
        for key in ("mlpjit_us", "bf16_us"):
            if all(key in r for r in mine):
                sums.setdefault(model, {})[key] = sum(r["count"] * r[key] for r in mine)
    return sums


def markdown_report(results: dict) -> str:
    """The step table, the per-MLP table and the notes (hf_fp8 status, failures)."""
    meta = results.get("meta", {})
    modes = meta.get("modes") or list(dict.fromkeys(r["mode"] for r in results["steps"]))
    if any(r["mode"] == "compiled" for r in results["steps"]) and "compiled" not in modes:
        modes = [*modes, "compiled"]
    parts = [
        "### Decode step (1 new token, static cache)",
        "",
        step_table(results["steps"], results.get("models", {}), modes),
    ]
    if results.get("mlps"):
        parts += ["", "### Per MLP (DenseMlp alone, 1 token)", "", mlp_table(results["mlps"])]
    notes = []
    if "copy_bandwidth_gbs" in meta:
        notes.append(f"copy bandwidth (floors): {meta['copy_bandwidth_gbs'] / 1e3:.2f} TB/s")
    for model, sums in mlp_sums(results.get("mlps", [])).items():
        if "mlpjit_us" in sums and "bf16_us" in sums:
            notes.append(
                f"{model}: routed MLPs per step {sums['mlpjit_us']:.1f} us (mlpjit) vs "
                f"{sums['bf16_us']:.1f} us (bf16), from the per-MLP table"
            )
    for model, info in results.get("models", {}).items():
        if info.get("hf_fp8"):
            notes.append(f"{model}: transformers' FP8 path (hf_fp8): {info['hf_fp8']}")
        if info.get("experts_implementation"):
            notes.append(f"{model}: experts implementation {info['experts_implementation']}")
        for e in info.get("errors", []):
            notes.append(f"{model}: {e['section']}: {e['error']}")
    for r in results.get("mlps", []):
        for e in r.get("errors", []):
            notes.append(f"{r['model']}: {e['section']}: {e['error']}")
    for e in results.get("errors", []):
        notes.append(f"{e['section']}: {e['error']}")
    if notes:
        parts += ["", *(f"- {n}" for n in notes)]
    return "\n".join(parts)


def merge_results(parts: Sequence[dict]) -> dict:
    """Several runs' results as one (the first run's meta, the union of their modes)."""
    merged: dict[str, Any] = {"meta": {}, "steps": [], "mlps": [], "models": {}, "errors": []}
    modes: list[str] = []
    for part in parts:
        merged["meta"] = merged["meta"] or dict(part.get("meta", {}))
        modes += part.get("meta", {}).get("modes", [])
        for key in ("steps", "mlps", "errors"):
            merged[key] += part.get(key, [])
        merged["models"].update(part.get("models", {}))
    merged["meta"]["modes"] = list(dict.fromkeys(modes))
    add_speedups(merged["steps"])
    return merged


def write_json(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
