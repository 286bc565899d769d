"""One repeatable decode step of a transformers model on a StaticCache (the decode-step
benchmark, scripts/bench_transformers.py): the prefill once, then the same new token at the
same position as often as asked, eager or captured in a CUDA graph.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from mlpjit.testing.layers import capture_graph

__all__ = ["CACHE_SLACK", "DecodeStep", "cache_counters", "capture_step", "full_logits"]

CACHE_SLACK = 8  # static cache slots past the decoded token (masked out)


def cache_counters(cache: Any) -> list[tuple[Any, str]]:
    """(layer, attribute) of every length counter of a transformers cache's layers (the
    static layers' ``cumulative_length`` tensors, the DSA layers' indexer counters, ...)."""
    found = []
    for layer in getattr(cache, "layers", ()):
        for attr, value in vars(layer).items():
            if "cumulative_length" in attr and isinstance(value, (int, torch.Tensor)):
                found.append((layer, attr))
    return found


class DecodeStep:
    """One decode step of ``model`` at position ``context`` of a StaticCache.

    The constructor runs the prefill (``context`` seeded random tokens). ``run(fn)`` runs one
    step with ``fn`` (default the model; a compiled call works too) and returns its logits;
    ``rewind()`` puts every cache counter back to ``context``, so steps can repeat; calling
    the object does both. The inputs are fixed tensors (graph capture reads them in place).
    """

    def __init__(self, model: torch.nn.Module, context: int, *, seed: int = 0) -> None:
        import transformers

        device = next(model.parameters()).device
        self.model = model
        self.context = context
        length = context + CACHE_SLACK
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=length)
        params = inspect.signature(model.forward).parameters
        cache_kw = "cache" if "cache" in params else "past_key_values"  # 5.24 vs 5.17
        gen = torch.Generator().manual_seed(seed + context)
        ids = torch.randint(0, model.config.vocab_size, (1, context + 1), generator=gen)
        mask = torch.zeros(1, length, dtype=torch.long)
        mask[:, : context + 1] = 1  # the prompt and the new token; the slack masked out
        prefill_mask = mask.clone()
        prefill_mask[:, context] = 0
        self.prompt = ids[:, :context].to(device)
        self.inputs = {
            "input_ids": ids[:, context:].to(device),
            "position_ids": torch.tensor([[context]], device=device),
            "attention_mask": mask.to(device),
            cache_kw: self.cache,
            "use_cache": True,
            "logits_to_keep": 1,
        }
        with torch.no_grad():
            model(
                input_ids=self.prompt,
                position_ids=torch.arange(context, device=device)[None],
                attention_mask=prefill_mask.to(device),
                **{cache_kw: self.cache},
                use_cache=True,
                logits_to_keep=1,
            )
        self.counters = cache_counters(self.cache)
        if not self.counters:
            raise RuntimeError(
                f"no length counters found in {type(self.cache).__name__}'s layers: this "
                "transformers' static cache cannot be rewound to repeat a step"
            )

    def rewind(self) -> None:
        for layer, attr in self.counters:
            value = getattr(layer, attr)
            if isinstance(value, torch.Tensor):
                value.fill_(self.context)
            else:
                setattr(layer, attr, self.context)

    def run(self, fn: Callable[..., Any] | None = None) -> torch.Tensor:
        with torch.no_grad():
            return (fn or self.model)(**self.inputs).logits

    def __call__(self, fn: Callable[..., Any] | None = None) -> torch.Tensor:
        self.rewind()
        return self.run(fn)


def full_logits(step: DecodeStep) -> torch.Tensor:
    """The logits of the step's token from one cache-free forward of prompt + token."""
    ids = torch.cat((step.prompt, step.inputs["input_ids"]), dim=1)
    with torch.no_grad():
        return step.model(input_ids=ids, use_cache=False).logits[:, -1:]


def capture_step(step: DecodeStep) -> tuple[Any, torch.Tensor]:
    """(graph, its logits tensor): the step captured with torch.cuda.graph after two eager
    steps on a side stream (lazy loads and workspaces must not happen in capture), the cache
    rewound before the capture."""

    def warm_step() -> None:
        step()
        step.rewind()

    return capture_graph(step.run, warmup=warm_step)
