"""mlpjit.scale_rule: one activation-scale rule default for every entry point, so the
README's route (warm a cache, then build the layers) compiles nothing; a checkpoint's config
decides where it says (quantization_config.scale_fmt)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from mlpjit import DenseMlp, ops, reference, stock
from mlpjit.dense_mlp import kernel_requests, kernel_supported
from mlpjit.integrations import transformers as mlpjit_tf
from mlpjit.jit.key import request_key
from mlpjit.models import PRESETS
from mlpjit.scale_rule import DEFAULT_UE8M0, quantization_ue8m0, resolve_ue8m0

REPO = Path(__file__).resolve().parent.parent


def warm_keys(cache: Path, *args: str) -> set[str]:
    """The keys `mlpjit warm ARGS --dry-run --json` plans (no compile)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLPJIT_")}
    env["MLPJIT_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    run = subprocess.run(
        [sys.executable, "-m", "mlpjit", "warm", *args, "--dry-run", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return {row["key"] for row in json.loads(run.stdout)["entries"]}


def layer_keys(mlp: DenseMlp, arch: str = "sm_90a") -> set[str]:
    """The keys prepare(range(1, 9)) asks for, for a layer built on this machine (CPU
    weights: the same requests a Hopper GPU of 132 SMs would make)."""
    requests = kernel_requests(
        mlp.hidden, mlp.intermediate, range(1, 9), arch, limit=mlp.limit, ue8m0=mlp.ue8m0
    )
    return {request_key(r) for r in requests}


def fp8_layer(hidden: int, inter: int) -> DenseMlp:
    """A DenseMlp with default arguments on zero FP8 weights of one TP shard."""
    w13 = torch.zeros(2 * inter, hidden, dtype=torch.float8_e4m3fn)
    w2 = torch.zeros(hidden, inter, dtype=torch.float8_e4m3fn)
    ones = torch.ones
    return DenseMlp(
        w13, ones(2 * inter // 128, hidden // 128), w2, ones(hidden // 128, inter // 128)
    )


def test_readme_warm_then_load_compiles_nothing(tmp_path: Path) -> None:
    """The README's quick start warms GLM-5 TP 8; the layers a server then builds with
    DenseMlp's defaults (dense and shared expert shards) ask for exactly warmed keys."""
    warmed = warm_keys(tmp_path / "c", "--model", "glm5", "--tp", "8", "--tokens", "1-8",
                       "--arch", "sm_90a")  # fmt: skip
    dense, shared = fp8_layer(6144, 12288 // 8), fp8_layer(6144, 2048 // 8)
    assert dense.ue8m0 is shared.ue8m0 is DEFAULT_UE8M0
    assert layer_keys(dense) | layer_keys(shared) == warmed


def test_every_entry_point_has_the_one_default() -> None:
    def default(func, name: str = "ue8m0"):
        return inspect.signature(func).parameters[name].default

    assert DEFAULT_UE8M0 is True
    for func in (DenseMlp.__init__, ops.get_mlp, ops.prepare, ops.DenseMlpOp.__init__):
        assert default(func) is DEFAULT_UE8M0, func
    for func in (reference.dense_mlp_reference, stock.dense_mlp):
        assert default(func) is DEFAULT_UE8M0, func
    # None: the checkpoint's or model's config where it says, else DEFAULT_UE8M0.
    assert default(DenseMlp.from_checkpoint) is None
    assert default(mlpjit_tf.apply) is None
    assert "ue8m0=True" in str(torch.ops.mlpjit.dense_mlp.default._schema)


@pytest.mark.parametrize(
    ("quant", "want"),
    [
        ({"scale_fmt": "ue8m0"}, True),
        ({"scale_fmt": "UE8M0"}, True),
        ({"scale_fmt": "float"}, False),
        ({"scale_fmt": "e4m3"}, False),
        ({"scale_fmt": None}, None),
        ({}, None),
        (None, None),
        (types.SimpleNamespace(scale_fmt="ue8m0"), True),  # FineGrainedFP8Config-like
        (types.SimpleNamespace(scale_fmt="float"), False),
        (types.SimpleNamespace(), None),
    ],
)
def test_quantization_ue8m0(quant, want) -> None:
    assert quantization_ue8m0(quant) is want


def test_bad_scale_fmt_and_ue8m0_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match=r"^quantization_config\.scale_fmt must be a string"):
        quantization_ue8m0({"scale_fmt": 1})
    with pytest.raises(ValueError, match=r"^ue8m0 must be True, False or None"):
        resolve_ue8m0("yes")
    assert resolve_ue8m0(None) is DEFAULT_UE8M0
    assert resolve_ue8m0(None, False) is False
    assert resolve_ue8m0(True, False) is True


def test_apply_takes_the_rule_from_the_model_config() -> None:
    def model(quant: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(config=types.SimpleNamespace(quantization_config=quant))

    assert mlpjit_tf.model_ue8m0(model({"scale_fmt": "ue8m0"})) is True
    assert mlpjit_tf.model_ue8m0(model(types.SimpleNamespace(scale_fmt="float"))) is False
    assert mlpjit_tf.model_ue8m0(model(None)) is None
    assert mlpjit_tf.model_ue8m0(types.SimpleNamespace()) is None


# Layers of the presets that run the stock path (the README says so): GLM-4.5's shared
# expert at TP 8 has 1536 / 8 = 192 rows per rank, not a multiple of 128.
STOCK_LAYERS = {("glm4.5", "shared", 8)}


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("name", list(PRESETS))
def test_readme_preset_claims(name: str, tp: int) -> None:
    """Every dense layer and shared expert of the presets runs on the kernels at 1-8 tokens
    at TP 1-8 (on a 132-SM GPU), except the layers STOCK_LAYERS names."""
    for layer, inter in PRESETS[name].layers().items():
        on_kernels = all(
            kernel_supported(PRESETS[name].hidden, inter // tp, m) for m in range(1, 9)
        )
        assert on_kernels is ((name, layer, tp) not in STOCK_LAYERS), (layer, inter)
