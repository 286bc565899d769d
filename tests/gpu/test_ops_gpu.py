"""The mlpjit::dense_mlp op on the H200: torch.compile(fullgraph=True) equals eager.

    MLPJIT_CACHE_DIR=.gpu-cache python3 -m pytest -q tests/gpu/test_ops_gpu.py

GLM-5 TP8 shapes (hidden 6144, inter 1536): the kernels the prebuilt cache holds.
"""

from __future__ import annotations

import pytest
import torch

from mlpjit.device import kernel_arch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HIDDEN, INTER = 6144, 1536
TOKENS = (1, 3, 8)


def _layer(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def fp8(n: int, k: int) -> torch.Tensor:
        w = torch.randn(n, k, generator=gen, device="cuda") * 48
        return w.clamp(-448, 448).to(torch.float8_e4m3fn)

    def scale(n: int, k: int) -> torch.Tensor:
        e = torch.randint(-12, -8, (n // 128, k // 128), generator=gen, device="cuda")
        return 2.0 ** e.float()

    return {
        "w13": fp8(2 * INTER, HIDDEN),
        "w13_scale": scale(2 * INTER, HIDDEN),
        "w2": fp8(HIDDEN, INTER),
        "w2_scale": scale(HIDDEN, INTER),
    }


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from mlpjit.ops import DenseMlpOp

        self.layers = torch.nn.ModuleList(
            DenseMlpOp(**_layer(seed), ue8m0=True) for seed in range(3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Nothing but the custom op: inductor has no arithmetic of its own to fuse or reorder
        # (a residual add kept in fp32 across fusions could change the bits), so compiled must
        # equal eager exactly.
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def model() -> _Model:
    from mlpjit import ops

    ops.clear_registry()
    m = _Model()
    for layer in m.layers:
        layer.prepare(TOKENS)
    yield m
    ops.clear_registry()


def _x(m: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(m)
    return torch.randn(m, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16)


def test_layers_take_the_kernel_path(model: _Model) -> None:
    from mlpjit.ops import get_mlp

    if kernel_arch(torch.device("cuda")) is None:
        pytest.skip("no fp8_gemv kernels for this GPU (stock path)")
    layer = model.layers[0]
    mlp = get_mlp(layer.w13, layer.w13_scale, layer.w2, layer.w2_scale, ue8m0=True)
    assert all(mlp.path(m) == "kernel" for m in TOKENS)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compile_fullgraph_equals_eager(model: _Model, mode: str | None) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    for m in TOKENS:
        x = _x(m)
        expected = model(x)
        for _ in range(3):  # reduce-overhead records a CUDA graph after warm-up calls
            got = compiled(x).clone()
        torch.cuda.synchronize()
        assert torch.equal(got, expected), f"m={m} mode={mode}"
