"""Tiny DeepSeek-V3- and GLM-5-architecture transformers models with the real MLP sizes of
one TP shard: what tests/gpu/test_transformers_gpu.py and scripts/bench_transformers.py
build (a few layers, small attention and vocab, random weights; ``build_bf16``,
``build_pair``).

Also the FP8 conversion both use (transformers' own pieces, as FineGrainedFP8Config does at
load) and its dequantized-bf16 counterpart. Test and tooling support only; torch and
transformers are imported inside the functions, so the configs cost nothing to import.
"""

from __future__ import annotations

import copy
import math
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "ARCHS",
    "MIN_POSITIONS",
    "MODELS",
    "NOT_CONVERTED",
    "PROJS",
    "ROUTED",
    "TINY",
    "build_bf16",
    "build_pair",
    "dequantize_into",
    "fp8_linears",
    "mlp_std",
    "routed_prefixes",
    "tiny_config",
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
PROJS = ("gate_proj", "up_proj", "down_proj")  # the projections of one MLP
MIN_POSITIONS = 128  # max_position_embeddings unless a caller needs more


def routed_prefixes(num_layers: int = TINY["num_hidden_layers"], first_dense: int = 1) -> list[str]:
    """The modules apply() routes: the dense layers' MLPs, then the MoE layers' shared experts."""
    return [
        f"model.layers.{i}.mlp" if i < first_dense else f"model.layers.{i}.mlp.shared_experts"
        for i in range(num_layers)
    ]


# The modules apply() routes in these models.
ROUTED = routed_prefixes()


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


def tiny_config(
    arch: str, hidden: int, dense: int, shared: int, positions: int = MIN_POSITIONS, **changes: Any
):
    """The transformers config of a tiny ``arch`` model with these MLP sizes."""
    import transformers

    config_cls, _, extra = ARCHS[arch]
    extra = dict(extra)
    if arch == "glm_moe_dsa":
        extra["index_topk"] = positions  # every key kept: the indexer's top-k cannot flip
    values = {
        **TINY,
        **extra,
        "hidden_size": hidden,
        "intermediate_size": dense,
        "moe_intermediate_size": shared,
        "max_position_embeddings": positions,
        **changes,
    }
    return getattr(transformers, config_cls)(**values)


def mlp_std(name: str, k: int) -> float:
    """Weight std giving gate/up std ~2 and down output ~1 for unit-RMS input (the GPU test's)."""
    return 1 / (3 * math.sqrt(k)) if name.endswith("down_proj") else 2 / math.sqrt(k)


def build_bf16(
    arch: str,
    hidden: int,
    dense: int,
    shared: int,
    *,
    device: str | torch.device = "cuda",
    positions: int = MIN_POSITIONS,
    seed: int = 0,
    experts_implementation: str | None = None,
    **changes: Any,
) -> torch.nn.Module:
    """A tiny ``arch`` model in bf16 on ``device``, eval, seeded; its routed MLPs' weights
    re-drawn with mlp_std (so the MLPs matter in the residual stream)."""
    import torch
    import transformers

    config = tiny_config(arch, hidden, dense, shared, positions, **changes)
    if experts_implementation is not None:
        config._experts_implementation = experts_implementation
    model_cls = getattr(transformers, ARCHS[arch][1])
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(config).to(torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    with torch.no_grad():
        for prefix in routed_prefixes(config.num_hidden_layers, config.first_k_dense_replace):
            for proj in PROJS:
                w = model.get_submodule(f"{prefix}.{proj}").weight
                w.copy_(
                    torch.randn(w.shape, generator=gen, device=device) * mlp_std(proj, w.shape[1])
                )
    return model.eval()


def build_pair(
    arch: str, hidden: int, dense: int, shared: int, **kwargs: Any
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(fp8 model, bf16 model with the same weights dequantized)."""
    bf16 = build_bf16(arch, hidden, dense, shared, **kwargs)
    fp8 = to_fp8(copy.deepcopy(bf16))
    return fp8, dequantize_into(bf16, fp8)
