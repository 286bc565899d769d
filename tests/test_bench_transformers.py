"""scripts/bench_transformers.py without a GPU: arguments, the model builder on small sizes,
the repeatable decode step, the report of a fake result, the kernel list, and the whole run
on the CPU with CUDA's timing calls faked (every GPU-only section must fail into the report,
not out of the script)."""

from __future__ import annotations

import json
import time
import types

import pytest
import torch
from conftest import load_script

bench = load_script("bench_transformers")
transformers = pytest.importorskip("transformers")

# Small sizes (multiples of 128) for the CPU: hidden, dense intermediate, shared intermediate.
SMALL = (256, 512, 128)
ROUTED = [
    "model.layers.0.mlp",
    "model.layers.1.mlp.shared_experts",
    "model.layers.2.mlp.shared_experts",
]
MLP_CLASSES = {"deepseek_v3": "DeepseekV3MLP", "glm_moe_dsa": "GlmMoeDsaMLP"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one CPU thread is fastest (several compete with each other and with any
    other load on the machine: 100x slower steps were seen with 2 threads on 2 cores)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module", params=list(bench.ARCHS))
def pair(request):
    """(arch, fp8 model, bf16 model) on the CPU at SMALL sizes."""
    fp8, bf16 = bench.build_pair(request.param, *SMALL, device="cpu")
    return request.param, fp8, bf16


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


# ---- kernels --------------------------------------------------------------------------------


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


def test_gpu_requests_include_the_benchmark() -> None:
    gpu_requests = load_script("gpu_requests")
    assert gpu_requests.REPO / "scripts" / "bench_transformers.py" in gpu_requests.SOURCES
    listed = gpu_requests.requests("sm_90a")
    assert all(r in listed for r in bench.kernel_requests("sm_90a"))


# ---- the models -----------------------------------------------------------------------------


def test_the_builder_makes_the_architecture_with_the_asked_sizes(pair) -> None:
    arch, fp8, bf16 = pair
    hidden, dense, shared = SMALL
    assert type(bf16).__name__ == bench.ARCHS[arch][1]
    assert bf16.config.num_hidden_layers == 3 and bf16.config.vocab_size == 1024
    for model in (fp8, bf16):
        for name, inter in zip(ROUTED, (dense, shared, shared), strict=True):
            module = model.get_submodule(name)
            assert type(module).__name__ == MLP_CLASSES[arch]
            assert tuple(module.gate_proj.weight.shape) == (inter, hidden)
            assert tuple(module.up_proj.weight.shape) == (inter, hidden)
            assert tuple(module.down_proj.weight.shape) == (hidden, inter)
        assert type(model.model.layers[1].mlp).__name__.endswith("MoE")
    assert bench.routed_prefixes() == ROUTED


def test_only_the_routed_mlps_are_fp8(pair) -> None:
    _, fp8, bf16 = pair
    assert bench.fp8_linears(fp8) == [f"{p}.{proj}" for p in ROUTED for proj in bench.PROJS]
    assert bench.fp8_linears(bf16) == []
    down = fp8.get_submodule(f"{ROUTED[0]}.down_proj")
    assert tuple(down.weight_scale_inv.shape) == (SMALL[0] // 128, SMALL[1] // 128)
    assert down.weight_scale_inv.dtype == torch.float32
    # everything else keeps the same bf16 values in both models
    assert fp8.model.layers[1].mlp.experts.down_proj.dtype == torch.bfloat16
    assert torch.equal(fp8.lm_head.weight, bf16.lm_head.weight)
    assert torch.equal(
        fp8.model.layers[0].self_attn.o_proj.weight, bf16.model.layers[0].self_attn.o_proj.weight
    )


def test_the_bf16_model_holds_the_fp8_weights_dequantized(pair) -> None:
    from mlpjit import reference as ref

    _, fp8, bf16 = pair
    for name in bench.fp8_linears(fp8):
        q = fp8.get_submodule(name)
        want = ref.dequantize_weight(q.weight, q.weight_scale_inv.float()).to(torch.bfloat16)
        assert torch.equal(bf16.get_submodule(name).weight, want), name


def test_apply_routes_the_dense_mlps_and_shared_experts(pair) -> None:
    from mlpjit.integrations import transformers as mlpjit_hf

    _, fp8, _ = pair
    try:
        assert mlpjit_hf.apply(fp8, bench.DECODE_TOKENS) == ROUTED
    finally:
        mlpjit_hf.remove(fp8)


def test_step_bytes_count_fp8_where_converted(pair) -> None:
    _, fp8, bf16 = pair
    saved = 0
    for name in bench.fp8_linears(fp8):
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


# ---- the decode step ------------------------------------------------------------------------


def test_a_step_repeats_and_matches_a_cache_free_forward(pair) -> None:
    _, fp8, bf16 = pair
    context = 12
    step = bench.DecodeStep(bf16, context)
    assert step.counters, "static cache counters found"
    first = step()
    assert all(int(getattr(layer, a)) == context + 1 for layer, a in step.counters)
    for _ in range(bench.CACHE_SLACK + 1):  # more steps than the cache has spare slots
        again = step()
    assert torch.equal(first, again)
    assert first.shape == (1, 1, 1024)
    assert bench.rel_l2(first, bench.full_logits(step)) < 1e-2
    step.rewind()
    assert all(int(getattr(layer, a)) == context for layer, a in step.counters)
    # without the rewind the counters run past the cache: the rewind is what repeats a step
    with pytest.raises((IndexError, RuntimeError)):
        for _ in range(bench.CACHE_SLACK + 1):
            step.run()
    # the routed FP8 model's step (DenseMlp's reference math on the CPU) differs from bf16's
    # by FP8 rounding only
    from mlpjit.integrations import transformers as mlpjit_hf

    mlpjit_hf.apply(fp8, bench.DECODE_TOKENS)
    try:
        err = bench.rel_l2(bench.DecodeStep(fp8, context)(), first)
    finally:
        mlpjit_hf.remove(fp8)
    assert 0 < err < 0.3


# ---- report ---------------------------------------------------------------------------------


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
    bench.add_speedups(results["steps"])
    mlpjit_graph = results["steps"][3]
    assert mlpjit_graph["speedup_vs_bf16"] == pytest.approx(400 / 320)
    text = bench.markdown_report(results)
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
    bench.write_json(results, path)
    assert json.loads(path.read_text()) == results


def test_report_from_merges_saved_runs(tmp_path, capsys) -> None:
    """One run per model (each within a time limit), reported as one."""
    results = fake_results()
    first = {**results, "steps": results["steps"][:4], "models": {"glm5-tp8": {"errors": []}}}
    second = {**results, "steps": results["steps"][4:], "mlps": [], "models": {}}
    second["meta"] = {"modes": ["eager", "graph", "compiled"]}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, part in zip(paths, (first, second), strict=True):
        bench.write_json(part, path)
    assert bench.main(["--report-from", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert "| glm5-tp8 | 64 | mlpjit | 2500.0 | 1.20x | 320.0 | 1.25x | - | - |" in out
    assert "| dsv3-tp8 | 64 | bf16 | 3100.0 | - | failed | - | 500.0 | - |" in out
    assert out.count("| glm5-tp8 | shared expert |") == 1
    with pytest.raises(SystemExit):
        bench.parse_args(["--report-from", str(tmp_path / "missing.json")])


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
