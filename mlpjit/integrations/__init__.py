"""Integrations of DenseMlp into model libraries, one module per library.

- ``mlpjit.integrations.transformers``: ``apply(model)`` routes the dense MLPs and shared
  experts of a Hugging Face transformers FP8 model (FP8Linear, 128x128 blocks) through
  DenseMlp; ``remove(model)`` undoes it.

Nothing is imported here: each integration imports its library (and torch) when used.
"""

__all__: list[str] = []
