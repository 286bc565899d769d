"""mlpjit/bench/tp_layers.py on CPU: seeded weights, the shard layout, the sum of partial
outputs, the emulated chain's check and the kernel list."""

from __future__ import annotations

import pytest
import torch

from mlpjit import DenseMlp
from mlpjit import reference as ref
from mlpjit.bench import tp_layers
from mlpjit.testing.layers import rel_l2

HIDDEN, INTER, TP = 512, 2048, 4  # small shapes: every shard is [1024, 512] / [512, 512]


@pytest.fixture(scope="module")
def layer() -> dict:
    return tp_layers.random_layer(HIDDEN, INTER, seed=7, device="cpu")


def _shards(layer: dict, tp: int = TP) -> list[tuple]:
    return [
        tp_layers.shard_layer(
            layer["w13"], layer["w13_scale"], layer["w2"], layer["w2_scale"], r, tp
        )
        for r in range(tp)
    ]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def test_random_layer_is_seeded_and_realistic(layer: dict) -> None:
    again = tp_layers.random_layer(HIDDEN, INTER, seed=7, device="cpu")
    other = tp_layers.random_layer(HIDDEN, INTER, seed=8, device="cpu")
    for name, t in layer.items():
        assert torch.equal(_bits(t), _bits(again[name])), name
        assert not torch.equal(_bits(t), _bits(other[name])), name
    assert layer["w13"].dtype == layer["w2"].dtype == torch.float8_e4m3fn
    assert list(layer["w13"].shape) == [2 * INTER, HIDDEN]
    assert list(layer["w2_scale"].shape) == [HIDDEN // 128, INTER // 128]
    for name in ("w13_scale", "w2_scale"):
        s = layer[name]
        assert s.dtype == torch.float32 and bool((s > 0).all())
    assert float(layer["w13"].float().abs().max()) <= 448.0
    # Dequantized weights have a standard deviation near 1/sqrt(k).
    std13 = float(ref.dequantize_weight(layer["w13"], layer["w13_scale"]).std())
    std2 = float(ref.dequantize_weight(layer["w2"], layer["w2_scale"]).std())
    assert 0.8 < std13 * HIDDEN**0.5 < 1.25
    assert 0.8 < std2 * INTER**0.5 < 1.25


def test_shard_layout(layer: dict) -> None:
    c = INTER // TP
    for r, (w13, s13, w2, s2) in enumerate(_shards(layer)):
        assert w13.is_contiguous() and w2.is_contiguous() and s13.is_contiguous()
        assert list(w13.shape) == [2 * c, HIDDEN] and list(w2.shape) == [HIDDEN, c]
        assert list(s13.shape) == [2 * c // 128, HIDDEN // 128]
        assert list(s2.shape) == [HIDDEN // 128, c // 128]
        gate = layer["w13"][r * c : (r + 1) * c]
        up = layer["w13"][INTER + r * c : INTER + (r + 1) * c]
        assert torch.equal(_bits(w13[:c]), _bits(gate))
        assert torch.equal(_bits(w13[c:]), _bits(up))
        b, bi = c // 128, INTER // 128
        assert torch.equal(s13[:b], layer["w13_scale"][r * b : (r + 1) * b])
        assert torch.equal(s13[b:], layer["w13_scale"][bi + r * b : bi + (r + 1) * b])
        assert torch.equal(_bits(w2), _bits(layer["w2"][:, r * c : (r + 1) * c]))
        assert torch.equal(s2, layer["w2_scale"][:, r * b : (r + 1) * b])


def test_sum_of_partial_outputs_is_the_full_layer(layer: dict) -> None:
    x = tp_layers.random_input(8, HIDDEN, device="cpu")
    full_act = ref.gemv_reference(
        x, layer["w13"], layer["w13_scale"], swiglu=True, limit=None, ue8m0=True
    )
    aq, as_ = ref.quantize_activation(full_act, ue8m0=True)
    full_down = ref.block_scaled_gemm(aq, as_, layer["w2"], layer["w2_scale"])
    partial_sum = torch.zeros_like(full_down)
    c = INTER // TP
    for r, (w13, s13, w2, s2) in enumerate(_shards(layer)):
        act = ref.gemv_reference(x, w13, s13, swiglu=True, limit=None, ue8m0=True)
        # Each shard's act is the matching slice of the full act (same rows, same x).
        torch.testing.assert_close(act, full_act[:, r * c : (r + 1) * c], rtol=1e-2, atol=1e-3)
        aq_r, as_r = ref.quantize_activation(act, ue8m0=True)
        partial_sum += ref.block_scaled_gemm(aq_r, as_r, w2, s2)
    assert rel_l2(partial_sum, full_down) < 1e-5  # the down GEMM splits exactly
    out = ref.dense_mlp_reference(x, **layer, ue8m0=True)
    assert 0.1 < float(out.float().std()) < 10.0  # unit-scale input -> unit-scale output
    assert rel_l2(partial_sum.to(torch.bfloat16), out) < 1e-2


def test_emulated_chain_check_passes_and_catches_bad_shards(layer: dict) -> None:
    layers = [layer, tp_layers.random_layer(HIDDEN, INTER, seed=9, device="cpu")]
    good = [
        [DenseMlp(*tp_layers.shard_layer(*lay.values(), r, TP), ue8m0=True) for lay in layers]
        for r in range(TP)
    ]
    x = tp_layers.random_input(2, HIDDEN, device="cpu")
    h, inputs, outputs = tp_layers.emulated_chain(good, x)
    assert inputs[0] is x and torch.equal(h, inputs[1] + outputs[1])
    entry = tp_layers.check_entry(layers, x, h, inputs, outputs)
    assert len(entry["layers"]) == 2 and entry["max"] == max(entry["layers"])
    assert 0 < entry["max"] < 5e-3  # bf16 rounding of the partial outputs only
    # The first layer's input is x itself, so its error is also that of the plain layer.
    full = ref.dense_mlp_reference(x, **layer, ue8m0=True)
    assert rel_l2(outputs[0], full) == entry["layers"][0]
    assert (
        tp_layers.check_entry(layers, x, *tp_layers.emulated_chain(good, x, bf16_sum=True))["max"]
        < 1e-2
    )
    # Rank 1 given rank 2's down projection in the second layer: the check must fail.
    bad = [list(mlps) for mlps in good]
    w13, s13, _, _ = tp_layers.shard_layer(*layers[1].values(), 1, TP)
    _, _, w2, s2 = tp_layers.shard_layer(*layers[1].values(), 2, TP)
    bad[1][1] = DenseMlp(w13, s13, w2, s2, ue8m0=True)
    entry = tp_layers.check_entry(layers, x, *tp_layers.emulated_chain(bad, x))
    assert entry["layers"][0] < 5e-3 and entry["layers"][1] > 5e-2


def test_shard_layer_errors(layer: dict) -> None:
    args = (layer["w13"], layer["w13_scale"], layer["w2"], layer["w2_scale"])
    with pytest.raises(ValueError, match="rank"):
        tp_layers.shard_layer(*args, 4, 4)
    with pytest.raises(ValueError, match="tp"):
        tp_layers.shard_layer(*args, 0, 3)  # 2048 / 3 is not whole
    with pytest.raises(ValueError, match="multiple of 128"):
        tp_layers.shard_layer(*args, 0, 32)  # 64-wide slices
    with pytest.raises(ValueError, match="s2"):
        tp_layers.shard_layer(*args[:3], layer["w2_scale"][:, :4], 0, 4)
    with pytest.raises(ValueError, match="w2"):
        tp_layers.shard_layer(args[0], args[1], args[2][:, :1024], args[3], 0, 4)


def test_kernel_requests_are_the_tp8_shard_kernels() -> None:
    reqs = tp_layers.kernel_requests("sm_90a")
    assert len(reqs) == 16  # tokens 1..8 x (gate_up, down)
    shapes = {(r.params["rows"], r.params["k"], r.params["swiglu"]) for r in reqs}
    assert shapes == {(3072, 6144, True), (6144, 1536, False)}
    assert {r.params["tokens"] for r in reqs} == set(range(1, 9))
    assert all(r.params["ue8m0"] is True and r.arch == "sm_90a" for r in reqs)
    from mlpjit.layer_plan import dense_mlp_requests

    assert reqs == dense_mlp_requests(6144, 12288, 8, range(1, 9), "sm_90a", ue8m0=True)


def test_format_check() -> None:
    good = {"layers": [3e-3, 4e-3], "max": 4e-3, "chain": 3e-2}
    text, passed = tp_layers.format_check({"1": good})
    assert passed and "layers 3.00e-03 4.00e-03 (max 4.00e-03) ok" in text
    assert text.endswith("PASS")
    bad = {"layers": [3e-3, 2e-2], "max": 2e-2, "chain": 5e-2}
    text, passed = tp_layers.format_check({"1": good, "8": bad})
    assert not passed and "m=8" in text and text.endswith("FAIL")
    assert not tp_layers.format_check({})[1]
