"""mlpjit/bench/transformers_bench.py without a GPU: arguments, the dry run, the kernel list,
the step's weight bytes, the guarded sections, and the whole run on the CPU with CUDA's
timing calls faked (every GPU-only section must fail into the report, not out of the run)."""

from __future__ import annotations

import json
import time
import types

import pytest
import tiny_pairs
import torch
from tiny_pairs import SMALL

from mlpjit.bench import transformers_bench as bench
from mlpjit.testing.tiny_models import ROUTED, fp8_linears

transformers = pytest.importorskip("transformers")

# the shared fixtures: one CPU thread (autouse) and the (arch, fp8, bf16) models
one_thread, pair = tiny_pairs.one_thread, tiny_pairs.pair


# ---- arguments ------------------------------------------------------------------------------


def test_defaults() -> None:
    args = bench.parse_args([])
    assert args.model_list == ["glm5-tp8", "glm5-tp1", "dsv3-tp8", "dsv3-tp1"]
    assert args.context_list == [64] and args.steps == 100 and args.json is None
    assert args.mode_list == ["eager", "graph"] and args.variant_list == list(bench.VARIANTS)


def test_options_parse(tmp_path) -> None:
    args = bench.parse_args(
        [
            "--models", "dsv3-tp8,glm5-tp8", "--tokens-context", "16,512,16", "--steps", "7",
            "--modes", "graph,compiled", "--json", str(tmp_path / "r.json"),
        ]
    )  # fmt: skip
    assert args.model_list == ["dsv3-tp8", "glm5-tp8"]
    assert args.context_list == [16, 512]  # duplicates dropped, order kept
    assert args.steps == 7 and args.mode_list == ["graph", "compiled"]
    assert args.json == tmp_path / "r.json"
    assert bench.positions_for(args.context_list) == 640  # 512 + 8 slack, rounded up to 128


