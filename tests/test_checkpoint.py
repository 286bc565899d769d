"""mlpjit.checkpoint on real safetensors files written here in the DeepSeek-V3 FP8 layout.

The main checkpoint has two dense layers (hidden 1024, intermediate 1024) and one MoE layer
whose shared expert has intermediate 512, plus routed experts, a router and attention
tensors, split over two shards (layer 1's gate/up in the first, its down in the second) with
an index and a config.json. Shards are checked against slices of the tensors written, and
their outputs against mlpjit.reference on the full layer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mlpjit import DenseMlp
from mlpjit import reference as ref
from mlpjit.checkpoint import (
    checkpoint_mlp_shapes,
    find_mlp_prefixes,
    load_dense_mlp_weights,
    shard_range,
)

HIDDEN, INTER, SHARED_INTER = 1024, 1024, 512
DENSE = ("model.layers.0.mlp", "model.layers.1.mlp")
SHARED = "model.layers.2.mlp.shared_experts"
PREFIXES = (*DENSE, SHARED)
QUANT = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3"}
BF16_U = 2.0**-8  # unit roundoff of bf16 (8 significant bits): |x - bf16(x)| <= u |x|


# ---- writing checkpoints ----------------------------------------------------------------------


def quantize(w: torch.Tensor, pow2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [n, k] -> (e4m3 [n, k], float32 scales [n/128, k/128]) with w ~ q * scale:
    per 128x128 block scale = amax / 448 (rounded up to a power of two with ``pow2``)."""
    n, k = w.shape
    blocks = w.reshape(n // 128, 128, k // 128, 128)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    if pow2:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.reshape(n, k), scale.float()


def mlp_tensors(
    prefix: str, hidden: int, inter: int, seed: int, pow2: bool = False
) -> dict[str, torch.Tensor]:
    """gate/up/down FP8 weights and float32 weight_scale_inv of one MLP, from a seed."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for proj, shape in (
        ("gate_proj", (inter, hidden)),
        ("up_proj", (inter, hidden)),
        ("down_proj", (hidden, inter)),
    ):
        # a spread of block magnitudes, so the scales differ per block
        w = torch.randn(shape, generator=gen) * torch.rand(shape[0], 1, generator=gen) * 0.05
        q, s = quantize(w, pow2)
        out[f"{prefix}.{proj}.weight"] = q
        out[f"{prefix}.{proj}.weight_scale_inv"] = s
    return out


def deepseek_config(**changes: object) -> dict:
    """A DeepSeek-V3-style config.json of the main checkpoint (3 layers, 2 dense)."""
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "moe_intermediate_size": SHARED_INTER,
        "n_shared_experts": 1,
        "n_routed_experts": 2,
        "first_k_dense_replace": 2,
        "moe_layer_freq": 1,
        "num_hidden_layers": 3,
        "quantization_config": {**QUANT, "weight_block_size": [128, 128]},
    }
    config.update(changes)
    return config


def write_checkpoint(
    root: Path,
    tensors: dict[str, torch.Tensor],
    config: dict,
    shards: list[list[str]] | None = None,
) -> Path:
    """Write ``tensors`` as safetensors shards (each a list of names; None: one
    model.safetensors without index) and config.json into ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    if shards is None:
        save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
        return root
    weight_map = {}
    for i, names in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(root / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def main_tensors() -> dict[str, torch.Tensor]:
    """Every tensor of the main checkpoint: MLPs, routed experts, router, attention, embed."""
    gen = torch.Generator().manual_seed(99)
    tensors = {"model.embed_tokens.weight": torch.randn(64, HIDDEN, generator=gen).bfloat16()}
    for i, prefix in enumerate(DENSE):
        tensors.update(mlp_tensors(prefix, HIDDEN, INTER, seed=i))
    tensors.update(mlp_tensors(SHARED, HIDDEN, SHARED_INTER, seed=7))
    for e in range(2):  # routed experts: same names below mlp.experts.E, never listed
        tensors.update(mlp_tensors(f"model.layers.2.mlp.experts.{e}", HIDDEN, 128, seed=10 + e))
    tensors["model.layers.2.mlp.gate.weight"] = torch.randn(2, HIDDEN, generator=gen).bfloat16()
    for layer in range(3):
        name = f"model.layers.{layer}.self_attn.o_proj.weight"
        tensors[name] = torch.randn(HIDDEN, 128, generator=gen).bfloat16()
    return tensors


def main_shards(tensors: dict[str, torch.Tensor]) -> list[list[str]]:
    """Two shards; layer 1's gate and up in the first, its down in the second."""
    first = [
        n
        for n in tensors
        if n.startswith(("model.embed", "model.layers.0."))
        or (n.startswith("model.layers.1.") and "down_proj" not in n)
    ]
    return [first, [n for n in tensors if n not in first]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """(the main checkpoint's dir, its tensors)."""
    tensors = main_tensors()
    root = tmp_path_factory.mktemp("ckpt")
    return write_checkpoint(root, tensors, deepseek_config(), main_shards(tensors)), tensors


def full_layer(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The unsharded layer as DenseMlp's arguments, from the tensors written."""
    t = {p: tensors[f"{prefix}.{p}.weight"] for p in ("gate_proj", "up_proj", "down_proj")}
    s = {
        p: tensors[f"{prefix}.{p}.weight_scale_inv"] for p in ("gate_proj", "up_proj", "down_proj")
    }
    return {
        "w13": torch.cat((t["gate_proj"], t["up_proj"])),
        "w13_scale": torch.cat((s["gate_proj"], s["up_proj"])),
        "w2": t["down_proj"],
        "w2_scale": s["down_proj"],
    }


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (FP8 tensors compared as bytes)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 1:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def x_tokens(m: int, hidden: int = HIDDEN) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    return torch.randn(m, hidden, generator=gen).bfloat16()


# ---- shards: exact slices, and outputs against the reference -----------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("prefix", PREFIXES)
def test_shards_are_the_right_slices(checkpoint, prefix: str, tp: int) -> None:
    root, tensors = checkpoint
    full = full_layer(tensors, prefix)
    inter = full["w2"].shape[1]
    step = inter // tp
    for rank in range(tp):
        got = load_dense_mlp_weights(root, prefix, tp_rank=rank, tp_size=tp)
        lo, hi = rank * step, (rank + 1) * step
        b0, b1 = lo // 128, hi // 128
        gate = tensors[f"{prefix}.gate_proj.weight"][lo:hi]
        up = tensors[f"{prefix}.up_proj.weight"][lo:hi]
        gate_s = tensors[f"{prefix}.gate_proj.weight_scale_inv"][b0:b1]
        up_s = tensors[f"{prefix}.up_proj.weight_scale_inv"][b0:b1]
        assert sorted(got) == ["w13", "w13_scale", "w2", "w2_scale"]
        assert same(got["w13"], torch.cat((gate, up)))
        assert same(got["w13_scale"], torch.cat((gate_s, up_s)))
        assert same(got["w2"], full["w2"][:, lo:hi])
        assert same(got["w2_scale"], full["w2_scale"][:, b0:b1])
        assert all(t.is_contiguous() and t.device.type == "cpu" for t in got.values())


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("prefix", PREFIXES)
def test_partial_outputs_sum_to_the_full_layer(checkpoint, prefix: str, tp: int) -> None:
    """Sum over ranks of DenseMlp(shard)(x) equals the reference on the full layer.

    Why this tolerance: the shards' act is the full act's columns exactly (gate_up is not
    split along K, and act quantization groups of 128 never straddle a shard boundary), so
    the only difference is in the down GEMM: the full layer rounds its fp32 sum P once to
    bf16, the ranks round their fp32 partial sums p_i each. Per element
    |sum bf16(p_i) - bf16(P)| <= u (|P| + sum |p_i|) with u = 2^-8 (bf16), plus fp32
    reassociation (~1e-6 relative, covered by the 1.01 factor and an absolute 1e-6).
    """
    root, tensors = checkpoint
    full = full_layer(tensors, prefix)
    x = x_tokens(5)
    want_act = ref.gemv_reference(x, full["w13"], full["w13_scale"], swiglu=True)
    want = ref.dense_mlp_reference(x, **full).float()
    inter = full["w2"].shape[1]
    partials = []
    for rank in range(tp):
        weights = load_dense_mlp_weights(root, prefix, tp_rank=rank, tp_size=tp)
        act = ref.gemv_reference(x, weights["w13"], weights["w13_scale"], swiglu=True)
        lo, hi = shard_range(inter, rank, tp)
        assert torch.equal(act, want_act[:, lo:hi])
        partials.append(DenseMlp(**weights)(x).float())
    total = torch.stack(partials).sum(0)
    bound = BF16_U * (want.abs() + torch.stack(partials).abs().sum(0)) * 1.01 + 1e-6
    assert bool(((total - want).abs() <= bound).all())
    assert float((total - want).norm() / want.norm()) < 5e-3  # measured 2.3e-3


def test_from_checkpoint_builds_a_dense_mlp(checkpoint) -> None:
    root, tensors = checkpoint
    mlp = DenseMlp.from_checkpoint(root, SHARED, tp_rank=1, tp_size=2, device="cpu", limit=2.0)
    assert (mlp.hidden, mlp.intermediate, mlp.limit, mlp.ue8m0) == (HIDDEN, 256, 2.0, True)
    weights = load_dense_mlp_weights(root, SHARED, tp_rank=1, tp_size=2)
    x = x_tokens(3)
    assert torch.equal(mlp(x), ref.dense_mlp_reference(x, **weights, limit=2.0))


def test_single_file_checkpoint(tmp_path) -> None:
    tensors = mlp_tensors("model.layers.0.mlp", 512, 512, seed=3)
    root = write_checkpoint(tmp_path / "one", tensors, deepseek_config(num_hidden_layers=1))
    got = load_dense_mlp_weights(root, "model.layers.0.mlp", tp_rank=1, tp_size=2)
    w = tensors["model.layers.0.mlp.down_proj.weight"]
    assert same(got["w2"], w[:, 256:])
    assert find_mlp_prefixes(root) == {"dense": ["model.layers.0.mlp"], "shared_experts": []}


# ---- scale forms ------------------------------------------------------------------------------


def packed_ue8m0(scale: torch.Tensor, pad_byte: int = 0) -> torch.Tensor:
    """Power-of-two float32 scales [R, B] -> UE8M0 bytes packed four per int32 along K
    [R, ceil(B/4)] (byte j of word i = block 4i+j), padding bytes set to ``pad_byte``."""
    exps = scale.to(torch.float8_e8m0fnu).view(torch.uint8).to(torch.int64)
    rows, blocks = exps.shape
    words = -(-blocks // 4)
    padded = torch.full((rows, words * 4), pad_byte, dtype=torch.int64)
    padded[:, :blocks] = exps
    shifts = torch.tensor([0, 8, 16, 24])
    packed = (padded.reshape(rows, words, 4) << shifts).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # two's complement


def to_form(tensors: dict[str, torch.Tensor], form: str) -> dict[str, torch.Tensor]:
    """The same checkpoint with its scales in ``form``: "weight_scale" (the name),
    "e8m0" (float8_e8m0fnu) or "packed" (int32 UE8M0, padding bytes 0xFF)."""
    out = {}
    for name, t in tensors.items():
        if not name.endswith(".weight_scale_inv"):
            out[name] = t
        elif form == "weight_scale":
            out[name.replace("weight_scale_inv", "weight_scale")] = t
        elif form == "e8m0":
            out[name] = t.to(torch.float8_e8m0fnu)
        else:
            out[name] = packed_ue8m0(t, pad_byte=0xFF)
    return out


@pytest.mark.parametrize("form", ["weight_scale", "e8m0", "packed"])
def test_scale_forms_load_as_float32(tmp_path, form: str) -> None:
    """Power-of-two scales in every form give the same float32 scales; intermediate 640 has
    5 blocks, so the packed form has a padding byte (0xFF, ignored) in its last word, and
    tp=5 puts shard boundaries inside words."""
    prefix = "model.layers.0.mlp"
    tensors = mlp_tensors(prefix, 1024, 640, seed=4, pow2=True)
    config = deepseek_config(num_hidden_layers=1, intermediate_size=640)
    base = write_checkpoint(tmp_path / "f32", tensors, config)
    other = write_checkpoint(tmp_path / form, to_form(tensors, form), config)
    for tp in (1, 5):
        for rank in range(tp):
            want = load_dense_mlp_weights(base, prefix, tp_rank=rank, tp_size=tp)
            got = load_dense_mlp_weights(other, prefix, tp_rank=rank, tp_size=tp)
            for key in want:
                assert same(got[key], want[key]), (key, tp, rank)


# ---- errors: one-line ValueErrors naming the tensor and the file --------------------------------

SMALL = "model.layers.0.mlp"


def small_tensors() -> dict[str, torch.Tensor]:
    return mlp_tensors(SMALL, 256, 512, seed=8)


def small_config(**changes: object) -> dict:
    return deepseek_config(num_hidden_layers=1, hidden_size=256, intermediate_size=512, **changes)


def write_small(root: Path, tensors=None, config=None, split: bool = True) -> Path:
    """A one-layer checkpoint; ``split``: gate/up in shard 1, down in shard 2, with index."""
    tensors = small_tensors() if tensors is None else tensors
    shards = None
    if split:
        first = [n for n in tensors if "down_proj" not in n]
        shards = [first, [n for n in tensors if n not in first]]
    return write_checkpoint(root, tensors, small_config() if config is None else config, shards)


def load_error(root: Path, prefix: str = SMALL, **kw: object) -> str:
    with pytest.raises(ValueError) as info:
        load_dense_mlp_weights(root, prefix, **kw)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_tensor(tmp_path) -> None:
    tensors = small_tensors()
    del tensors[f"{SMALL}.up_proj.weight"]
    msg = load_error(write_small(tmp_path, tensors))
    assert f"{SMALL}.up_proj.weight" in msg and "model.safetensors.index.json" in msg


def test_missing_index_entry(tmp_path) -> None:
    """The tensor is in its shard, but the index does not list it."""
    root = write_small(tmp_path)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    del index["weight_map"][f"{SMALL}.down_proj.weight"]
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = load_error(root)
    assert f"{SMALL}.down_proj.weight" in msg and "model.safetensors.index.json" in msg


def test_index_entry_pointing_at_the_wrong_shard(tmp_path) -> None:
    root = write_small(tmp_path)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    index["weight_map"][f"{SMALL}.down_proj.weight"] = "model-00001-of-00002.safetensors"
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = load_error(root)
    assert f"{SMALL}.down_proj.weight" in msg and "model-00001-of-00002.safetensors" in msg


def test_missing_shard_file(tmp_path) -> None:
    root = write_small(tmp_path)
    (root / "model-00002-of-00002.safetensors").unlink()
    msg = load_error(root)
    assert f"{SMALL}.down_proj.weight" in msg and "model-00002-of-00002.safetensors" in msg


def test_missing_scale(tmp_path) -> None:
    tensors = small_tensors()
    del tensors[f"{SMALL}.gate_proj.weight_scale_inv"]
    msg = load_error(write_small(tmp_path, tensors))
    assert (
        f"{SMALL}.gate_proj.weight_scale_inv" in msg and f"{SMALL}.gate_proj.weight_scale " in msg
    )


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        (f"{SMALL}.up_proj.weight", torch.bfloat16, "expected F8_E4M3"),
        (f"{SMALL}.down_proj.weight", torch.float8_e5m2, "expected F8_E4M3"),
        (f"{SMALL}.down_proj.weight_scale_inv", torch.bfloat16, "expected one of F32"),
    ],
)
def test_wrong_dtype(tmp_path, name: str, dtype: torch.dtype, expected: str) -> None:
    tensors = small_tensors()
    tensors[name] = tensors[name].float().to(dtype)
    msg = load_error(write_small(tmp_path, tensors))
    file = "00002" if "down_proj" in name else "00001"
    assert name in msg and file in msg and expected in msg


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        (f"{SMALL}.up_proj.weight", (640, 256)),
        (f"{SMALL}.down_proj.weight", (256, 384)),
        (f"{SMALL}.gate_proj.weight", (512, 200)),
        (f"{SMALL}.down_proj.weight_scale_inv", (2, 3)),
        (f"{SMALL}.up_proj.weight_scale_inv", (4, 2, 1)),
    ],
)
def test_wrong_shape(tmp_path, name: str, shape: tuple[int, ...]) -> None:
    tensors = small_tensors()
    tensors[name] = torch.zeros(shape, dtype=tensors[name].dtype)
    msg = load_error(write_small(tmp_path, tensors))
    assert name in msg and "shape" in msg and ".safetensors" in msg


def test_block_size_64_is_refused(tmp_path) -> None:
    quant = {**QUANT, "weight_block_size": [64, 64]}
    msg = load_error(write_small(tmp_path, config=small_config(quantization_config=quant)))
    assert "[64, 64]" in msg and "config.json" in msg and "weight_block_size" in msg


def test_no_quantization_config(tmp_path) -> None:
    config = small_config()
    del config["quantization_config"]
    msg = load_error(write_small(tmp_path, config=config))
    assert "config.json" in msg and "quantization_config" in msg


def test_compressed_tensors_block_structure(tmp_path) -> None:
    """compressed-tensors configs give the block in config_groups (and name scales
    weight_scale): [128, 128] loads, anything else is refused naming it."""
    tensors = to_form(small_tensors(), "weight_scale")
    group = {"weights": {"strategy": "block", "block_structure": [128, 128]}}
    quant = {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}
    root = write_small(tmp_path / "ok", tensors, small_config(quantization_config=quant))
    assert load_dense_mlp_weights(root, SMALL)["w13"].shape == (1024, 256)
    group["weights"]["block_structure"] = [128, 64]
    root = write_small(tmp_path / "bad", tensors, small_config(quantization_config=quant))
    assert "[128, 64]" in load_error(root)


@pytest.mark.parametrize("tp", [3, 8])
def test_size_that_does_not_split(tmp_path, tp: int) -> None:
    """512 / 3 is no integer and 512 / 8 = 64 rows is less than a scale block."""
    msg = load_error(write_small(tmp_path), tp_rank=0, tp_size=tp)
    assert "intermediate size 512" in msg and f"tp={tp}" in msg and SMALL in msg


@pytest.mark.parametrize(("rank", "size"), [(2, 2), (-1, 2), (0, 0), (True, 2)])
def test_bad_rank_or_size(tmp_path, rank, size) -> None:
    msg = load_error(write_small(tmp_path), tp_rank=rank, tp_size=size)
    assert "tp_" in msg


def test_truncated_file(tmp_path) -> None:
    root = write_small(tmp_path)
    shard = root / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    msg = load_error(root)
    assert shard.name in msg and f"{SMALL}.down_proj" in msg


def test_corrupt_header(tmp_path) -> None:
    root = write_small(tmp_path)
    shard = root / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[8:24] = b"\x00garbage garbage"
    shard.write_bytes(bytes(data))
    msg = load_error(root)
    assert shard.name in msg and f"{SMALL}.gate_proj.weight" in msg


def test_nan_byte_in_a_weight(tmp_path) -> None:
    """An e4m3 NaN byte (0x7F) no quantizer writes: corrupt data, named."""
    tensors = small_tensors()
    name = f"{SMALL}.down_proj.weight"
    tensors[name].view(torch.uint8)[7, 300] = 0x7F
    msg = load_error(write_small(tmp_path, tensors))
    assert name in msg and "00002" in msg and "NaN" in msg
    # the shard that does not hold the bad column reads fine
    load_dense_mlp_weights(tmp_path, SMALL, tp_rank=0, tp_size=2)


def test_nan_scale(tmp_path) -> None:
    tensors = small_tensors()
    name = f"{SMALL}.up_proj.weight_scale_inv"
    tensors[name][1, 1] = float("nan")
    msg = load_error(write_small(tmp_path, tensors))
    assert name in msg and "00001" in msg and "NaN" in msg


def test_unreadable_index_and_missing_files(tmp_path) -> None:
    root = write_small(tmp_path / "a")
    (root / "model.safetensors.index.json").write_text("{not json")
    msg = load_error(root)
    assert "model.safetensors.index.json" in msg
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(small_config()))
    assert "model.safetensors" in load_error(empty)
    assert "not a directory" in load_error(tmp_path / "nowhere")
    (root / "config.json").unlink()
    assert "config.json" in load_error(root)


