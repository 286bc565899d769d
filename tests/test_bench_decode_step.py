"""mlpjit/bench/decode_step.py on the CPU: a step repeats exactly after a rewind and matches
a cache-free forward; the routed FP8 model's step differs by FP8 rounding only."""

from __future__ import annotations

import pytest
import tiny_pairs
import torch

from mlpjit.bench.decode_step import CACHE_SLACK, DecodeStep, full_logits
from mlpjit.testing.layers import rel_l2

transformers = pytest.importorskip("transformers")

# the shared fixtures: one CPU thread (autouse) and the (arch, fp8, bf16) models
one_thread, pair = tiny_pairs.one_thread, tiny_pairs.pair


def test_a_step_repeats_and_matches_a_cache_free_forward(pair) -> None:
    _, fp8, bf16 = pair
    context = 12
    step = DecodeStep(bf16, context)
    assert step.counters, "static cache counters found"
    first = step()
    assert all(int(getattr(layer, a)) == context + 1 for layer, a in step.counters)
    for _ in range(CACHE_SLACK + 1):  # more steps than the cache has spare slots
        again = step()
    assert torch.equal(first, again)
    assert first.shape == (1, 1, 1024)
    assert rel_l2(first, full_logits(step)) < 1e-2
    step.rewind()
    assert all(int(getattr(layer, a)) == context for layer, a in step.counters)
    # without the rewind the counters run past the cache: the rewind is what repeats a step
    with pytest.raises((IndexError, RuntimeError)):
        for _ in range(CACHE_SLACK + 1):
            step.run()
    # the routed FP8 model's step (DenseMlp's reference math on the CPU) differs from bf16's
    # by FP8 rounding only
    from mlpjit.integrations import transformers as mlpjit_hf

    mlpjit_hf.apply(fp8, (1,))
    try:
        err = rel_l2(DecodeStep(fp8, context)(), first)
    finally:
        mlpjit_hf.remove(fp8)
    assert 0 < err < 0.3