@pytest.mark.parametrize(
    "argv",
    [
        ["--models", "glm6-tp8"],
        ["--models", ","],
        ["--tokens-context", "8"],  # a prefill this short would need unprepared kernels
        ["--tokens-context", "a"],
        ["--steps", "0"],
        ["--warmup", "-1"],
        ["--modes", "jit"],
        ["--variants", "int4"],
        ["--l2-multiple", "0"],
    ],
)
def test_bad_arguments_exit(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def test_dry_run_plans_every_model(capsys) -> None:
    from mlpjit.dense_mlp import kernel_supported

    assert bench.main(["--dry-run"]) == 0
    out = capsys.readouterr().out

    def path(hidden: int, inter: int) -> str:
        return "kernel" if kernel_supported(hidden, inter, 1) else "stock"

    for name, (arch, hidden, dense, shared) in bench.MODELS.items():
        assert (
            f"{name}: {arch}; dense mlp {hidden}x{dense} x1 ({path(hidden, dense)}), "
            f"shared expert {hidden}x{shared} x2 ({path(hidden, shared)})"
        ) in out
    assert f"kernels needed: {len(bench.kernel_requests('sm_90a'))}" in out


# ---- kernels and bytes ----------------------------------------------------------------------


def test_kernel_requests_are_the_decode_kernels_of_the_kernel_shapes() -> None:
    from mlpjit.dense_mlp import kernel_supported

    requests = bench.kernel_requests("sm_90a")
    assert requests, "at least GLM-5's shards take the kernels"
    assert all(r.params["tokens"] == 1 for r in requests)
    assert all(not r.params["ue8m0"] and r.params["limit"] is None for r in requests)
    # gate_up [2*inter, hidden] and down [hidden, inter] of every routed shape the kernels take
    shapes = {(h, i) for _, h, d, s in bench.MODELS.values() for i in (d, s)}
    assert (6144, 1536) in shapes and (7168, 18432) in shapes and len(shapes) == 8
    wanted = {x for h, i in shapes if kernel_supported(h, i, 1) for x in ((2 * i, h), (h, i))}
    assert {(r.params["rows"], r.params["k"]) for r in requests} == wanted
    assert len(requests) == len(set(map(repr, requests)))  # no duplicates


def test_step_bytes_count_fp8_where_converted(pair) -> None:
    _, fp8, bf16 = pair
    saved = 0
    for name in fp8_linears(fp8):
        n, k = fp8.get_submodule(name).weight.shape
        saved += 2 * n * k - (n * k + 4 * (n // 128) * (k // 128))  # bf16 -> e4m3 + scales
    assert bench.step_bytes(bf16) - bench.step_bytes(fp8) == saved
    config = bf16.config
    experts = sum(p.numel() * 2 for p in bf16.model.layers[1].mlp.experts.parameters())
    embed = bf16.model.embed_tokens.weight
    everything = sum(p.numel() * 2 for p in bf16.parameters())
    # top-k of the routed experts, one row of the embedding
    skipped = 2 * experts * (1 - config.num_experts_per_tok / config.n_routed_experts)
    skipped += (embed.numel() - embed.shape[1]) * 2
    assert bench.step_bytes(bf16) == int(everything - skipped)


def test_attempt_records_the_error_and_goes_on(capsys) -> None:
    errors: list[dict] = []
    assert bench.attempt("section", errors, lambda: 1 / 0) is None
    assert errors == [{"section": "section", "error": "ZeroDivisionError: division by zero"}]
    assert "section: FAILED" in capsys.readouterr().err
    assert bench.attempt("ok", errors, lambda x: x + 1, 1) == 2 and len(errors) == 1


# ---- the whole run on the CPU ---------------------------------------------------------------


class FakeEvent:
    """torch.cuda.Event on the host clock."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1e3


def test_a_whole_run_on_the_cpu_reports_what_failed(monkeypatch, tmp_path, capsys) -> None:
    """The models on the CPU, CUDA events faked: eager steps are measured; graphs, the MLP
    chains and transformers' FP8 kernel cannot run here and must show up as failures."""
    import mlpjit.testing.layers as layers

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "MODELS", {"tiny-dsv3": ("deepseek_v3", *SMALL)})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    props = types.SimpleNamespace(name="FakeGPU", L2_cache_size=1 << 20)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    monkeypatch.setattr(layers, "copy_bandwidth", lambda *a, **k: 4e12)
    path = tmp_path / "r.json"
    argv = [
        "--models", "tiny-dsv3", "--tokens-context", "10", "--steps", "2", "--warmup", "1",
        "--modes", "eager,graph", "--no-compile-fallback", "--mlp-replays", "2",
        "--json", str(path),
    ]  # fmt: skip
    assert bench.main(argv) == 0
    results = json.loads(path.read_text())
    rows = {(r["variant"], r["mode"]): r for r in results["steps"]}
    assert set(rows) == {
        ("bf16", "eager"),
        ("bf16", "graph"),
        ("mlpjit", "eager"),
        ("mlpjit", "graph"),
    }
    for variant in ("bf16", "mlpjit"):
        eager = rows[(variant, "eager")]
        assert eager["step_us"] > 0 and eager["floor_us"] == pytest.approx(
            results["models"]["tiny-dsv3"]["step_bytes"][variant] / 4e12 * 1e6
        )
        assert "error" in rows[(variant, "graph")]
    assert 0 < rows[("mlpjit", "eager")]["logits_rel_l2_vs_bf16"] < 0.3
    assert "speedup_vs_bf16" in rows[("mlpjit", "eager")]
    info = results["models"]["tiny-dsv3"]
    assert info["routed"] == ROUTED
    assert info["hf_fp8"].startswith("not available: ")
    assert {e["section"] for e in info["errors"]} == {
        "tiny-dsv3 ctx=10 bf16 graph",
        "tiny-dsv3 ctx=10 mlpjit graph",
    }
    assert [m["module"] for m in results["mlps"]] == ["dense mlp", "shared expert"]
    assert all("mlpjit_us" not in m and len(m["errors"]) == 2 for m in results["mlps"])
    captured = capsys.readouterr()
    assert "| tiny-dsv3 | 10 | mlpjit | " in captured.out
    assert "tiny-dsv3: transformers' FP8 path (hf_fp8): not available: " in captured.out
    assert "| tiny-dsv3 | 10 | bf16 | " in captured.out and "| failed |" in captured.out
    assert "- tiny-dsv3: mlp 256x512 mlpjit: " in captured.out  # the chains need CUDA graphs
    assert "tiny-dsv3 ctx=10 mlpjit eager" in captured.err  # progress on stderr