# ---- listing prefixes and shapes ----------------------------------------------------------------


def test_find_mlp_prefixes(checkpoint, tmp_path) -> None:
    root, _ = checkpoint
    assert find_mlp_prefixes(root) == {"dense": list(DENSE), "shared_experts": [SHARED]}
    # layer 10 sorts after layer 2 (by number), and an incomplete MLP is not listed
    tensors = {
        **mlp_tensors("model.layers.10.mlp", 256, 256, seed=1),
        **mlp_tensors("model.layers.2.mlp", 256, 256, seed=2),
        **mlp_tensors("model.layers.3.mlp.shared_experts", 256, 256, seed=3),
    }
    del tensors["model.layers.3.mlp.shared_experts.up_proj.weight"]
    root = write_checkpoint(tmp_path, tensors, small_config(), [list(tensors)])
    assert find_mlp_prefixes(root) == {
        "dense": ["model.layers.2.mlp", "model.layers.10.mlp"],
        "shared_experts": [],
    }


def test_checkpoint_mlp_shapes(checkpoint) -> None:
    root, _ = checkpoint
    assert checkpoint_mlp_shapes(root) == [
        (DENSE[0], HIDDEN, INTER),
        (DENSE[1], HIDDEN, INTER),
        (SHARED, HIDDEN, SHARED_INTER),
    ]


