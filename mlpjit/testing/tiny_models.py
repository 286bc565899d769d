"""Tiny DeepSeek-V3- and GLM-5-architecture transformers models with the real MLP sizes of
one TP shard: what tests/gpu/test_transformers_gpu.py and scripts/bench_transformers.py
build (a few layers, small attention and vocab, random weights).

Also the FP8 conversion both use (transformers' own pieces, as FineGrainedFP8Config does at
load) and its dequantized-bf16 counterpart. Test and tooling support only; torch and
transformers are imported inside the functions, so the configs cost nothing to import.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "ARCHS",
    "MODELS",
    "NOT_CONVERTED",
    "ROUTED",
    "TINY",
    "dequantize_into",
    "fp8_linears",
    "to_fp8",
]

# name -> (architecture, hidden, dense intermediate, shared-expert intermediate): one TP
# shard at TP 8 and TP 1 (GLM-5: 6144, 12288, 2048; DeepSeek-V3: 7168, 18432, 2048).
MODELS: dict[str, tuple[str, int, int, int]] = {
    "glm5-tp8": ("glm_moe_dsa", 6144, 1536, 256),
    "glm5-tp1": ("glm_moe_dsa", 6144, 12288, 2048),
    "dsv3-tp8": ("deepseek_v3", 7168, 2304, 256),
    "dsv3-tp1": ("deepseek_v3", 7168, 18432, 2048),
}
# architecture -> (transformers config class, model class, config entries of its own). The
# callers set GLM-5's index_topk to max_position_embeddings: the DSA indexer then keeps every
# key, so its discrete top-k cannot flip on rounding.
ARCHS: dict[str, tuple[str, str, dict]] = {
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {"n_group": 1, "topk_group": 1}),
    "glm_moe_dsa": (
        "GlmMoeDsaConfig",
        "GlmMoeDsaForCausalLM",
        {"index_head_dim": 64, "index_n_heads": 2},
    ),
}
# The config entries every tiny model shares (3 layers: one dense, two MoE with a shared
# expert each), besides the sizes above and max_position_embeddings.
TINY: dict[str, int] = {
    "vocab_size": 1024,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 128,
    "q_lora_rank": 256,
    "qk_rope_head_dim": 32,
    "qk_nope_head_dim": 64,
    "v_head_dim": 64,
}
# What stays bf16 under FineGrainedFP8Config(modules_to_not_convert=...): all but the dense
# MLPs and shared experts. "mlp.gate$" is the router only: transformers 5.17 matches a
# pattern as a prefix, so a bare "mlp.gate" also kept the dense gate_proj in bf16.
NOT_CONVERTED = ["lm_head", r".*self_attn", r".*mlp\.gate$", r".*mlp\.experts"]
# The modules apply() routes in these models.
ROUTED = [
    "model.layers.0.mlp",
    "model.layers.1.mlp.shared_experts",
    "model.layers.2.mlp.shared_experts",
]


def to_fp8(model: torch.nn.Module) -> torch.nn.Module:
    """Convert ``model``'s dense MLPs and shared experts to FP8Linear in place, as
    FineGrainedFP8Config does: transformers' replace_with_fp8_linear, then its Fp8Quantize
    on each bf16 weight (128x128 float32 weight_scale_inv). The model's
    config.quantization_config is set as from_pretrained leaves it, so
    mlpjit.integrations.transformers.apply reads its scale rule (float32 scales) there."""
    import torch
    import transformers
    from transformers.integrations import finegrained_fp8 as tf_fp8

    quant = transformers.FineGrainedFP8Config(modules_to_not_convert=NOT_CONVERTED)
    bf16 = {n: m.weight.detach() for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    tf_fp8.replace_with_fp8_linear(
        model, modules_to_not_convert=quant.modules_to_not_convert, quantization_config=quant
    )
    quantizer = tf_fp8.Fp8Quantize(types.SimpleNamespace(quantization_config=quant))
    for name, module in model.named_modules():
        if isinstance(module, tf_fp8.FP8Linear):
            tensors = quantizer.convert({f"{name}.weight": bf16[name]})
            for attr in ("weight", "weight_scale_inv"):
                value = tensors[f"{name}.{attr}"]
                setattr(module, attr, torch.nn.Parameter(value, requires_grad=False))
    model.config.quantization_config = quant
    return model


def fp8_linears(model: torch.nn.Module) -> list[str]:
    """Names of the modules holding a float8_e4m3fn weight with a weight_scale_inv."""
    import torch

    return [
        name
        for name, m in model.named_modules()
        if getattr(m, "weight_scale_inv", None) is not None
        and getattr(m, "weight", None) is not None
        and m.weight.dtype == torch.float8_e4m3fn
    ]


def dequantize_into(model: torch.nn.Module, fp8: torch.nn.Module) -> torch.nn.Module:
    """Give the bf16 ``model`` ``fp8``'s FP8 weights, dequantized to bf16; returns it."""
    import torch

    from mlpjit import reference as ref

    with torch.no_grad():
        for name in fp8_linears(fp8):
            module = fp8.get_submodule(name)
            w = ref.dequantize_weight(module.weight, module.weight_scale_inv.float())
            model.get_submodule(name).weight.copy_(w.to(torch.bfloat16))
    return model
