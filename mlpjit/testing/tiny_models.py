"""Tiny DeepSeek-V3- and GLM-5-architecture transformers models with the real MLP sizes of
one TP shard: what tests/gpu/test_transformers_gpu.py and scripts/bench_transformers.py
build (a few layers, small attention and vocab, random weights).

Test and tooling support only: plain data, no transformers or torch import here.
"""

from __future__ import annotations

__all__ = ["ARCHS", "MODELS", "NOT_CONVERTED", "ROUTED", "TINY"]

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
