"""mlpjit/bench/transformers_report.py: the report of a fake result, its JSON, and saved runs
merged (through the benchmark's --report-from)."""

from __future__ import annotations

import json

import pytest

from mlpjit.bench import transformers_bench, transformers_report


def fake_results() -> dict:
    steps = [
        {"model": "glm5-tp8", "context": 64, "variant": "bf16", "mode": "eager", "step_us": 3000.0,
         "floor_us": 20.0, "floor_ratio": 150.0},
        {"model": "glm5-tp8", "context": 64, "variant": "bf16", "mode": "graph", "step_us": 400.0,
         "floor_us": 20.0, "floor_ratio": 20.0},
        {"model": "glm5-tp8", "context": 64, "variant": "mlpjit", "mode": "eager",
         "step_us": 2500.0, "floor_us": 12.5, "floor_ratio": 200.0,
         "logits_rel_l2_vs_bf16": 0.012},
        {"model": "glm5-tp8", "context": 64, "variant": "mlpjit", "mode": "graph",
         "step_us": 320.0, "floor_us": 12.5, "floor_ratio": 25.6,
         "logits_rel_l2_vs_bf16": 0.013},
        {"model": "dsv3-tp8", "context": 64, "variant": "bf16", "mode": "eager", "step_us": 3100.0,
         "floor_us": 22.0, "floor_ratio": 140.9},
        {"model": "dsv3-tp8", "context": 64, "variant": "bf16", "mode": "graph",
         "error": "RuntimeError: capture failed"},
        {"model": "dsv3-tp8", "context": 64, "variant": "bf16", "mode": "compiled",
         "step_us": 500.0, "floor_us": 22.0, "floor_ratio": 22.7},
    ]  # fmt: skip
    mlps = [
        {"model": "glm5-tp8", "module": "dense mlp", "hidden": 6144, "intermediate": 1536,
         "count": 1, "path": "kernel", "mlpjit_us": 10.0, "bf16_us": 27.0, "floor_us": 6.7,
         "floor_ratio": 1.49, "speedup_vs_bf16": 2.7},
        {"model": "glm5-tp8", "module": "shared expert", "hidden": 6144, "intermediate": 256,
         "count": 2, "path": "stock", "mlpjit_us": 40.0, "bf16_us": 8.0, "floor_us": 1.2,
         "floor_ratio": 33.3, "speedup_vs_bf16": 0.2},
    ]  # fmt: skip
    models = {
        "glm5-tp8": {"hf_fp8": "not available: ImportError: no kernels", "errors": []},
        "dsv3-tp8": {"errors": [{"section": "dsv3-tp8 ctx=64 bf16 graph", "error": "boom"}]},
    }
    meta = {"modes": ["eager", "graph"], "copy_bandwidth_gbs": 4200.0}
    return {"meta": meta, "steps": steps, "mlps": mlps, "models": models, "errors": []}


def test_markdown_report_of_a_fake_result() -> None:
    results = fake_results()
    transformers_report.add_speedups(results["steps"])
    mlpjit_graph = results["steps"][3]
    assert mlpjit_graph["speedup_vs_bf16"] == pytest.approx(400 / 320)
    text = transformers_report.markdown_report(results)
    lines = text.splitlines()
    tables = [line for line in lines if line.startswith("|")]
    head = tables[0]
    assert head == (
        "| model | context | variant | eager us | eager vs bf16 | graph us | graph vs bf16 | "
        "compiled us | compiled vs bf16 | floor us | best x floor | logits rel_l2 vs bf16 |"
    )
    width = head.count("|")
    step_rows = tables[: tables.index(next(t for t in tables if t.startswith("| model | module")))]
    assert all(row.count("|") == width for row in step_rows)
    assert (
        "| glm5-tp8 | 64 | mlpjit | 2500.0 | 1.20x | 320.0 | 1.25x | - | - | 12.5 | 25.60 "
        "| 1.30e-02 |" in lines
    )
    assert (
        "| dsv3-tp8 | 64 | bf16 | 3100.0 | - | failed | - | 500.0 | - | 22.0 | 22.70 | - |" in lines
    )
    assert "| glm5-tp8 | - | hf_fp8 | not available (see below) | | | | | | | | |" in lines
    assert (
        "- glm5-tp8: transformers' FP8 path (hf_fp8): not available: ImportError: no kernels"
        in lines
    )
    assert (
        "| glm5-tp8 | shared expert | 6144 | 256 | 2 | stock | 40.00 | 8.00 | 0.20x | 1.20 "
        "| 33.30 |" in lines
    )
    assert (
        "- glm5-tp8: routed MLPs per step 90.0 us (mlpjit) vs 43.0 us (bf16), "
        "from the per-MLP table" in lines
    )
    assert "- copy bandwidth (floors): 4.20 TB/s" in lines
    assert "- dsv3-tp8: dsv3-tp8 ctx=64 bf16 graph: boom" in lines


def test_json_round_trip(tmp_path) -> None:
    results = fake_results()
    path = tmp_path / "out" / "r.json"
    transformers_report.write_json(results, path)
    assert json.loads(path.read_text()) == results


def test_report_from_merges_saved_runs(tmp_path, capsys) -> None:
    """One run per model (each within a time limit), reported as one."""
    results = fake_results()
    first = {**results, "steps": results["steps"][:4], "models": {"glm5-tp8": {"errors": []}}}
    second = {**results, "steps": results["steps"][4:], "mlps": [], "models": {}}
    second["meta"] = {"modes": ["eager", "graph", "compiled"]}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, part in zip(paths, (first, second), strict=True):
        transformers_report.write_json(part, path)
    assert transformers_bench.main(["--report-from", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert "| glm5-tp8 | 64 | mlpjit | 2500.0 | 1.20x | 320.0 | 1.25x | - | - |" in out
    assert "| dsv3-tp8 | 64 | bf16 | 3100.0 | - | failed | - | 500.0 | - |" in out
    assert out.count("| glm5-tp8 | shared expert |") == 1
    with pytest.raises(SystemExit):
        transformers_bench.parse_args(["--report-from", str(tmp_path / "missing.json")])
