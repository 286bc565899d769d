"""Model presets (mlpjit.models) and the shard shapes built from them (mlpjit.testing.layers)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mlpjit.kernels.blocks import BLOCK
from mlpjit.models import LAYERS, MODELS, PRESET_NAMES, PRESETS, ModelPreset, get_preset
from mlpjit.testing.layers import DENSE_SHAPES, GEMV_SHAPES, dense_shard

# name -> (hidden_size, intermediate_size, moe_intermediate_size * n_shared_experts or None),
# as the models' Hugging Face config.json files give them.
CONFIGS = {
    "glm5": (6144, 12288, 2048),
    "glm4.5": (5120, 12288, 1536),
    "deepseek-v3": (7168, 18432, 2048),
    "qwen3-8b": (4096, 12288, None),
    "qwen3-14b": (5120, 17408, None),
    "qwen3-32b": (5120, 25600, None),
}


def test_presets_hold_the_config_sizes() -> None:
    assert list(PRESETS) == list(CONFIGS)
    for name, (hidden, inter, shared) in CONFIGS.items():
        preset = PRESETS[name]
        assert preset.name == name
        assert (preset.hidden, preset.intermediate, preset.shared_intermediate) == (
            hidden,
            inter,
            shared,
        )


def test_aliases_resolve_to_their_preset() -> None:
    v3 = get_preset("deepseek-v3")
    assert v3.aliases == ("deepseek-r1", "kimi-k2")
    assert get_preset("kimi-k2") is v3 and get_preset("deepseek-r1") is v3
    assert all(get_preset(name) is preset for name, preset in PRESETS.items())
    assert PRESET_NAMES == (
        "glm5",
        "glm4.5",
        "deepseek-v3",
        "deepseek-r1",
        "kimi-k2",
        "qwen3-8b",
        "qwen3-14b",
        "qwen3-32b",
    )


@pytest.mark.parametrize("name", ["glm6", "Kimi-K2", "qwen3", ""])
def test_unknown_names_list_the_known_ones(name: str) -> None:
    with pytest.raises(ValueError, match="unknown model preset") as err:
        get_preset(name)
    assert "glm5, glm4.5, deepseek-v3, deepseek-r1, kimi-k2" in str(err.value)


def test_layers_leave_out_a_missing_shared_expert() -> None:
    assert get_preset("glm5").layers() == {"dense": 12288, "shared": 2048}
    assert get_preset("qwen3-14b").layers() == {"dense": 17408}
    assert all(set(p.layers()) <= set(LAYERS) for p in PRESETS.values())


def test_presets_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_preset("glm5").hidden = 1  # type: ignore[misc]
    assert ModelPreset("x", 128, 256) == ModelPreset("x", 128, 256)


def test_models_keeps_the_dense_shapes_by_preset_name() -> None:
    """MODELS is what callers from before the presets grew use: name -> (hidden, dense)."""
    assert MODELS["glm5"] == (6144, 12288) and MODELS["glm4.5"] == (5120, 12288)
    assert {name: (h, i) for name, (h, i, _) in CONFIGS.items()} == MODELS
    assert "kimi-k2" not in MODELS


# ---- shard shapes -------------------------------------------------------------------------


def test_the_glm_dense_shard_names_are_unchanged() -> None:
    for tp in (8, 4, 2, 1):
        assert DENSE_SHAPES[f"glm5-tp{tp}"] == (6144, 12288 // tp)
        assert DENSE_SHAPES[f"glm4.5-tp{tp}"] == (5120, 12288 // tp)
    assert GEMV_SHAPES["glm5-tp8-gate_up"] == (3072, 6144, True)
    assert GEMV_SHAPES["glm5-tp8-down"] == (6144, 1536, False)


def test_every_preset_shard_on_128_boundaries_is_named() -> None:
    want = {}
    for name, (hidden, inter, shared) in CONFIGS.items():
        for tag, size in ((name, inter), (f"{name}-shared", shared)):
            for tp in (8, 4, 2, 1):
                if size is not None and size % (tp * BLOCK) == 0:
                    want[f"{tag}-tp{tp}"] = (hidden, size // tp)
    assert want == DENSE_SHAPES
    # The shards the benchmark and the kernel work are about:
    assert DENSE_SHAPES["deepseek-v3-tp8"] == (7168, 2304)
    assert DENSE_SHAPES["deepseek-v3-shared-tp8"] == (7168, 256)
    assert DENSE_SHAPES["glm5-shared-tp8"] == (6144, 256)
    assert DENSE_SHAPES["glm4.5-shared-tp4"] == (5120, 384)
    assert DENSE_SHAPES["qwen3-32b-tp8"] == (5120, 3200)
    assert DENSE_SHAPES["qwen3-14b-tp8"] == (5120, 2176)
    # 1536 / 8 = 192 is not a whole number of scale blocks: no such shard.
    assert "glm4.5-shared-tp8" not in DENSE_SHAPES
    assert not any(name.startswith("qwen3-8b-shared") for name in DENSE_SHAPES)
    assert not any("kimi" in name for name in DENSE_SHAPES)


def test_gemv_shapes_are_both_launches_of_every_shard() -> None:
    assert len(GEMV_SHAPES) == 2 * len(DENSE_SHAPES)
    for name, (hidden, inter) in DENSE_SHAPES.items():
        assert GEMV_SHAPES[f"{name}-gate_up"] == (2 * inter, hidden, True)
        assert GEMV_SHAPES[f"{name}-down"] == (hidden, inter, False)


def test_dense_shard_of_a_layer() -> None:
    assert dense_shard("glm5", 8) == (6144, 1536)
    assert dense_shard("glm5", 8, "shared") == (6144, 256)
    assert dense_shard("kimi-k2", 4, "shared") == (7168, 512)
    with pytest.raises(ValueError, match="qwen3-8b has no 'shared' layer; it has dense"):
        dense_shard("qwen3-8b", 1, "shared")
    with pytest.raises(ValueError, match="tp 3 does not divide glm5's shared intermediate"):
        dense_shard("glm5", 3, "shared")
    with pytest.raises(ValueError, match="unknown model preset"):
        dense_shard("glm6", 1)


def test_the_readme_lists_every_preset() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for name, p in PRESETS.items():
        aliases = ", ".join(f"`{a}`" for a in p.aliases)
        shared = p.shared_intermediate or "-"
        row = f"| `{name}` | {aliases} | {p.hidden} | {p.intermediate} | {shared} |"
        assert row.replace("|  |", "| |") in readme, row
