"""mlpjit.planning: model and checkpoint shapes, shard plans and their stock-path notes
(worded from the kernel's own support answer), request files, parameter grids, and which
model layers an entry serves. Pure Python: no compile, no GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlpjit import planning
from mlpjit.errors import UsageError
from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels.fp8_gemv.tuning import kernel_supports
from mlpjit.layer_plan import dense_mlp_requests
from mlpjit.models import PRESETS
from mlpjit.planning import LayerShape, ShardRole

ARCH = "sm_90a"


def _plan(shapes, tp, tokens=range(1, 9)):
    return planning.shard_plan(shapes, tp=tp, tokens=list(tokens), arch=ARCH, ue8m0=True)


def test_model_shapes_layers_and_notes() -> None:
    shapes, notes = planning.model_shapes("glm5", 8)
    assert shapes == [
        LayerShape(6144, 12288, "glm5 dense MLP"),
        LayerShape(6144, 2048, "glm5 shared expert"),
    ]
    assert notes == []
    assert planning.model_shapes("kimi-k2", 8, ["shared"])[0] == [
        LayerShape(7168, 2048, "deepseek-v3 shared expert")
    ]
    shapes, notes = planning.model_shapes("qwen3-8b", 8)
    assert [s.label for s in shapes] == ["qwen3-8b dense MLP"]
    assert notes == ["qwen3-8b has no shared expert; warming its dense layers only"]


@pytest.mark.parametrize(
    "args, argument, match",
    [
        (("qwen3-8b", 8, ["shared"]), "--layers", "has no shared expert: --layers shared"),
        (("glm5", 7), "--tp", "tp must divide glm5's dense MLP intermediate size 12288, got 7"),
        (("glm6", 8), "--model", "unknown model preset 'glm6'"),
    ],
)
def test_model_shapes_errors_name_the_argument(args, argument: str, match: str) -> None:
    with pytest.raises(UsageError, match=match) as raised:
        planning.model_shapes(*args)
    assert raised.value.argument == argument


def test_shard_plan_is_the_kernel_planner_deduplicated() -> None:
    shapes, _ = planning.model_shapes("glm5", 8)
    plan = _plan(shapes + shapes, 8)
    want = [
        r
        for s in shapes
        for r in dense_mlp_requests(s.hidden, s.intermediate, 8, range(1, 9), ARCH)
    ]
    assert plan.requests == want and plan.notes == []


def test_a_stock_layer_is_a_note_and_the_rest_is_planned() -> None:
    shapes, _ = planning.model_shapes("glm4.5", 8)
    plan = _plan(shapes, 8)
    assert plan.notes == [
        "glm4.5 shared expert runs the stock path at tp 8: tp 8 does not divide intermediate "
        "1536 into multiples of 128 (each rank gets 192)"
    ]
    assert {(r.params["rows"], r.params["k"]) for r in plan.requests} == {
        (2 * 12288 // 8, 5120),
        (5120, 12288 // 8),
    }


@pytest.mark.parametrize(
    "shape, tp, tokens, argument, match",
    [
        (LayerShape(100, 100, "x"), 1, [1], None, "hidden 100 is not a multiple of 128"),
        (LayerShape(6144, 12288, "x"), 192, [1], None, "tp 192 does not divide intermediate"),
        (LayerShape(6144, 12288, "x"), 8, [9, 16], "--tokens", "no token count in 9..16"),
    ],
)
def test_no_kernel_at_all_is_an_error_saying_why(shape, tp, tokens, argument, match) -> None:
    with pytest.raises(UsageError, match=match) as raised:
        _plan([shape], tp, tokens)
    assert raised.value.argument == argument
    assert str(raised.value).startswith(f"no kernels to warm for hidden {shape.hidden}, ")


@pytest.mark.parametrize(
    "hidden, intermediate, tp, reason",
    [
        (100, 128, 1, "hidden 100 is not a multiple of 128"),
        (6144, 12288, 192, "tp 192 does not divide intermediate 12288 into multiples of 128"),
        (5120, 1536, 8, "tp 8 does not divide intermediate 1536 into multiples of 128"),
    ],
)
def test_stock_reason_is_given_for_what_the_kernel_refuses(
    hidden: int, intermediate: int, tp: int, reason: str
) -> None:
    inter = intermediate // tp
    assert not (kernel_supports(2 * inter, hidden, 1) and kernel_supports(hidden, inter, 1))
    assert planning.stock_reason(hidden, intermediate, tp, [1]).startswith(reason)


def test_shard_roles_invert_the_planner() -> None:
    """Every kernel the planner gives a preset's layer (fp8_stream's down projections too)
    maps back to that layer, TP and half."""
    kernels = set()
    for preset in PRESETS.values():
        for layer, intermediate in preset.layers().items():
            for tp in (1, 2, 4, 8):
                if intermediate % tp:
                    continue
                for r in dense_mlp_requests(preset.hidden, intermediate, tp, [1], ARCH):
                    half = "gate_up" if r.params["swiglu"] else "down"
                    roles = planning.shard_roles(r.kernel, dict(r.params))
                    assert ShardRole(preset.name, layer, tp, half) in roles
                    kernels.add(r.kernel)
    assert kernels == {"fp8_gemv", "fp8_stream"}
    assert str(ShardRole("glm5", "dense", 8, "down")) == "glm5 dense tp8 down"
    assert planning.shard_roles("smoke", {"n": 1024}) == []
    assert planning.shard_roles("fp8_gemv", {"rows": "x"}) == []


def test_param_grid_multiplies_and_is_bounded() -> None:
    requests = planning.param_grid_requests("smoke", [("n", [1, 2]), ("block", [64, 128])], ARCH)
    assert [dict(r.params) for r in requests] == [
        {"n": 1, "block": 64},
        {"n": 1, "block": 128},
        {"n": 2, "block": 64},
        {"n": 2, "block": 128},
    ]
    with pytest.raises(UsageError, match="given twice"):
        planning.param_grid_requests("smoke", [("n", [1]), ("n", [2])], ARCH)
    too_many = [(f"p{i}", list(range(64))) for i in range(3)]
    with pytest.raises(UsageError, match="at most 4096"):
        planning.param_grid_requests("smoke", too_many, ARCH)


def test_read_requests_dedupes_in_order(tmp_path: Path) -> None:
    a = KernelRequest("smoke", {"n": 1}, ARCH)
    b = KernelRequest("smoke", {"n": 2}, ARCH)
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([a.to_json_line(), "", b.to_json_line(), a.to_json_line()]) + "\n")
    assert planning.read_requests(path) == [a, b]
    assert planning.retarget([a], "sm_90") == [KernelRequest("smoke", {"n": 1}, "sm_90")]


@pytest.mark.parametrize(
    "content, match",
    [
        ("{}\n", r"r.jsonl:1: not a kernel request line"),
        (b"\xff\n", r"r.jsonl:1: not UTF-8 text"),
        (None, "is not a regular file"),
    ],
)
def test_bad_request_files_name_the_file(tmp_path: Path, content, match: str) -> None:
    path = tmp_path / "r.jsonl"
    if content is None:
        os.mkfifo(path)  # must be refused, not waited on
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(UsageError, match=match) as raised:
        planning.read_requests(path)
    assert raised.value.path == str(path)


def test_register_kernels_names_a_bad_module(monkeypatch) -> None:
    monkeypatch.setenv("MLPJIT_KERNEL_MODULES", "mlpjit.testing.no_such_module")
    with pytest.raises(UsageError, match="MLPJIT_KERNEL_MODULES: cannot import") as raised:
        planning.register_kernels()
    assert raised.value.argument == "MLPJIT_KERNEL_MODULES"


def test_check_requests_names_the_argument() -> None:
    planning.register_kernels()
    good = dense_mlp_requests(6144, 12288, 8, [1], ARCH)
    planning.check_requests(good)
    bad = [
        (KernelRequest("nope", {}, ARCH), "--kernel", "kernel must be one of"),
        (KernelRequest("fp8_gemv", {"rows": 10**18}, ARCH), "--param", "rows"),
        (KernelRequest(good[0].kernel, good[0].params, "sm_80"), "--arch",
         "cannot warm for sm_80: kernel fp8_gemv compiles for"),
    ]  # fmt: skip
    for request, argument, match in bad:
        with pytest.raises(UsageError, match=match) as raised:
            planning.check_requests([*good, request])
        assert raised.value.argument == argument


@pytest.mark.parametrize(
    "intermediate, tp, match",
    [
        (1000, 3, r"the layer: tp must divide intermediate \(1000\), got 3"),
        (100, 200, "tp must be"),
    ],
)
def test_a_shard_the_planner_refuses_is_a_usage_error(intermediate: int, tp: int, match) -> None:
    with pytest.raises(UsageError, match=match):
        _plan([LayerShape(1024, intermediate, "the layer")], tp)


def test_shard_roles_list_the_smallest_tp_first() -> None:
    """GLM-5's 6144 x 256 down is its shared expert at TP 8 as well as its dense MLP at
    TP 48: `cache ls` shows the first role, so the likelier reading comes first."""
    roles = planning.shard_roles("fp8_gemv", {"rows": 6144, "k": 256, "swiglu": False})
    tps = [role.tp for role in roles]
    assert tps == sorted(tps) and len(tps) >= 2
    assert str(roles[0]) == "glm5 shared tp8 down"