def test_checkpoint_mlp_shapes_from_mlp_layer_types(checkpoint, tmp_path) -> None:
    """GLM-5's config lists layer types: they win over first_k_dense_replace."""
    root, tensors = checkpoint
    config = deepseek_config(
        model_type="glm_moe_dsa",
        first_k_dense_replace=3,
        mlp_layer_types=["dense"] * 2 + ["sparse"],
    )
    glm = write_checkpoint(tmp_path, tensors, config, main_shards(tensors))
    assert [p for p, _, _ in checkpoint_mlp_shapes(glm)] == list(PREFIXES)


def test_checkpoint_mlp_shapes_checks_the_tensors(checkpoint, tmp_path) -> None:
    root, tensors = checkpoint
    shards = main_shards(tensors)
    wrong = write_checkpoint(
        tmp_path / "w", tensors, deepseek_config(moe_intermediate_size=256), shards
    )
    with pytest.raises(ValueError, match=rf"{SHARED}.gate_proj.weight in .*00002.*\[512, 1024\]"):
        checkpoint_mlp_shapes(wrong)
    missing = write_checkpoint(
        tmp_path / "m", tensors, deepseek_config(first_k_dense_replace=3), shards
    )
    with pytest.raises(ValueError, match=r"layer 2 a dense MLP.*index.json"):
        checkpoint_mlp_shapes(missing)


