"""The tensor-parallel demo's layers: seeded full GLM-5 dense layers, their TP shards, and
the accuracy check of a TP run against the full layer's reference (scripts/tp_demo.py).

Plain Python at import (torch inside the functions), so a spawned rank's import time is
its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mlpjit.kernels.blocks import BLOCK
from mlpjit.kernels.checks import check_int
from mlpjit.kernels.fp8_gemv.params import MAX_TOKENS
from mlpjit.models import MODELS
from mlpjit.testing.layers import random_fp8_layer, rel_l2

__all__ = [
    "HIDDEN",
    "INTERMEDIATE",
    "SEED",
    "TOL",
    "check_entry",
    "check_shapes",
    "emulated_chain",
    "format_check",
    "kernel_requests",
    "layer_errors",
    "random_input",
    "random_layer",
    "reference_chain",
    "shard_layer",
]

HIDDEN, INTERMEDIATE = MODELS["glm5"]
TOL = 1e-2  # relative L2 error allowed against the full TP=1 reference
SEED = 1234


# --------------------------------------------------------------------- weights and shards


def check_shapes(hidden: int, intermediate: int, tp: int) -> None:
    """ValueError unless the full layer shards evenly into 128-aligned TP slices."""
    for name, value in (("hidden", hidden), ("intermediate", intermediate), ("tp", tp)):
        check_int(name, value, 1)
    if hidden % BLOCK:
        raise ValueError(f"hidden must be a multiple of {BLOCK}, got {hidden}")
    if intermediate % tp or (intermediate // tp) % BLOCK:
        raise ValueError(
            f"tp must divide intermediate ({intermediate}) into slices that are a multiple of "
            f"{BLOCK} (the weight-scale block), got tp={tp}"
        )


def random_layer(hidden: int, intermediate: int, *, seed: int, device: Any) -> dict:
    """One full dense layer {w13, w13_scale, w2, w2_scale} of seeded random FP8 weights
    (mlpjit.testing.layers.random_fp8_layer), sized so unit-scale activations stay
    unit-scale: each dequantized matrix has a standard deviation near 1/sqrt(k). The same
    seed gives the same layer on the same device type; nothing depends on the rank."""
    import torch

    check_shapes(hidden, intermediate, 1)
    gen = torch.Generator(device=device).manual_seed(seed)
    return random_fp8_layer(hidden, intermediate, gen, gate_up_std=1.0, out_std=1.0)


def random_input(m: int, hidden: int, *, device: Any, seed: int = SEED) -> Any:
    """bf16 randn [m, hidden], seeded by m (identical on every rank)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed + 1000 * m)
    return torch.randn(m, hidden, generator=gen, device=device).to(torch.bfloat16)


