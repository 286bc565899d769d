"""The mlpjit::dense_mlp custom op on CPU: fake shapes, torch.compile, opcheck, registry."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from mlpjit import ops
from mlpjit import reference as ref

HIDDEN, INTER = 256, 128


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def fp8(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=gen) * 48).clamp(-448, 448).to(torch.float8_e4m3fn)

    def scale(n: int, k: int) -> torch.Tensor:
        return 2.0 ** torch.randint(-12, -8, (n // 128, k // 128), generator=gen).float()

    return {
        "w13": fp8(2 * INTER, HIDDEN),
        "w13_scale": scale(2 * INTER, HIDDEN),
        "w2": fp8(HIDDEN, INTER),
        "w2_scale": scale(HIDDEN, INTER),
    }


def _x(m: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, HIDDEN, generator=gen) * 0.5).to(torch.bfloat16)


@pytest.fixture
def weights() -> dict[str, torch.Tensor]:
    ops.clear_registry()
    yield _weights()
    ops.clear_registry()
    ops.set_registry_capacity(ops.DEFAULT_CAPACITY)


def _args(w: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (w["w13"], w["w13_scale"], w["w2"], w["w2_scale"])


def test_import_mlpjit_does_not_register_the_op() -> None:
    code = (
        "import sys, mlpjit; assert 'torch' not in sys.modules, 'import mlpjit imported torch'; "
        "import torch; assert not hasattr(torch.ops.mlpjit, 'dense_mlp'); "
        "import mlpjit.ops; assert hasattr(torch.ops.mlpjit, 'dense_mlp'); print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_schema() -> None:
    schema = str(torch.ops.mlpjit.dense_mlp.default._schema)
    assert schema == (
        "mlpjit::dense_mlp(Tensor x, Tensor w13, Tensor w13_scale, Tensor w2, "
        "Tensor w2_scale, float? limit=None, bool ue8m0=True) -> Tensor"
    )


@pytest.mark.parametrize("m", [1, 5, 13])
def test_fake_impl_shapes_and_dtype(weights, m: int) -> None:
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) for k, v in weights.items()}
        x = mode.from_tensor(_x(m))
        out = torch.ops.mlpjit.dense_mlp(x, *_args(fake), 0.5, True)
    assert tuple(out.shape) == (m, HIDDEN)
    assert out.dtype == torch.bfloat16
    assert ops.registry_size() == 0  # the fake impl builds nothing


def test_fake_impl_rejects_mismatched_shapes(weights) -> None:
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) for k, v in weights.items()}
        x = mode.from_tensor(torch.zeros(2, HIDDEN + 128, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="x must be"):
            torch.ops.mlpjit.dense_mlp(x, *_args(fake), None, False)


@pytest.mark.parametrize(("limit", "ue8m0"), [(None, True), (0.75, False)])
def test_eager_op_equals_reference(weights, limit, ue8m0: bool) -> None:
    x = _x(3)
    out = ops.dense_mlp(x, *_args(weights), limit, ue8m0)
    expected = ref.dense_mlp_reference(x, *_args(weights), limit=limit, ue8m0=ue8m0)
    assert torch.equal(out, expected)
    assert ops.registry_size() == 1


class _Model(torch.nn.Module):
    """Two layers of the op with a residual, as a server's decoder would call it."""

    def __init__(self, layers: list[dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(ops.DenseMlpOp(**w, ue8m0=True) for w in layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return x * 0.5


def test_torch_compile_fullgraph_equals_eager(weights) -> None:
    torch._dynamo.reset()
    model = _Model([weights, _weights(seed=7)])
    compiled = torch.compile(model, fullgraph=True)  # a graph break would raise
    for m in (2, 3, 8):
        x = _x(m, seed=m)
        assert torch.equal(compiled(x), model(x)), f"m={m}"


def test_op_is_in_the_traced_graph(weights) -> None:
    torch._dynamo.reset()
    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    layer = ops.DenseMlpOp(**weights)
    out = torch.compile(layer, fullgraph=True, backend=backend)(_x(4))
    assert tuple(out.shape) == (4, HIDDEN)
    assert len(graphs) == 1
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.mlpjit.dense_mlp.default in targets


def test_opcheck(weights) -> None:
    args = (_x(4), *_args(weights), None, True)
    # test_schema compares inputs before/after with allclose, which CPU lacks for FP8: the
    # no-mutation check is done by hand below instead.
    result = torch.library.opcheck(
        torch.ops.mlpjit.dense_mlp.default,
        args,
        test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    assert set(result.values()) == {"SUCCESS"}
    before = [a.view(torch.uint8).clone() if a.element_size() == 1 else a.clone() for a in args[:5]]
    torch.ops.mlpjit.dense_mlp(*args)
    after = [a.view(torch.uint8) if a.element_size() == 1 else a for a in args[:5]]
    assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True))


def test_registry_keys_on_identity_and_options(weights) -> None:
    a = ops.get_mlp(*_args(weights), limit=None, ue8m0=True)
    assert ops.get_mlp(*_args(weights), limit=None, ue8m0=True) is a
    # A view over the same memory (what torch.compile may pass) finds the same layer.
    views = [t.view(t.shape) for t in _args(weights)]
    assert ops.get_mlp(*views, limit=None, ue8m0=True) is a
    assert ops.get_mlp(*_args(weights), limit=2.0, ue8m0=True) is not a
    assert ops.get_mlp(*_args(weights), limit=None, ue8m0=False) is not a
    copies = [t.clone() for t in _args(weights)]
    assert ops.get_mlp(*copies, limit=None, ue8m0=True) is not a
    assert ops.registry_size() == 4


def test_registry_is_bounded_lru(weights) -> None:
    ops.set_registry_capacity(2)
    first = ops.get_mlp(*_args(weights))
    second = ops.get_mlp(*_args(_weights(seed=1)))
    assert ops.get_mlp(*_args(weights)) is first  # first is now the most recently used
    ops.get_mlp(*_args(_weights(seed=2)))  # evicts second
    assert ops.registry_size() == 2
    assert ops.get_mlp(*_args(weights)) is first
    ops.clear_registry()
    assert ops.registry_size() == 0
    del second
    with pytest.raises(ValueError, match="capacity"):
        ops.set_registry_capacity(0)


def test_scales_must_be_float32(weights) -> None:
    bad = dict(weights)
    bad["w2_scale"] = weights["w2_scale"].to(torch.float8_e8m0fnu)
    with pytest.raises(ValueError, match="w2_scale must be a float32 tensor"):
        ops.dense_mlp(_x(1), *_args(bad), None, True)


def test_prepare_on_cpu_builds_the_layer(weights) -> None:
    mlp = ops.prepare(*_args(weights), range(1, 9), ue8m0=True)
    assert mlp.path(1) == "reference"
    assert ops.get_mlp(*_args(weights), ue8m0=True) is mlp
    module = ops.DenseMlpOp(**weights, ue8m0=True)
    assert module.prepare([1, 2]) is mlp
    assert "hidden=256" in repr(module)


@pytest.fixture()
def op_calls(monkeypatch):
    """Count the calls that go through the custom op (its CPU implementation)."""
    calls = []
    real = ops.get_mlp

    def counting(*args, **kwargs):
        import inspect

        calls.append(any(f.function == "dense_mlp_op" for f in inspect.stack()[1:4]))
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "get_mlp", counting)
    return calls


def test_eager_calls_skip_the_op_dispatch(weights, op_calls) -> None:
    """A plain eager call runs the layer directly (the same tensor as through the op)."""
    x = _x(3)
    direct = ops.dense_mlp(x, *_args(weights), None, True)
    through_op = torch.ops.mlpjit.dense_mlp(x, *_args(weights), None, True)
    assert op_calls == [False, True]
    assert torch.equal(direct, through_op)
    layer = ops.DenseMlpOp(**weights)
    op_calls.clear()
    assert torch.equal(layer(x), direct)
    assert op_calls == [False]


def test_traced_or_intercepted_calls_go_through_the_op(weights, op_calls) -> None:
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.overrides import TorchFunctionMode
    from torch.utils.flop_counter import FlopCounterMode

    x = _x(2)
    with FlopCounterMode(display=False):
        ops.dense_mlp(x, *_args(weights), None, True)
    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        ops.dense_mlp(x, *_args(weights), None, True)
    assert op_calls == [True, True]
    graph = make_fx(lambda x: ops.dense_mlp(x, *_args(weights), None, True))(x)
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.mlpjit.dense_mlp.default]
    assert not ops._direct(x.clone().requires_grad_())
    with FakeTensorMode() as mode:
        assert not ops._direct(mode.from_tensor(x))
