"""MLP shapes of the model presets (`mlpjit warm --model`, the benchmarks' shard shapes).

Each preset holds the full (unsharded) sizes its Hugging Face config.json gives: the dense MLP
layers' hidden_size and intermediate_size, and for MoE models the shared expert's intermediate
size (moe_intermediate_size * n_shared_experts). vLLM and SGLang build a shared expert from
the same dense MLP class and run it on every MoE layer, so it is a second dense-MLP shape to
warm. Standard library only: the CLI imports this to build its argument parser.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LAYERS", "MODELS", "PRESETS", "PRESET_NAMES", "ModelPreset", "get_preset"]

# The MLP layers a preset can have: its dense MLP layers and its MoE layers' shared expert.
LAYERS = ("dense", "shared")


@dataclass(frozen=True)
class ModelPreset:
    """One model's MLP shapes.

    ``intermediate`` is the dense MLP's, ``shared_intermediate`` the shared expert's (None for
    a model without one, such as the dense Qwen3 models); ``aliases`` are other names of
    models with the same shapes.
    """

    name: str
    hidden: int
    intermediate: int
    shared_intermediate: int | None = None
    aliases: tuple[str, ...] = ()

    def layers(self) -> dict[str, int]:
        """{layer: full intermediate size} for the layers of LAYERS this model has."""
        found = {"dense": self.intermediate, "shared": self.shared_intermediate}
        return {layer: size for layer, size in found.items() if size is not None}


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("glm5", 6144, 12288, 2048),
        ModelPreset("glm4.5", 5120, 12288, 1536),
        # Kimi-K2 and DeepSeek-R1 are DeepSeek-V3's architecture with the same sizes.
        ModelPreset("deepseek-v3", 7168, 18432, 2048, aliases=("deepseek-r1", "kimi-k2")),
        ModelPreset("qwen3-8b", 4096, 12288),
        ModelPreset("qwen3-14b", 5120, 17408),
        ModelPreset("qwen3-32b", 5120, 25600),
    )
}
_BY_NAME: dict[str, ModelPreset] = {
    name: p for p in PRESETS.values() for name in (p.name, *p.aliases)
}
# Every name get_preset accepts: each preset's name followed by its aliases.
PRESET_NAMES: tuple[str, ...] = tuple(_BY_NAME)

# name -> (hidden, dense intermediate) of every preset (aliases left out), for callers that
# only need the dense shape.
MODELS: dict[str, tuple[int, int]] = {
    name: (p.hidden, p.intermediate) for name, p in PRESETS.items()
}


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name`` or having it as an alias; a ValueError listing the known
    names otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"unknown model preset {name!r}; known: {', '.join(PRESET_NAMES)}"
        ) from None
