"""mlpjit.integrations.transformers on real transformers models (DeepSeek-V3, GLM-5), CPU.

The models are transformers' own classes built from tiny configs (3 layers: one dense, two
MoE with a shared expert each), in bf16, whose dense MLPs and shared experts are converted to
FP8 the way FineGrainedFP8Config does it: ``replace_with_fp8_linear`` swaps in FP8Linear
modules and ``Fp8Quantize`` (transformers' quantizer) makes each weight and its 128x128
weight_scale_inv. Attention, routers, routed experts and lm_head stay bf16.

FP8Linear's forward dispatches to DeepGEMM or a Triton kernel fetched from the Hugging Face
Hub; neither runs on a CPU, so ``fp8_reference`` gives FP8Linear that kernel's math in
mlpjit.reference (per-token 128-group activation quantization with amax/448 scales, the
block-scaled GEMM, bf16 out). The unpatched model is then "transformers' FP8 model" here.
"""

from __future__ import annotations

import logging
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.integrations import finegrained_fp8 as tf_fp8  # noqa: E402

from mlpjit import DenseMlp  # noqa: E402
from mlpjit import reference as ref  # noqa: E402
from mlpjit.integrations import transformers as mlpjit_hf  # noqa: E402

# What FineGrainedFP8Config(modules_to_not_convert=...) leaves in bf16: all but the dense
# MLPs and shared experts (their routed experts need the Hub kernel even on a GPU).
NOT_CONVERTED = ["lm_head", r".*self_attn", r".*mlp\.gate", r".*mlp\.experts"]
ROUTED = [
    "model.layers.0.mlp",
    "model.layers.1.mlp.shared_experts",
    "model.layers.2.mlp.shared_experts",
]
HIDDEN = 512
TINY = {
    "vocab_size": 256,
    "hidden_size": HIDDEN,
    "intermediate_size": 1024,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 64,
    "q_lora_rank": 128,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "max_position_embeddings": 128,
}
ARCHS = {
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {"n_group": 1, "topk_group": 1}),
    # index_topk = max_position_embeddings: the DSA indexer keeps every key. With a smaller
    # top-k, transformers' own (unpatched) GLM-5 gives prefill logits up to ~1.0 apart
    # between a static and a dynamic cache (the top-k runs over the static cache's unfilled
    # slots too), and its discrete choice flips on any rounding difference: that would test
    # the indexer, not the MLPs.
    "glm_moe_dsa": (
        "GlmMoeDsaConfig",
        "GlmMoeDsaForCausalLM",
        {"index_topk": 128, "index_head_dim": 32, "index_n_heads": 2},
    ),
}
# Routed module vs its FP8Linear math: they differ only in SwiGLU rounding (the module
# rounds silu(gate) to bf16 before the product, DenseMlp rounds once): one bf16 ulp on about
# a quarter of act's elements (measured), which act's e4m3 quantization (a step is 8-16 bf16
# ulps) turns into a full e4m3 step on the ~1/20 of those it pushes across a rounding
# boundary: sqrt(0.27/20) x ~0.09 ~ 1% relative L2. Measured 1.3-1.6%; 3e-2 leaves 2x room.
MODULE_TOL = 3e-2


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def fp8_linear_reference(
    input, weight, weight_scale_inv, block_size=None, bias=None, activation_scale=None, *_
):
    """transformers' fp8_linear (DeepGEMM / Hub Triton kernel) in mlpjit.reference math."""
    x = input.reshape(-1, input.shape[-1]).to(torch.bfloat16)
    y = ref.gemv_reference(x, weight, weight_scale_inv.float(), swiglu=False, ue8m0=False)
    return y.to(input.dtype).reshape(*input.shape[:-1], weight.shape[0])


def dequantized_linear(input, weight, weight_scale_inv, *_):
    """The exact math FP8 approximates: bf16 x times the dequantized weight (in bf16)."""
    w = ref.dequantize_weight(weight, weight_scale_inv.float()).to(torch.bfloat16)
    return torch.nn.functional.linear(input, w)


