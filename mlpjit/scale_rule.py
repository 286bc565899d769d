"""The activation-scale rule: one default for every entry point, or what a config says.

The kernels quantize activations per token and 128-group with scale = amax / 448; with the
UE8M0 rule that scale is rounded up to a power of two. The rule is a compile parameter (it
is in every kernel's cache key), so a cache warmed with one rule serves only layers built
with the same rule. Every entry point therefore defaults to the same rule, ``DEFAULT_UE8M0``:
``mlpjit warm``, ``DenseMlp(...)``, ``DenseMlp.from_checkpoint``, ``mlpjit.ops`` and
``mlpjit.integrations.transformers.apply``.

UE8M0 is the default because it is what vLLM and SGLang use on Hopper with DeepGEMM. A
checkpoint's config.json may say which rule it was made for, as DeepSeek-V3.1 does with
``quantization_config.scale_fmt: "ue8m0"``; any other scale_fmt (transformers'
FineGrainedFP8Config writes ``"float"``) means plain float32 scales. Where the config says,
``from_checkpoint``, ``mlpjit warm --checkpoint`` and ``apply`` follow it; an explicit
argument wins over both. Standard library only: the CLI imports this.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DEFAULT_UE8M0", "UE8M0_FORMAT", "quantization_ue8m0", "resolve_ue8m0"]

# vLLM's and SGLang's rule on Hopper with DeepGEMM (see the module docstring).
DEFAULT_UE8M0 = True
# The scale_fmt value that means power-of-two (UE8M0) activation scales.
UE8M0_FORMAT = "ue8m0"


def quantization_ue8m0(quant: object, where: str = "quantization_config") -> bool | None:
    """The rule a quantization_config gives (a dict, or an object with attributes such as
    transformers' FineGrainedFP8Config): True for ``scale_fmt: "ue8m0"``, False for any
    other scale_fmt string, None when it has no scale_fmt. A scale_fmt that is not a string
    is a one-line ValueError naming ``where``."""
    if quant is None:
        return None
    value = (
        quant.get("scale_fmt") if isinstance(quant, Mapping) else getattr(quant, "scale_fmt", None)
    )
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(
            f"{where}.scale_fmt must be a string ('{UE8M0_FORMAT}' for power-of-two "
            f"activation scales, anything else for float32 scales), got {value!r:.60}"
        )
    return value.strip().lower() == UE8M0_FORMAT


def resolve_ue8m0(ue8m0: object, from_config: bool | None = None) -> bool:
    """The rule to use: ``ue8m0`` when given (True or False), else what the config says
    (``from_config``), else DEFAULT_UE8M0. A ue8m0 that is not a bool or None is a one-line
    ValueError naming the argument."""
    if ue8m0 is None:
        return DEFAULT_UE8M0 if from_config is None else from_config
    if not isinstance(ue8m0, bool):
        raise ValueError(f"ue8m0 must be True, False or None (from the config), got {ue8m0!r:.60}")
    return ue8m0