def test_shard_range() -> None:
    assert shard_range(12288, 7, 8) == (10752, 12288)
    assert shard_range(2048, 1, 16) == (128, 256)
    with pytest.raises(ValueError, match="intermediate size 2048 does not split into tp=32"):
        shard_range(2048, 0, 32)
    assert shard_range(1024, 0, 1) == (0, 1024)


def test_import_is_cheap() -> None:
    """Importing the loader and the transformers integration imports none of torch,
    safetensors or transformers."""
    code = (
        "import sys, mlpjit.checkpoint, mlpjit.integrations.transformers\n"
        "print(sorted(m for m in ('torch', 'safetensors', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- mlpjit warm --checkpoint -----------------------------------------------------------------


def _warm_checkpoint(root: Path, cache: Path, tp: int, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLPJIT_")}
    env["MLPJIT_CACHE_DIR"] = str(cache)
    args = ["warm", "--checkpoint", str(root), "--tp", str(tp), "--arch", "sm_90a", *extra]
    return subprocess.run(
        [sys.executable, "-m", "mlpjit", *args, "--dry-run", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_warm_checkpoint_lists_the_kernels_its_shapes_need(checkpoint, tmp_path) -> None:
    """--checkpoint plans every distinct MLP shape of config.json at --tp: the dense
    (1024 x 1024) and the shared-expert shape (1024 x 512), at TP 1 and at TP 2 (the shared
    expert's 256-wide shard too)."""
    root, _ = checkpoint
    one = _warm_checkpoint(root, tmp_path / "c1", 1)
    assert one.returncode == 0, one.stderr
    rows = json.loads(one.stdout)["entries"]
    shapes = {(r["params"]["rows"], r["params"]["k"]) for r in rows}
    assert shapes == {(2 * INTER, HIDDEN), (HIDDEN, INTER), (2 * SHARED_INTER, HIDDEN),
                      (HIDDEN, SHARED_INTER)}  # fmt: skip
    assert len(rows) == 4 * 8  # two shapes x two kernels x tokens 1-8
    two = _warm_checkpoint(root, tmp_path / "c2", 2)
    assert two.returncode == 0, two.stderr
    shapes = {(r["params"]["rows"], r["params"]["k"]) for r in json.loads(two.stdout)["entries"]}
    assert shapes == {(INTER, HIDDEN), (HIDDEN, INTER // 2), (SHARED_INTER, HIDDEN),
                      (HIDDEN, SHARED_INTER // 2)}  # fmt: skip


def test_warm_checkpoint_that_fits_no_kernel_says_why(checkpoint, tmp_path) -> None:
    root, _ = checkpoint
    run = _warm_checkpoint(root, tmp_path / "c", 4, "--tokens", "9-16")
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no kernels to warm" in lines[0], run.stderr
    assert "takes the kernel path (1-8)" in lines[0]


# ---- the scale rule, the default device ---------------------------------------------------------


@pytest.mark.parametrize(("scale_fmt", "want"), [("ue8m0", True), ("float", False), (None, True)])
def test_from_checkpoint_and_warm_take_the_scale_rule_from_config(tmp_path, scale_fmt, want):
    """quantization_config.scale_fmt decides the rule ("ue8m0": power-of-two scales, any
    other value float32 scales, none: the default, UE8M0) for from_checkpoint and for
    `mlpjit warm --checkpoint` alike, so what warm compiled is what the layers ask for;
    an explicit ue8m0 / --no-ue8m0 wins."""
    from mlpjit.dense_mlp import kernel_requests
    from mlpjit.jit.key import request_key

    quant = {**QUANT, "weight_block_size": [128, 128]}
    if scale_fmt is not None:
        quant["scale_fmt"] = scale_fmt
    root = write_small(tmp_path / "ckpt", config=small_config(quantization_config=quant))
    mlp = DenseMlp.from_checkpoint(root, SMALL, tp_rank=0, tp_size=1, device="cpu")
    assert mlp.ue8m0 is want
    assert DenseMlp.from_checkpoint(root, SMALL, device="cpu", ue8m0=not want).ue8m0 is not want
    run = _warm_checkpoint(root, tmp_path / "c", 1)
    assert run.returncode == 0, run.stderr
    warmed = {row["key"] for row in json.loads(run.stdout)["entries"]}
    layer = kernel_requests(256, 512, range(1, 9), "sm_90a", limit=None, ue8m0=mlp.ue8m0)
    assert {request_key(r) for r in layer} == warmed
    flag = "--ue8m0" if not want else "--no-ue8m0"
    run = _warm_checkpoint(root, tmp_path / "c", 1, flag)
    assert {row["params"]["ue8m0"] for row in json.loads(run.stdout)["entries"]} == {not want}


def test_from_checkpoint_device_defaults_to_the_cpu_without_cuda(checkpoint) -> None:
    """No device given: the current CUDA device when there is one, else the CPU (never
    "cuda" on a machine without it)."""
    root, _ = checkpoint
    mlp = DenseMlp.from_checkpoint(root, "model.layers.0.mlp", tp_rank=0, tp_size=1)
    want = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    assert mlp.device == torch.device(want) and mlp.w13.device == torch.device(want)


def test_warm_checkpoint_without_safetensors_names_the_extra(checkpoint, tmp_path) -> None:
    root, _ = checkpoint
    code = (
        "import sys; sys.modules['safetensors'] = None; from mlpjit.cli import main; "
        f"sys.exit(main(['warm', '--checkpoint', {str(root)!r}, '--arch', 'sm_90a', "
        "'--dry-run']))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLPJIT_")}
    env["MLPJIT_CACHE_DIR"] = str(tmp_path / "c")
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        "mlpjit: error: reading a checkpoint needs safetensors: pip install 'mlpjit[checkpoint]'"
    ]


def test_checkpoint_errors_name_the_config_keys_that_decided(tmp_path) -> None:
    """A layer the config makes MoE (n_routed_experts, first_k_dense_replace) whose shared
    expert the files lack, and a size that does not match: the message names the keys and
    their values."""
    config = small_config(first_k_dense_replace=0)  # layer 0 becomes a MoE layer
    root = write_small(tmp_path / "moe", config=config)
    run = _warm_checkpoint(root, tmp_path / "c", 1)
    assert run.returncode == 1
    assert "n_routed_experts is 2, first_k_dense_replace 0, moe_layer_freq 1" in run.stderr
    assert "moe_intermediate_size 512 * n_shared_experts 1" in run.stderr
    config = deepseek_config(num_hidden_layers=1, hidden_size=256, intermediate_size=384)
    root = write_small(tmp_path / "size", config=config)
    run = _warm_checkpoint(root, tmp_path / "c", 1)
    assert run.returncode == 1 and len(run.stderr.splitlines()) == 1
    assert "n_routed_experts is 2, first_k_dense_replace 2" in run.stderr
    assert "intermediate_size 384" in run.stderr
    root = write_small(tmp_path / "tp")
    run = _warm_checkpoint(root, tmp_path / "c", 8)
    assert run.returncode == 1
    assert "dense MLP (config.json intermediate_size 512)" in run.stderr