@pytest.fixture(autouse=True)
def fp8_reference(monkeypatch):
    """FP8Linear's forward looks fp8_linear up in its module: give it the reference."""
    monkeypatch.setattr(tf_fp8, "fp8_linear", fp8_linear_reference)


def mlp_weight(name: str, shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """A random bf16 MLP weight sized so that, for unit-RMS input (what the RMSNorm before
    each MLP gives), gate and up come out with std ~2 and down's output ~1 (act =
    silu(gate) * up has std ~3): the MLPs matter in the residual stream, nothing saturates."""
    n, k = shape
    std = 1 / (3 * k**0.5) if name.endswith("down_proj") else 2 / k**0.5
    return (torch.randn(shape, generator=gen) * std).to(torch.bfloat16)


def to_fp8(model: torch.nn.Module, **config: object) -> torch.nn.Module:
    """Convert the dense MLPs and shared experts to FP8Linear as FineGrainedFP8Config does:
    transformers' replace_with_fp8_linear, then its Fp8Quantize on each bf16 weight."""
    quant = transformers.FineGrainedFP8Config(modules_to_not_convert=NOT_CONVERTED, **config)
    bf16 = {n: m.weight.detach() for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    tf_fp8.replace_with_fp8_linear(
        model, modules_to_not_convert=quant.modules_to_not_convert, quantization_config=quant
    )
    quantizer = tf_fp8.Fp8Quantize(types.SimpleNamespace(quantization_config=quant))
    gen = torch.Generator().manual_seed(2)
    for name, module in model.named_modules():
        if isinstance(module, tf_fp8.FP8Linear):
            weight = mlp_weight(name, tuple(bf16[name].shape), gen)
            tensors = quantizer.convert({f"{name}.weight": weight})
            for attr in ("weight", "weight_scale_inv"):
                value = tensors[f"{name}.{attr}"]
                setattr(module, attr, torch.nn.Parameter(value, requires_grad=False))
    model.config.quantization_config = quant  # as from_pretrained leaves it
    return model


def tiny_model(arch: str, fp8: bool = True, **changes: object) -> torch.nn.Module:
    """A transformers model of ``arch`` from the tiny config, bf16, eval, seeded."""
    config_cls, model_cls, extra = ARCHS[arch]
    config = getattr(transformers, config_cls)(**{**TINY, **extra, **changes})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.bfloat16).eval()
    return to_fp8(model) if fp8 else model


@pytest.fixture(params=list(ARCHS))
def model(request) -> torch.nn.Module:
    return tiny_model(request.param)


def x_like(m: int, seq: int = 1, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, seq, HIDDEN, generator=gen).to(torch.bfloat16)


def merged_layer(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's weights as DenseMlp's arguments (copies, for the reference)."""
    gate, up, down = module.gate_proj, module.up_proj, module.down_proj
    return {
        "w13": torch.cat((gate.weight.detach(), up.weight.detach())),
        "w13_scale": torch.cat((gate.weight_scale_inv.detach(), up.weight_scale_inv.detach())),
        "w2": down.weight.detach(),
        "w2_scale": down.weight_scale_inv.detach(),
    }


# ---- what it finds --------------------------------------------------------------------------


def test_glm5_model_is_in_this_transformers() -> None:
    assert hasattr(transformers, "GlmMoeDsaForCausalLM"), transformers.__version__


def test_apply_finds_the_dense_mlps_and_shared_experts(model) -> None:
    assert mlpjit_hf.apply(model) == ROUTED
    assert mlpjit_hf.routed(model) == ROUTED
    assert mlpjit_hf.apply(model) == ROUTED  # idempotent: nothing wrapped twice
    assert all(isinstance(model.get_submodule(n).forward.__self__.mlp, DenseMlp) for n in ROUTED)
    assert mlpjit_hf.remove(model) == ROUTED
    assert mlpjit_hf.routed(model) == []


def test_a_bf16_model_has_nothing_to_route(caplog) -> None:
    model = tiny_model("deepseek_v3", fp8=False)
    with caplog.at_level(logging.WARNING, logger="mlpjit.integrations.transformers"):
        assert mlpjit_hf.apply(model) == []
    assert len(caplog.records) == 3
    assert "model.layers.0.mlp" in caplog.text and "not a float8_e4m3fn weight" in caplog.text


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("gelu", "act_fn is GELUActivation, not SiLU"),
        ("bias", "down_proj has a bias"),
        ("static", "up_proj uses a static activation scale (DenseMlp quantizes per token group)"),
        ("block", "gate_proj.block_size is (64, 64), not (128, 128)"),
    ],
)
def test_modules_that_do_not_qualify_are_skipped_with_a_reason(caplog, change, reason) -> None:
    model = tiny_model("deepseek_v3")
    shared = model.get_submodule(ROUTED[1])
    if change == "gelu":
        shared.act_fn = transformers.activations.ACT2FN["gelu"]
    elif change == "bias":
        shared.down_proj.bias = torch.nn.Parameter(torch.zeros(HIDDEN, dtype=torch.bfloat16))
    elif change == "static":
        shared.up_proj.activation_scale = torch.nn.Parameter(torch.tensor(1.0))
    else:  # 128x128 scales, but the module says 64x64: trust neither, refuse
        shared.gate_proj.block_size = (64, 64)
    with caplog.at_level(logging.WARNING, logger="mlpjit.integrations.transformers"):
        assert mlpjit_hf.apply(model) == [ROUTED[0], ROUTED[2]]
    assert [r.getMessage() for r in caplog.records] == [
        f"mlpjit: not routing {ROUTED[1]} to DenseMlp: {reason}"
    ]


def test_a_64x64_block_fp8_model_is_skipped(caplog) -> None:
    model = to_fp8(tiny_model("deepseek_v3", fp8=False), weight_block_size=(64, 64))
    with caplog.at_level(logging.WARNING, logger="mlpjit.integrations.transformers"):
        assert mlpjit_hf.apply(model) == []
    assert caplog.text.count("block_size is (64, 64), not (128, 128)") == 3


# ---- numbers --------------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (2, 3), (3, 4)])
def test_routed_modules_compute_dense_mlp(model, batch: int, seq: int) -> None:
    """Each routed module equals mlpjit.reference on its weights exactly (DenseMlp's CPU
    path), and its unpatched FP8 math within MODULE_TOL; 1-8 and more tokens."""
    x = x_like(batch, seq)
    before = {n: model.get_submodule(n)(x) for n in ROUTED}
    mlpjit_hf.apply(model)
    for name in ROUTED:
        module = model.get_submodule(name)
        got = module(x)
        want = ref.dense_mlp_reference(x.reshape(-1, HIDDEN), **merged_layer(module), ue8m0=False)
        assert got.shape == x.shape and got.dtype == torch.bfloat16
        assert torch.equal(got, want.reshape(x.shape)), name
        assert rel_l2(got, before[name]) < MODULE_TOL, name


def test_parameters_are_the_modules_own(model) -> None:
    """No copies kept: DenseMlp reads the modules' parameters (gate and up as the halves of
    one storage), the same Parameter objects with the same values."""
    module = model.get_submodule(ROUTED[0])
    params = dict(module.named_parameters())
    values = {k: v.detach().clone() for k, v in params.items()}
    mlpjit_hf.apply(model)
    assert dict(module.named_parameters()) == params  # same objects
    for key, value in module.named_parameters():
        assert torch.equal(value.view(torch.uint8), values[key].view(torch.uint8)), key
    mlp = module.__dict__["_mlpjit_route"].mlp
    assert isinstance(mlp, DenseMlp)
    assert mlp.w13.data_ptr() == module.gate_proj.weight.data_ptr()
    assert module.up_proj.weight.data_ptr() == mlp.w13.data_ptr() + module.gate_proj.weight.numel()
    assert mlp.w2.data_ptr() == module.down_proj.weight.data_ptr()
    assert mlp.w2_scale.data_ptr() == module.down_proj.weight_scale_inv.data_ptr()


def test_remove_restores_the_modules(model) -> None:
    x = x_like(2, 5)
    ids = torch.arange(8).reshape(1, 8)
    before = logits_of(model, ids)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    mlpjit_hf.apply(model)
    assert all("forward" in model.get_submodule(n).__dict__ for n in ROUTED)
    pointers = [model.get_submodule(n).gate_proj.weight.data_ptr() for n in ROUTED]
    mlpjit_hf.remove(model)
    for name in ROUTED:
        module = model.get_submodule(name)
        assert "forward" not in module.__dict__ and "_mlpjit_route" not in module.__dict__
        assert module.forward.__func__ is type(module).forward
    assert torch.equal(logits_of(model, ids), before)
    for key, value in model.state_dict().items():
        assert torch.equal(value.view(torch.uint8), state[key].view(torch.uint8)), key
    # a second apply() finds gate and up adjacent already and copies nothing
    mlpjit_hf.apply(model)
    assert [model.get_submodule(n).gate_proj.weight.data_ptr() for n in ROUTED] == pointers
    assert model.get_submodule(ROUTED[0])(x).shape == x.shape


def test_remove_keeps_an_instance_forward_that_was_there() -> None:
    model = tiny_model("deepseek_v3")
    module = model.get_submodule(ROUTED[0])
    own = module.forward  # a bound method stored on the instance, as wrappers do
    module.forward = own
    mlpjit_hf.apply(model)
    assert module.forward is not own
    mlpjit_hf.remove(model)
    assert module.__dict__["forward"] is own


def test_apply_is_all_or_nothing() -> None:
    """A bad weight scale in the last module: ValueError, and no module routed."""
    model = tiny_model("deepseek_v3")
    model.get_submodule(ROUTED[2]).down_proj.weight_scale_inv.data[0, 0] = float("nan")
    with pytest.raises(ValueError, match="down_proj.weight_scale_inv has 1 NaN"):
        mlpjit_hf.apply(model)
    assert mlpjit_hf.routed(model) == []


def test_weights_replaced_after_apply_raise(model) -> None:
    mlpjit_hf.apply(model)
    module = model.get_submodule(ROUTED[0])
    module.down_proj.weight.data = module.down_proj.weight.data.clone()
    with pytest.raises(RuntimeError, match="call remove"):
        module(x_like(1))


def test_e8m0_scales() -> None:
    """scale_fmt='ue8m0' (float8_e8m0fnu weight_scale_inv): routed, same numbers as the
    reference on float32 copies of the scales."""
    model = to_fp8(tiny_model("deepseek_v3", fp8=False), scale_fmt="ue8m0")
    module = model.get_submodule(ROUTED[1])
    assert module.gate_proj.weight_scale_inv.dtype == torch.float8_e8m0fnu
    assert mlpjit_hf.apply(model) == ROUTED
    x = x_like(3)
    layer = {k: v.float() if "scale" in k else v for k, v in merged_layer(module).items()}
    want = ref.dense_mlp_reference(x.reshape(-1, HIDDEN), **layer, ue8m0=True)
    assert torch.equal(module(x), want.reshape(x.shape))


# ---- inside generate() and torch.compile ------------------------------------------------------


def logits_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def check_tokens(model, got: torch.Tensor, want: torch.Tensor) -> None:
    """Greedy tokens agree, or the first mismatch is a near-tie FP8 rounding explains: the
    reference's top-2 logit gap there is below twice the routed model's largest logit error
    at that position (a flip needs the gap to be within the two logits' errors)."""
    if torch.equal(got, want):
        return
    t = int((got != want).nonzero()[0, 1])
    ids = want[:, :t]
    ref_logits = logits_of(model, ids)[0, -1]
    mlpjit_hf.apply(model)
    routed_logits = logits_of(model, ids)[0, -1]
    mlpjit_hf.remove(model)
    gap = float(ref_logits.topk(2).values.diff().abs())
    err = float((routed_logits - ref_logits).abs().max())
    assert gap <= 2 * err, f"token {t}: top-2 gap {gap:.4g} > 2 x logit error {err:.4g}"


@pytest.mark.parametrize("cache", [None, "static"])
def test_generate(model, monkeypatch, cache) -> None:
    """Greedy generate() with the routed model matches the unpatched FP8 model, and every
    call of the routed modules ran DenseMlp (prefill 5 tokens, then 1 per step)."""
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    kw = {"max_new_tokens": 6, "do_sample": False, "cache_implementation": cache}
    with torch.no_grad():
        want = model.generate(ids, **kw)
    calls = []
    real_call = DenseMlp.__call__

    def counting(self, x, out=None):
        calls.append(x.shape[0])
        return real_call(self, x, out)

    monkeypatch.setattr(DenseMlp, "__call__", counting)
    mlpjit_hf.apply(model)
    with torch.no_grad():
        got = model.generate(ids, **kw)
    assert calls == [5] * 3 + [1] * 3 * 5
    mlpjit_hf.remove(model)
    check_tokens(model, got, want)


def test_logits_are_as_close_to_exact_math_as_transformers_fp8(model, monkeypatch) -> None:
    """Model logits: the routed model is about as far from the exact math (the FP8 weights
    dequantized to bf16) as transformers' FP8 model is (measured 7.9-8.6% against 7.5-8.5%:
    both are the same FP8 approximation, rounded differently; 1.15x allowed), and the two
    FP8 models differ by less than either differs from the exact math (measured 5.6-5.9%:
    the per-module differences above, grown through three layers and the routers' top-k)."""
    ids = torch.tensor([[3, 14, 15, 92, 65, 200, 144, 92, 134, 12]])
    fp8 = logits_of(model, ids)
    mlpjit_hf.apply(model)
    routed = logits_of(model, ids)
    mlpjit_hf.remove(model)
    monkeypatch.setattr(tf_fp8, "fp8_linear", dequantized_linear)
    exact = logits_of(model, ids)
    fp8_error = rel_l2(fp8, exact)
    assert rel_l2(routed, exact) < 1.15 * fp8_error
    assert rel_l2(routed, fp8) < fp8_error


def test_torch_compile_calls_the_custom_op() -> None:
    """Under torch.compile(fullgraph=True) a routed module is one graph holding the
    mlpjit::dense_mlp op, and gives the eager numbers."""
    model = tiny_model("deepseek_v3")
    mlpjit_hf.apply(model)
    module = model.get_submodule(ROUTED[0])
    targets, weights = [], []

    def backend(gm: torch.fx.GraphModule, example_inputs):
        for node in gm.graph.nodes:
            targets.append(node.target)
            if node.target in (torch.ops.mlpjit.dense_mlp.default, torch.ops.mlpjit.dense_mlp):
                weights.extend(node.args[1:5])
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, fullgraph=True)
    for m in (1, 4, 11):
        x = x_like(m, 2)
        assert torch.equal(compiled(x), module(x))
    assert torch.ops.mlpjit.dense_mlp.default in targets or torch.ops.mlpjit.dense_mlp in targets
    # the weights are static graph inputs (as parameters are): CUDA graphs neither copy them
    # per replay nor hand the op copies at other addresses
    assert weights and len(weights) % 4 == 0  # 4 weights per compiled graph
    for node in weights:
        assert node.op == "placeholder"
        assert node.meta["tensor_dict"].get("_dynamo_static_input_type"), node


def test_torch_compile_the_whole_model() -> None:
    model = tiny_model("deepseek_v3")
    mlpjit_hf.apply(model)
    ids = torch.tensor([[1, 2, 3, 4]])
    eager = logits_of(model, ids)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    assert torch.equal(logits_of(compiled, ids), eager)