def shard_layer(w13: Any, s13: Any, w2: Any, s2: Any, rank: int, tp: int) -> tuple:
    """Rank ``rank``'s tensor-parallel shard of a full layer, as new contiguous tensors.

    w13 [2I, H] (gate rows then up rows) -> gate rows [r*I/tp, (r+1)*I/tp) followed by the
    matching up rows [I + r*I/tp, I + (r+1)*I/tp), with the matching scale rows of s13
    [2I/128, H/128]; w2 [H, I] -> columns [r*I/tp, (r+1)*I/tp) with the matching scale columns
    of s2 [H/128, I/128]. Returns (w13_r [2I/tp, H], s13_r, w2_r [H, I/tp], s2_r). The sum
    over ranks of each shard's MLP output is the full layer's output (up to rounding).
    Works on any device, meta included. ValueError for bad shapes, rank or tp.
    """
    import torch

    check_int("tp", tp, 1)
    check_int("rank", rank, 0, tp - 1)
    if w13.dim() != 2 or w13.shape[0] % 2:
        raise ValueError(f"w13 must be [2*intermediate, hidden], got {list(w13.shape)}")
    inter, hidden = w13.shape[0] // 2, w13.shape[1]
    check_shapes(hidden, inter, tp)
    expected = {
        "w2": (w2, (hidden, inter)),
        "s13": (s13, (2 * inter // BLOCK, hidden // BLOCK)),
        "s2": (s2, (hidden // BLOCK, inter // BLOCK)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")
    c = inter // tp  # this rank's intermediate slice
    lo, hi = rank * c, (rank + 1) * c
    blo, bhi, bi = lo // BLOCK, hi // BLOCK, inter // BLOCK
    w13_r = torch.cat([w13[lo:hi], w13[inter + lo : inter + hi]]).contiguous()
    s13_r = torch.cat([s13[blo:bhi], s13[bi + blo : bi + bhi]]).contiguous()
    return w13_r, s13_r, w2[:, lo:hi].contiguous(), s2[:, blo:bhi].contiguous()


def kernel_requests(
    arch: str = "sm_90a",
    *,
    hidden: int = HIDDEN,
    intermediate: int = INTERMEDIATE,
    tp: int = 8,
    tokens: Iterable[int] = range(1, MAX_TOKENS + 1),
) -> list:
    """The compile requests the GPU run needs: both kernels of a TP-``tp`` shard, ue8m0 on.
    The full TP=1 layer is only used by the reference (plain torch), so it needs no kernel."""
    from mlpjit.layer_plan import dense_mlp_requests

    check_shapes(hidden, intermediate, tp)
    return dense_mlp_requests(hidden, intermediate, tp, list(tokens), arch, ue8m0=True)


# --------------------------------------------------------------------- the check


def _reference(layer: dict, h: Any) -> Any:
    from mlpjit.reference import dense_mlp_reference

    return dense_mlp_reference(h, **layer, ue8m0=True)


def reference_chain(full_layers: Sequence[dict], x: Any) -> Any:
    """The residual chain with the full layers in reference math: h += dense_mlp_reference(h)."""
    h = x
    for layer in full_layers:
        h = h + _reference(layer, h)
    return h


def layer_errors(
    full_layers: Sequence[dict], inputs: Sequence[Any], outputs: Sequence[Any]
) -> list[float]:
    """Relative L2 error of each layer's TP output (the all-reduced partial sum) against the
    full layer's reference output, both computed from the same input: the TP run's own input
    to that layer (x for the first, the previous h after that).

    This is the accuracy check. Comparing only the final h of two independently computed
    chains instead amplifies rounding: a bf16-level difference in h moves some values of
    the next layer's FP8 activation quantization across a rounding step (an FP8 step is
    6 to 12 percent of the value), so two correct chains drift apart by a few 1e-2 after
    three layers (measured on CPU: 2.7e-3 per layer, 4e-2 for the chain of 3).
    """
    return [
        rel_l2(got, _reference(layer, h))
        for layer, h, got in zip(full_layers, inputs, outputs, strict=True)
    ]


def emulated_chain(
    rank_mlps: Sequence[Sequence[Any]], x: Any, *, bf16_sum: bool = False
) -> tuple[Any, list, list]:
    """The TP chain computed in one process: ``rank_mlps[r][layer]`` are the shards' DenseMlps.

    Per layer the ranks' partial outputs are summed in float32 and rounded once to bf16 (what
    the all-reduce computes), or with ``bf16_sum`` added one rank after the other in bf16
    (closer to NCCL, which rounds to bf16 at each hop of its ring). Returns (final h, each
    layer's input, each layer's summed output) for ``layer_errors``.
    """
    import torch

    h, inputs, outputs = x, [], []
    for layer in range(len(rank_mlps[0])):
        parts = [mlps[layer](h) for mlps in rank_mlps]
        if bf16_sum:
            total = parts[0]
            for part in parts[1:]:
                total = total + part
        else:
            total = torch.stack([p.float() for p in parts]).sum(0).to(torch.bfloat16)
        inputs.append(h)
        outputs.append(total)
        h = h + total
    return h, inputs, outputs


def check_entry(full_layers: Sequence[dict], x: Any, h: Any, inputs: list, outputs: list) -> dict:
    """The check for one token count: per-layer errors, their max, and the chain's error."""
    errors = layer_errors(full_layers, inputs, outputs)
    return {
        "layers": errors,
        "max": max(errors),
        "chain": rel_l2(h, reference_chain(full_layers, x)),
    }


def format_check(per_m: dict[str, dict]) -> tuple[str, bool]:
    """The check's lines, one per token count: each layer's error against TOL (the check),
    and the chain's error (information only, see ``layer_errors``); (text, all passed)."""
    ok = bool(per_m) and all(e["max"] <= TOL for e in per_m.values())
    lines = [
        f"check: each layer's all-reduced TP output vs the full TP=1 layer "
        f"(dense_mlp_reference, ue8m0) on the same input, relative L2 <= {TOL:g}:"
    ]
    for m, e in per_m.items():
        layers = " ".join(f"{v:.2e}" for v in e["layers"])
        verdict = "ok" if e["max"] <= TOL else "FAIL"
        lines.append(
            f"  m={m}: layers {layers} (max {e['max']:.2e}) {verdict}; whole chain vs an "
            f"independent reference chain {e['chain']:.2e} (info: FP8 re-quantization "
            "amplifies rounding)"
        )
    lines.append(f"check -> {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines), ok
