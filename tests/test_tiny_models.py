"""mlpjit/testing/tiny_models.py on the CPU at small sizes: the builder makes each
architecture with the asked MLP sizes, converts only the routed MLPs to FP8, and gives the
bf16 model the FP8 weights dequantized; apply() routes the same modules."""

from __future__ import annotations

import pytest
import tiny_pairs
import torch
from tiny_pairs import SMALL

from mlpjit.testing.tiny_models import (
    ARCHS,
    PROJS,
    ROUTED,
    fp8_linears,
    routed_prefixes,
)

transformers = pytest.importorskip("transformers")

MLP_CLASSES = {"deepseek_v3": "DeepseekV3MLP", "glm_moe_dsa": "GlmMoeDsaMLP"}
# the shared fixtures: one CPU thread (autouse) and the (arch, fp8, bf16) models
one_thread, pair = tiny_pairs.one_thread, tiny_pairs.pair


def test_the_builder_makes_the_architecture_with_the_asked_sizes(pair) -> None:
    arch, fp8, bf16 = pair
    hidden, dense, shared = SMALL
    assert type(bf16).__name__ == ARCHS[arch][1]
    assert bf16.config.num_hidden_layers == 3 and bf16.config.vocab_size == 1024
    for model in (fp8, bf16):
        for name, inter in zip(ROUTED, (dense, shared, shared), strict=True):
            module = model.get_submodule(name)
            assert type(module).__name__ == MLP_CLASSES[arch]
            assert tuple(module.gate_proj.weight.shape) == (inter, hidden)
            assert tuple(module.up_proj.weight.shape) == (inter, hidden)
            assert tuple(module.down_proj.weight.shape) == (hidden, inter)
        assert type(model.model.layers[1].mlp).__name__.endswith("MoE")
    assert routed_prefixes() == ROUTED


def test_only_the_routed_mlps_are_fp8(pair) -> None:
    _, fp8, bf16 = pair
    assert fp8_linears(fp8) == [f"{p}.{proj}" for p in ROUTED for proj in PROJS]
    assert fp8_linears(bf16) == []
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
    for name in fp8_linears(fp8):
        q = fp8.get_submodule(name)
        want = ref.dequantize_weight(q.weight, q.weight_scale_inv.float()).to(torch.bfloat16)
        assert torch.equal(bf16.get_submodule(name).weight, want), name


def test_apply_routes_the_dense_mlps_and_shared_experts(pair) -> None:
    from mlpjit.integrations import transformers as mlpjit_hf

    _, fp8, _ = pair
    try:
        assert mlpjit_hf.apply(fp8, (1,)) == ROUTED
    finally:
        mlpjit_hf.remove(fp8)
