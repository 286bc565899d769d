"""Dense-MLP shapes of the model presets (`mlpjit warm --model`): (hidden, intermediate)."""

from __future__ import annotations

__all__ = ["MODELS"]

MODELS: dict[str, tuple[int, int]] = {"glm5": (6144, 12288), "glm4.5": (5120, 12288)}
