"""DenseMlp on CPU: validation, the reference fallback, scale forms, prepare without a GPU."""

from __future__ import annotations

import ctypes

import pytest
import torch

from mlpjit import DenseMlp, dense_mlp
from mlpjit import reference as ref
from mlpjit.errors import CaptureError, MlpjitError
from mlpjit.jit.binary import KernelParam

HIDDEN, INTER = 512, 256


def _weights(seed: int = 0, inter: int = INTER) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def fp8(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=gen) * 48).clamp(-448, 448).to(torch.float8_e4m3fn)

    def pow2(n: int, k: int) -> torch.Tensor:
        # power-of-two scales so every scale form can express them
        return 2.0 ** torch.randint(-12, -8, (n // 128, k // 128), generator=gen)

    return {
        "w13": fp8(2 * inter, HIDDEN),
        "w13_scale": pow2(2 * inter, HIDDEN),
        "w2": fp8(HIDDEN, inter),
        "w2_scale": pow2(HIDDEN, inter),
    }


def _x(m: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, HIDDEN, generator=gen) + 0.05).to(torch.bfloat16)


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return _weights()


def _mlp(weights: dict[str, torch.Tensor], **kw: object) -> DenseMlp:
    args = dict(weights)
    args.update(kw)
    return DenseMlp(**args)  # type: ignore[arg-type]


# ---- the CPU path equals the reference ----------------------------------------------------------


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("limit", [None, 0.75])
@pytest.mark.parametrize("m", [1, 3, 8, 13])
def test_cpu_call_equals_reference(weights, m: int, limit, ue8m0: bool) -> None:
    mlp = _mlp(weights, limit=limit, ue8m0=ue8m0)
    x = _x(m)
    expected = ref.dense_mlp_reference(
        x,
        weights["w13"],
        weights["w13_scale"],
        weights["w2"],
        weights["w2_scale"],
        limit=limit,
        ue8m0=ue8m0,
    )
    assert mlp.path(m) == "reference"
    got = mlp(x)
    assert got.dtype == torch.bfloat16 and got.shape == (m, HIDDEN)
    assert torch.equal(got, expected)
    out = torch.full((m, HIDDEN), float("nan"), dtype=torch.bfloat16)
    assert mlp(x, out=out) is out and torch.equal(out, expected)


def test_forward_into_writes_act_and_out(weights) -> None:
    mlp = _mlp(weights, limit=1.5, ue8m0=True)
    x = _x(4)
    act = torch.full((4, INTER), float("nan"), dtype=torch.bfloat16)
    out = torch.full((4, HIDDEN), float("nan"), dtype=torch.bfloat16)
    assert mlp.forward_into(x, act, out) is out
    exp_act = ref.gemv_reference(
        x, weights["w13"], weights["w13_scale"], swiglu=True, limit=1.5, ue8m0=True
    )
    assert torch.equal(act, exp_act)
    assert torch.equal(out, mlp(x))


def test_limit_changes_the_result(weights) -> None:
    x = _x(2) * 8
    assert not torch.equal(_mlp(weights)(x), _mlp(weights, limit=0.1)(x))


# ---- scale forms ---------------------------------------------------------------------------------


def _pack_ue8m0(scale: torch.Tensor) -> torch.Tensor:
    exps = (torch.log2(scale).round().to(torch.int64) + 127).clamp(0, 254)
    n, kb = exps.shape
    cols = -(-kb // 4)
    padded = torch.zeros(n, cols * 4, dtype=torch.int64)
    padded[:, :kb] = exps
    words = sum(padded[:, j::4] << (8 * j) for j in range(4))
    return ((words + 2**31) % 2**32 - 2**31).to(torch.int32)


@pytest.mark.parametrize("form", ["e8m0", "packed"])
def test_scale_forms_match_float32(weights, form: str) -> None:
    def convert(s: torch.Tensor) -> torch.Tensor:
        if form == "e8m0":
            return s.to(torch.float8_e8m0fnu)
        return _pack_ue8m0(s)

    base = _mlp(weights)
    other = _mlp(
        weights, w13_scale=convert(weights["w13_scale"]), w2_scale=convert(weights["w2_scale"])
    )
    assert torch.equal(other.w13_scale, base.w13_scale)
    assert torch.equal(other.w2_scale, base.w2_scale)
    x = _x(3)
    assert torch.equal(other(x), base(x))


def test_no_weight_copies(weights) -> None:
    mlp = _mlp(weights)
    assert mlp.w13.data_ptr() == weights["w13"].data_ptr()
    assert mlp.w2.data_ptr() == weights["w2"].data_ptr()
    assert mlp.w13_scale.data_ptr() == weights["w13_scale"].data_ptr()
    assert mlp.w2_scale.data_ptr() == weights["w2_scale"].data_ptr()


# ---- prepare on a CPU-only machine ---------------------------------------------------------


def test_prepare_on_cpu_is_a_validated_no_op(weights) -> None:
    mlp = _mlp(weights)
    mlp.prepare(range(1, 9))
    mlp.prepare([1, 1, 200])
    assert mlp.arch is None
    assert "prepared=[]" in repr(mlp)
    with pytest.raises(ValueError, match="tokens must be ints >= 1"):
        mlp.prepare([0])
    with pytest.raises(ValueError, match="tokens must be ints >= 1"):
        mlp.prepare([2.0])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="tokens must be an iterable"):
        mlp.prepare(8)  # type: ignore[arg-type]


# ---- bad input: ValueError naming the argument ---------------------------------------------------


def _bad_weight_cases(w: dict[str, torch.Tensor]) -> list[tuple[dict, str]]:
    bf16 = w["w13"].to(torch.bfloat16)
    return [
        ({"w13": bf16}, r"w13 must have dtype torch.float8_e4m3fn"),
        ({"w2": w["w2"].float()}, r"w2 must have dtype torch.float8_e4m3fn"),
        ({"w13": w["w13"].reshape(-1)}, r"w13 must be 2-D"),
        ({"w13": w["w13"].unsqueeze(0)}, r"w13 must be 2-D"),
        ({"w2": w["w2"][:, :128]}, r"w2 must be contiguous"),
        ({"w13": w["w13"].t()}, r"w13 must be contiguous"),
        ({"w2": w["w2"][:256].contiguous()}, r"w2 must be \[hidden, intermediate\]"),
        ({"w13": w["w13"][:510].contiguous()}, r"w2 must be \[hidden, intermediate\]"),
        ({"w13": w["w13"][:511].contiguous()}, r"w13 must have an even number of rows"),
        ({"w13": [[1.0]]}, r"w13 must be a torch.Tensor"),
        ({"w13_scale": w["w13_scale"][:, :3]}, r"w13_scale must be .*\[4, 4\]"),
        ({"w2_scale": w["w2_scale"].double()}, r"w2_scale must be .*\[4, 2\]"),
        ({"w2_scale": w["w2_scale"].t()}, r"w2_scale must be .*\[4, 2\]"),
        ({"w2_scale": w["w2_scale"].to(torch.int32)}, r"w2_scale must be .*int32 \[4, 1\]"),
        ({"w13_scale": w["w13_scale"].to("meta")}, r"w13_scale must be on the weights' device"),
        ({"limit": 0.0}, r"limit must be None or a finite number > 0"),
        ({"limit": -1}, r"limit must be None or a finite number > 0"),
        ({"limit": float("inf")}, r"limit must be None or a finite number > 0"),
        ({"limit": "7"}, r"limit must be None or a finite number > 0"),
        ({"limit": True}, r"limit must be None or a finite number > 0"),
        ({"limit": 10**400}, r"limit must be None or a finite number > 0 .*got an integer of"),
        ({"limit": 1e39}, r"limit must be None or a finite number > 0 within BF16's range"),
        ({"ue8m0": 1}, r"ue8m0 must be a bool"),
    ]


@pytest.mark.parametrize("case", range(23))
def test_bad_construction(weights, case: int) -> None:
    cases = _bad_weight_cases(weights)
    assert len(cases) == 23
    change, message = cases[case]
    with pytest.raises(ValueError, match=message):
        _mlp(weights, **change)


def test_weights_on_different_devices(weights) -> None:
    with pytest.raises(ValueError, match="w2 must be on w13's device"):
        _mlp(weights, w2=weights["w2"].to("meta"))


def test_hidden_not_a_multiple_of_128() -> None:
    w13 = torch.zeros(256, 192, dtype=torch.float8_e4m3fn)
    w2 = torch.zeros(192, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"hidden \(192\) .* multiples of 128"):
        DenseMlp(w13, torch.ones(2, 1), w2, torch.ones(1, 1))


class _Marked(torch.Tensor):
    """A Tensor subclass (as torch.compile's fake tensors and other wrappers are)."""


@pytest.mark.parametrize(
    "make_x,message",
    [
        (lambda: _x(2).float(), r"x must have dtype torch.bfloat16"),
        (lambda: _x(2).to("meta"), r"x must be on the weights' device"),
        (lambda: _x(2).reshape(-1), r"x must be \[m, hidden=512\]"),
        (lambda: _x(2).reshape(2, 1, 512), r"x must be \[m, hidden=512\]"),
        (lambda: _x(2)[:, :256], r"x must be \[m, hidden=512\]"),
        (lambda: torch.zeros(2, 256, dtype=torch.bfloat16), r"x must be \[m, hidden=512\]"),
        (lambda: torch.zeros(0, 512, dtype=torch.bfloat16), r"m >= 1"),
        (lambda: _x(4)[::2], r"x must be contiguous"),
        (lambda: torch.zeros(HIDDEN, 2, dtype=torch.bfloat16).t(), r"x must be contiguous"),
        (lambda: "x", r"x must be a torch.Tensor"),
        # Tensor subclasses take the full checks: the same messages
        (lambda: _x(2).float().as_subclass(_Marked), r"x must have dtype torch.bfloat16"),
        (lambda: _x(2).as_subclass(_Marked).to("meta"), r"x must be on the weights' device"),
        (lambda: _x(2).reshape(-1).as_subclass(_Marked), r"x must be \[m, hidden=512\]"),
        (lambda: _x(4)[::2].as_subclass(_Marked), r"x must be contiguous"),
        (lambda: _x(0).as_subclass(_Marked), r"m >= 1"),
    ],
)
def test_bad_x(weights, make_x, message: str) -> None:
    mlp = _mlp(weights)
    with pytest.raises(ValueError, match=message):
        mlp(make_x())
    with pytest.raises(ValueError, match=message):
        mlp.forward_into(
            make_x(),
            torch.empty(2, INTER, dtype=torch.bfloat16),
            torch.empty(2, HIDDEN, dtype=torch.bfloat16),
        )


def test_good_x_of_any_kind_is_accepted(weights) -> None:
    """What x's checks accept, whichever way they take: a Tensor subclass, a parameter, one
    token whose row stride is unusual (contiguous all the same)."""
    mlp = _mlp(weights)
    x = _x(3)
    want = mlp(x)
    assert torch.equal(mlp(x.as_subclass(_Marked)), want)
    assert torch.equal(mlp(torch.nn.Parameter(x, requires_grad=False)), want)
    one = torch.zeros(1, 2 * HIDDEN, dtype=torch.bfloat16)[:, :HIDDEN]  # strides (1024, 1)
    one.copy_(x[:1])
    assert one.is_contiguous() and one.stride() != (HIDDEN, 1)
    assert torch.equal(mlp(one), want[:1])


@pytest.mark.parametrize(
    "out,message",
    [
        (torch.empty(3, HIDDEN, dtype=torch.float32), r"out must have dtype torch.bfloat16"),
        (torch.empty(2, HIDDEN, dtype=torch.bfloat16), r"out must have shape \[3, 512\]"),
        (torch.empty(3, 256, dtype=torch.bfloat16), r"out must have shape \[3, 512\]"),
        (torch.empty(3 * HIDDEN, dtype=torch.bfloat16), r"out must have shape \[3, 512\]"),
        (torch.empty(HIDDEN, 3, dtype=torch.bfloat16).t(), r"out must be contiguous"),
        (torch.empty(3, HIDDEN, dtype=torch.bfloat16, device="meta"), r"out must be on"),
        (object(), r"out must be a torch.Tensor"),
    ],
)
def test_bad_out(weights, out, message: str) -> None:
    mlp = _mlp(weights)
    with pytest.raises(ValueError, match=message):
        mlp(_x(3), out=out)


def test_bad_act_buffer(weights) -> None:
    mlp = _mlp(weights)
    out = torch.empty(3, HIDDEN, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"act must have shape \[3, 256\]"):
        mlp.forward_into(_x(3), torch.empty(3, HIDDEN, dtype=torch.bfloat16), out)


# ---- the kernel path's orchestration, with fake kernels (no GPU) ---------------------------------


def _tensor_at(address: int, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor over raw memory: what a kernel sees behind a pointer parameter."""
    count = shape[0] * shape[1] * torch.empty((), dtype=dtype).element_size()
    raw = (ctypes.c_char * count).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(shape)


class _FakeKernel:
    """Stands in for a LoadedKernel: computes what the fp8_gemv launch would from the raw
    pointers it is given (so wrong pointers give wrong results), and records them."""

    params = tuple(KernelParam(name, "ptr") for name in ("out", "x", "w", "w_scale"))
    symbol = "fake_fp8_gemv"
    key = "f" * 64

    def __init__(self, request_params: dict, log: list, kernel: str = "fp8_gemv") -> None:
        self.request = request_params
        self.log = log
        if kernel == "fp8_stream":  # its fifth pointer: a workspace (never touched here)
            self.params = (*_FakeKernel.params, KernelParam("workspace", "ptr"))
            self.symbol = "fake_fp8_stream"

    def launch_unchecked(self, slots, pdl=None, stream=None) -> None:
        p = self.request
        rows, k, m = p["rows"], p["k"], p["tokens"]
        out_ptr, x_ptr, w_ptr, ws_ptr = slots[:4]
        self.log.append((m, p["swiglu"], tuple(slots)))
        out = _tensor_at(out_ptr, (m, rows // 2 if p["swiglu"] else rows), torch.bfloat16)
        x = _tensor_at(x_ptr, (m, k), torch.bfloat16)
        w = _tensor_at(w_ptr, (rows, k), torch.float8_e4m3fn)
        w_scale = _tensor_at(ws_ptr, (rows // 128, k // 128), torch.float32)
        out.copy_(
            ref.gemv_reference(
                x, w, w_scale, swiglu=p["swiglu"], limit=p["limit"], ue8m0=p["ue8m0"]
            )
        )


class _FakePair:
    """Stands in for a launcher.KernelPair of two fake kernels: launches them in order."""

    def __init__(self, first: _FakeKernel, second: _FakeKernel) -> None:
        self.first, self.second = first, second

    def launch(self, first_slots, second_slots, pdl, stream) -> None:
        self.first.launch_unchecked(first_slots, pdl, stream)
        self.second.launch_unchecked(second_slots, pdl, stream)

    def launch_joined(self, slots, pdl, stream) -> None:
        count = len(self.first.params)
        assert len(slots) == count + len(self.second.params)
        self.launch(slots[:count], slots[count:], pdl, stream)


class _FakeManager:
    def __init__(self) -> None:
        self.warmed: list = []

    def warm(self, requests):
        self.warmed.append(list(requests))
        return list(requests)  # the "entries" are the requests themselves


KERNEL_INTER = 512  # the kernels need k % 512 == 0 for the down projection too


@pytest.fixture(scope="module")
def kernel_weights() -> dict[str, torch.Tensor]:
    return _weights(seed=5, inter=KERNEL_INTER)


@pytest.fixture()
def fake_kernel_path(monkeypatch, kernel_weights):
    """A DenseMlp whose planning believes it is on sm_90a, with fake manager and launcher."""
    import mlpjit.jit.capture as capture
    import mlpjit.jit.launcher as launcher
    import mlpjit.jit.manager as manager
    from mlpjit.jit import loaded

    loaded.clear()
    log: list = []
    fake = _FakeManager()
    monkeypatch.setattr(manager, "default_manager", lambda: fake)
    monkeypatch.setattr(
        launcher, "load_kernel", lambda e, d: _FakeKernel(dict(e.params), log, e.kernel)
    )
    monkeypatch.setattr(launcher, "kernel_pair", _FakePair)
    # CPU stand-ins for torch's current stream handle and the driver's capture query.
    # "asked": the handles the capture query was asked about, in order.
    streams: dict = {"current": 0, "capturing": set(), "asked": []}
    monkeypatch.setattr(launcher, "stream_handle_getter", lambda: lambda index: streams["current"])

    def stream_capturing(handle: int) -> bool:
        streams["asked"].append(handle)
        return handle in streams["capturing"]

    monkeypatch.setattr(capture, "stream_capturing", stream_capturing)
    monkeypatch.setattr(dense_mlp, "_KEPT_ACT", {})  # a fresh process-wide act registry
    mlp = _mlp(kernel_weights, limit=2.0, ue8m0=True)
    mlp.arch = "sm_90a"
    mlp.streams = streams
    return mlp, fake, log


def test_prepare_plans_for_its_sm_count(fake_kernel_path) -> None:
    """prepare() puts the device's SM count (DenseMlp.sms) into every request: an H20's 78
    sizes the persistent grids; the H200's 132 is the kernels' default and stays out."""
    mlp, fake, _ = fake_kernel_path
    assert mlp.sms == 132  # weights off CUDA: the default
    mlp.sms = 78
    mlp.prepare([1, 8])
    assert {r.params["sms"] for r in fake.warmed[0]} == {78}


def test_kernel_path_prepare_and_launch_order(fake_kernel_path, kernel_weights) -> None:
    weights = kernel_weights
    mlp, fake, log = fake_kernel_path
    assert [mlp.path(m) for m in (1, 8, 9)] == ["kernel", "kernel", "reference"]
    mlp.prepare(range(1, 9))
    mlp.prepare([3, 9])  # nothing left to load
    assert len(fake.warmed) == 1 and len(fake.warmed[0]) == 16
    gate_up = [r for r in fake.warmed[0] if r.params["swiglu"]]
    assert {r.params["limit"] for r in gate_up} == {2.0}
    assert {r.params["limit"] for r in fake.warmed[0] if not r.params["swiglu"]} == {None}
    assert {(r.params["rows"], r.params["k"]) for r in gate_up} == {(2 * KERNEL_INTER, HIDDEN)}
    x = _x(3)
    out = mlp(x)
    (m1, swiglu1, slots1), (m2, swiglu2, slots2) = log
    assert (m1, swiglu1, m2, swiglu2) == (3, True, 3, False)
    act_ptr = slots1[0]
    assert slots1[1:3] == (x.data_ptr(), weights["w13"].data_ptr())
    assert slots2 == (out.data_ptr(), act_ptr, weights["w2"].data_ptr(), mlp.w2_scale.data_ptr())
    assert torch.equal(out, ref.dense_mlp_reference(x, limit=2.0, ue8m0=True, **weights))
    act, out2 = torch.empty(3, KERNEL_INTER, dtype=torch.bfloat16), torch.empty_like(out)
    assert mlp.forward_into(x, act, out2) is out2 and torch.equal(out2, out)
    assert log[-2][2][0] == act.data_ptr() and log[-1][2][:2] == (out2.data_ptr(), act.data_ptr())
    assert torch.equal(
        act,
        ref.gemv_reference(x, weights["w13"], mlp.w13_scale, swiglu=True, limit=2.0, ue8m0=True),
    )


def test_kernel_path_takes_x_of_any_kind(fake_kernel_path) -> None:
    """A Tensor subclass x passes the full checks and launches like a plain one."""
    mlp, _fake, log = fake_kernel_path
    x = _x(2)
    want = mlp(x)
    assert torch.equal(mlp(x.as_subclass(_Marked)), want)
    assert log[-2][2][1] == x.data_ptr()


def test_layers_of_one_signature_share_one_load(fake_kernel_path, kernel_weights) -> None:
    """Many layers of one shape and options: the first loads its pairs (one warm), the rest
    take the same pairs without asking the manager or the kernel memo; a layer that differs
    in an option, the SM count or a token count loads its own."""
    from mlpjit.jit import loaded

    mlp, fake, _ = fake_kernel_path
    mlp.prepare([1, 2])
    asked = loaded.stats().asked
    twins = [_mlp(kernel_weights, limit=2.0, ue8m0=True) for _ in range(3)]
    for twin in twins:
        twin.arch = "sm_90a"
        twin.prepare([2, 1])
    assert len(fake.warmed) == 1 and loaded.stats().asked == asked
    assert all(twin._kernels[m] is mlp._kernels[m] for twin in twins for m in (1, 2))
    twins[0].prepare([1, 3])  # one new count: only its two kernels
    assert [len(w) for w in fake.warmed] == [4, 2]
    other = _mlp(kernel_weights, limit=None, ue8m0=True)
    other.arch = "sm_90a"
    other.prepare([1])
    assert {r.params["limit"] for r in fake.warmed[-1] if r.params["swiglu"]} == {None}
    fewer_sms = _mlp(kernel_weights, limit=2.0, ue8m0=True)
    fewer_sms.arch, fewer_sms.sms = "sm_90a", 78
    fewer_sms.prepare([1])
    assert {r.params.get("sms") for r in fake.warmed[-1]} == {78}
    assert len(fake.warmed) == 4
    loaded.clear()  # forgets the shared pairs with the kernels
    again = _mlp(kernel_weights, limit=2.0, ue8m0=True)
    again.arch = "sm_90a"
    again.prepare([1])
    assert len(fake.warmed) == 5


def test_act_buffers_come_from_prepare_for_its_thread_and_stream(fake_kernel_path) -> None:
    import threading

    mlp, _fake, log = fake_kernel_path
    x = _x(2)
    weights = {k: getattr(mlp, k) for k in ("w13", "w13_scale", "w2", "w2_scale")}
    want = ref.dense_mlp_reference(x, limit=2.0, ue8m0=True, **weights)

    def act_of_call() -> int:  # the act pointer the call's gate_up wrote
        assert torch.equal(mlp(x), want)
        return log[-2][2][0]

    mlp(_x(3))  # prepared lazily by the call: no buffer is kept for it
    assert dense_mlp._KEPT_ACT == {}
    mlp.prepare([2, 3])
    kept = {key[3]: buf.data_ptr() for key, buf in dense_mlp._KEPT_ACT.items()}
    assert sorted(kept) == [2, 3]
    mlp.streams["asked"].clear()
    assert act_of_call() == act_of_call() == kept[2]  # prepare's thread and stream: reused
    mlp.streams["current"] = 7
    assert act_of_call() not in kept.values()  # another stream: allocated per call
    from_thread = []
    mlp.streams["current"] = 0
    thread = threading.Thread(target=lambda: from_thread.append(act_of_call()))
    thread.start()
    thread.join()
    assert from_thread and from_thread[0] not in kept.values()  # another thread: the same
    # Handle 0, the legacy default stream, cannot capture: its calls never ask (nor do calls
    # without a kept buffer).
    assert mlp.streams["asked"] == []
    # A side stream prepared on keeps its own buffers. While it captures, no call gets one
    # (a replay may run on any stream at any time), also right after calls that did, and
    # prepare keeps none; after the capture, calls reuse them again.
    mlp.streams["current"] = 5
    mlp.prepare([2])
    side = dense_mlp._KEPT_ACT[(-1, threading.get_ident(), 5, 2, KERNEL_INTER)].data_ptr()
    assert act_of_call() == act_of_call() == side
    mlp.streams["capturing"].add(5)
    asked = len(mlp.streams["asked"])
    assert act_of_call() not in (side, *kept.values())  # capturing: never a kept buffer
    assert act_of_call() not in (side, *kept.values())
    assert mlp.streams["asked"][asked:] == [5, 5]  # asked on every call
    mlp.prepare([2, 3])  # while capturing: keeps nothing (3 has no buffer on this stream)
    assert len(dense_mlp._KEPT_ACT) == 3
    mlp.streams["capturing"].clear()
    assert act_of_call() == side
    mlp.streams["current"] = 0
    # Another layer of the same size shares the buffers (stream order covers it too).
    other = _mlp({k: getattr(mlp, k) for k in ("w13", "w13_scale", "w2", "w2_scale")})
    other.arch = "sm_90a"
    other.prepare([2])
    assert len(dense_mlp._KEPT_ACT) == 3
    assert torch.equal(other(x), ref.dense_mlp_reference(x, **weights))
    assert log[-2][2][0] == kept[2]


def test_a_failed_prepare_leaves_the_loaded_counts_usable(fake_kernel_path, monkeypatch) -> None:
    import mlpjit.jit.launcher as launcher

    mlp, _fake, log = fake_kernel_path
    loaded: list[int] = []

    def fail_on_the_second(entry, device):
        loaded.append(entry.params["tokens"])
        if len(loaded) > 2:  # the gate_up of the second count
            raise MlpjitError("no kernel")
        return _FakeKernel(dict(entry.params), log)

    monkeypatch.setattr(launcher, "load_kernel", fail_on_the_second)
    with pytest.raises(MlpjitError, match="no kernel"):
        mlp.prepare([1, 2])
    x = _x(1)
    weights = {k: getattr(mlp, k) for k in ("w13", "w13_scale", "w2", "w2_scale")}
    assert torch.equal(mlp(x), ref.dense_mlp_reference(x, limit=2.0, ue8m0=True, **weights))


def test_weights_are_read_only_and_read_per_call(fake_kernel_path) -> None:
    """A call reads the weights' current addresses, so .data re-pointed is seen."""
    mlp, _fake, log = fake_kernel_path
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        with pytest.raises(AttributeError):
            setattr(mlp, name, getattr(mlp, name))
    x = _x(2)
    mlp(x)
    w2 = mlp.w2
    w2.data = w2.data.clone()  # same values, new storage
    assert log[-1][2][2] != w2.data_ptr()
    mlp(x)
    assert log[-1][2][2] == w2.data_ptr()
    # Every weight and scale: gate_up's slots 2 and 3, then down's.
    for w in (mlp.w13, mlp.w13_scale, mlp.w2, mlp.w2_scale):
        w.data = w.data.clone()
    out = mlp(x)
    (_, _, gate_up), (_, _, down) = log[-2:]
    assert gate_up[2:] == (mlp.w13.data_ptr(), mlp.w13_scale.data_ptr())
    assert down[2:] == (mlp.w2.data_ptr(), mlp.w2_scale.data_ptr())
    weights = {k: getattr(mlp, k) for k in ("w13", "w13_scale", "w2", "w2_scale")}
    assert torch.equal(out, ref.dense_mlp_reference(x, limit=2.0, ue8m0=True, **weights))


def test_kernel_path_refuses_a_kernel_with_another_signature(fake_kernel_path, monkeypatch) -> None:
    """DenseMlp passes raw pointers unchecked, so prepare checks each kernel's parameters."""
    import mlpjit.jit.launcher as launcher

    mlp, _fake, log = fake_kernel_path

    def three_params(entry, device):
        kernel = _FakeKernel(dict(entry.params), log)
        kernel.params = kernel.params[:3]
        return kernel

    monkeypatch.setattr(launcher, "load_kernel", three_params)
    with pytest.raises(MlpjitError, match=r"fake_fp8_gemv .* expected"):
        mlp.prepare([1])
    assert mlp.path(1) == "kernel" and "prepared=[]" in repr(mlp)


@pytest.fixture()
def streamed_halves(monkeypatch):
    """The layer planner sends gate_up and down to fp8_stream at 3 tokens, the down alone
    at 2, neither elsewhere (the fake kernel path's small shape streams nothing)."""
    from mlpjit import layer_plan

    def halves(hidden, inter, tokens, sms=132):
        return {3: (True, True), 2: (False, True)}.get(tokens, (False, False))

    layer_plan._shard_requests.cache_clear()
    monkeypatch.setattr(layer_plan, "stream_halves", halves)
    yield
    layer_plan._shard_requests.cache_clear()


def test_streamed_halves_take_their_output_as_the_workspace_pointer(
    fake_kernel_path, kernel_weights, streamed_halves
) -> None:
    """fp8_stream's cluster form never touches its workspace: DenseMlp passes each streamed
    kernel its own output's address there, and allocates nothing for it."""
    mlp, fake, log = fake_kernel_path
    mlp.prepare([1, 2, 3])
    kinds = {(r.params["tokens"], r.params["swiglu"]): r.kernel for r in fake.warmed[0]}
    assert kinds == {
        (1, True): "fp8_gemv", (1, False): "fp8_gemv", (2, True): "fp8_gemv",
        (2, False): "fp8_stream", (3, True): "fp8_stream", (3, False): "fp8_stream",
    }  # fmt: skip
    assert all(r.params["cluster"] >= 1 for r in fake.warmed[0] if r.kernel == "fp8_stream")
    for m, lengths in ((3, (5, 5)), (2, (4, 5)), (1, (4, 4))):
        log.clear()
        x = _x(m)
        act = torch.empty(m, KERNEL_INTER, dtype=torch.bfloat16)
        out = mlp.forward_into(x, act, torch.empty(m, HIDDEN, dtype=torch.bfloat16))
        (_, _, gate_up), (_, _, down) = log
        assert (len(gate_up), len(down)) == lengths
        assert gate_up[0] == act.data_ptr() and gate_up[4:] in ((), (act.data_ptr(),))
        assert down[:2] == (out.data_ptr(), act.data_ptr()) and down[4:] in ((), (out.data_ptr(),))
        want = ref.dense_mlp_reference(x, limit=2.0, ue8m0=True, **kernel_weights)
        assert torch.equal(out, want) and torch.equal(mlp(x), want)


def test_kernel_path_refuses_an_fp8_stream_kernel_that_reads_a_workspace(
    fake_kernel_path, streamed_halves, monkeypatch
) -> None:
    """Only the cluster form may get a pointer it never uses: the grid-wide form (or a
    trace build) reads and writes its workspace."""
    from mlpjit.kernels.fp8_stream import plan as stream_plan

    monkeypatch.setattr(stream_plan, "choose_cluster", lambda rows, k, sms=132: 0)
    mlp, _fake, _log = fake_kernel_path
    with pytest.raises(MlpjitError, match="grid-wide form or a trace build"):
        mlp.prepare([2])
    assert "prepared=[]" in repr(mlp)
    mlp.prepare([1])  # fp8_gemv's pair: fine


def test_kernel_path_prepares_lazily_and_refuses_during_capture(
    fake_kernel_path, monkeypatch
) -> None:
    mlp, fake, _log = fake_kernel_path
    mlp(_x(2))  # unprepared, not capturing: prepared on first use
    assert len(fake.warmed) == 1 and [r.params["tokens"] for r in fake.warmed[0]] == [2, 2]
    monkeypatch.setattr(mlp, "_capturing", lambda: True)
    mlp(_x(2))  # prepared: fine during capture
    with pytest.raises(CaptureError, match=r"5 tokens .* call prepare\(tokens\)"):
        mlp(_x(5))
    with pytest.raises(CaptureError, match="during CUDA graph capture"):
        mlp.prepare([6])
    assert len(fake.warmed) == 1
    mlp(_x(12))  # the fallback needs nothing prepared, also during capture


def test_kernel_requests_match_the_cli_plan() -> None:
    from mlpjit.dense_mlp import kernel_requests, kernel_supported
    from mlpjit.layer_plan import dense_mlp_requests

    mine = kernel_requests(6144, 1536, range(1, 9), "sm_90a", limit=None, ue8m0=True)
    cli = dense_mlp_requests(6144, 12288, 8, range(1, 9), "sm_90a", ue8m0=True)
    assert mine == cli and len(mine) == 16
    # prepare() plans for its device's SM count (an H20: 78), as `mlpjit warm --sms` does
    h20 = kernel_requests(6144, 1536, [1, 8], "sm_90a", limit=None, ue8m0=True, sms=78)
    assert h20 == dense_mlp_requests(6144, 12288, 8, [1, 8], "sm_90a", ue8m0=True, sms=78)
    assert {r.params["sms"] for r in h20} == {78}
    assert kernel_supported(6144, 1536, 8)
    assert not kernel_supported(6144, 1536, 9)
    assert kernel_supported(7168, 2304, 1)  # 2304 % 512 != 0, a multiple of 128
    assert kernel_supported(5120, 17408, 1)  # Qwen3-14B TP1: in 5 waves
    assert not kernel_supported(1024, 196608, 1)  # more waves than that: stock path


# ---- bad checkpoints: scale values, empty weights ------------------------------------------------


def _with_bad_block(scale: torch.Tensor, value: float) -> torch.Tensor:
    bad = scale.clone()
    bad[1, 0] = value
    return bad


def _e8m0_with_nan_code(scale: torch.Tensor) -> torch.Tensor:
    codes = scale.to(torch.float8_e8m0fnu).view(torch.uint8).clone()
    codes[1, 0] = 0xFF
    return codes.view(torch.float8_e8m0fnu)


def _packed_with_nan_byte(scale: torch.Tensor) -> torch.Tensor:
    packed = _pack_ue8m0(scale)
    # Block [1, 0] is byte 0 of word [1, 0]: replace it with 0xFF.
    packed[1, 0] = (packed[1, 0] & ~0xFF) | 0xFF
    return packed


@pytest.mark.parametrize("name", ["w13_scale", "w2_scale"])
@pytest.mark.parametrize(
    "make_bad,found",
    [
        (lambda s: _with_bad_block(s, float("nan")), r"1 NaN value"),
        (lambda s: _with_bad_block(s, float("inf")), r"1 \+inf value"),
        (lambda s: _with_bad_block(s, -(2.0**-10)), r"1 negative value"),
        (_e8m0_with_nan_code, r"1 NaN value \(the float8_e8m0fnu NaN code 0xFF\)"),
        (_packed_with_nan_byte, r"1 NaN value \(the UE8M0 exponent byte 0xFF"),
    ],
)
def test_bad_scale_values_raise_at_construction(weights, name: str, make_bad, found: str) -> None:
    """A NaN, inf or negative scale (or the e8m0 NaN code) is a loading bug: refused at
    construction, naming the argument, what was found, where, and what is allowed."""
    bad = make_bad(weights[name])
    message = rf"^{name} has {found}.*; first at block \[1, 0\].*must be (finite and >= 0|UE8M0)"
    with pytest.raises(ValueError, match=message):
        _mlp(weights, **{name: bad})


def test_all_nan_scales_report_the_first_block(weights) -> None:
    nan = torch.full_like(weights["w2_scale"], float("nan"))
    with pytest.raises(ValueError, match=r"^w2_scale has 8 NaN values; first at block \[0, 0\]"):
        _mlp(weights, w2_scale=nan)


def test_zero_scale_of_an_all_zero_block_is_accepted(weights) -> None:
    """Zero block scales are legal (an all-zero block quantized without an amax floor) and
    give finite outputs: the block contributes exactly 0."""
    w13 = weights["w13"].clone()
    w13[:128, :128] = 0
    scale = weights["w13_scale"].clone()
    scale[0, 0] = 0.0
    mlp = _mlp(weights, w13=w13, w13_scale=scale)
    out = mlp(_x(3))
    assert torch.isfinite(out.float()).all()
    expected = ref.dense_mlp_reference(
        _x(3), w13, scale, weights["w2"], weights["w2_scale"], limit=None
    )
    assert torch.equal(out, expected)


@pytest.mark.parametrize(
    "w13_shape,w2_shape,bad,bad_shape",
    [
        ((0, 512), (512, 0), "w13", r"\[0, 512\]"),  # intermediate 0
        ((256, 0), (0, 128), "w13", r"\[256, 0\]"),  # hidden 0
        ((0, 0), (0, 0), "w13", r"\[0, 0\]"),
        ((256, 512), (512, 0), "w2", r"\[512, 0\]"),
        ((64, 128), (128, 32), "w13", r"\[64, 128\]"),  # non-empty but below one block
    ],
)
def test_empty_weights_are_refused(w13_shape, w2_shape, bad: str, bad_shape: str) -> None:
    w13 = torch.zeros(w13_shape, dtype=torch.float8_e4m3fn)
    w2 = torch.zeros(w2_shape, dtype=torch.float8_e4m3fn)
    message = rf"^{bad} must be .* multiples of 128 and >= 128 .*got shape {bad_shape}"
    with pytest.raises(ValueError, match=message):
        DenseMlp(w13, torch.ones(0, 4), w2, torch.ones(4, 0))


# ---- other constructor and call arguments --------------------------------------------------------


@pytest.mark.parametrize(
    "limit", [float("nan"), float("-inf"), -0.0, torch.tensor(1.0), complex(1, 0), [1.0]]
)
def test_more_bad_limits(weights, limit) -> None:
    with pytest.raises(ValueError, match=r"^limit must be None or a finite number > 0 "):
        _mlp(weights, limit=limit)


def test_limit_accepts_any_real_number(weights) -> None:
    import fractions

    assert _mlp(weights, limit=fractions.Fraction(3, 4)).limit == 0.75
    assert _mlp(weights, limit=2).limit == 2.0


@pytest.mark.parametrize("ue8m0", [None, 0, "True", 1.0, torch.tensor(True)])
def test_more_bad_ue8m0(weights, ue8m0) -> None:
    with pytest.raises(ValueError, match=r"^ue8m0 must be a bool \(True or False\), got "):
        _mlp(weights, ue8m0=ue8m0)


@pytest.mark.parametrize(
    "x,message",
    [
        (torch.zeros(2, HIDDEN, dtype=torch.float16), r"x must have dtype torch.bfloat16"),
        (torch.zeros(2, HIDDEN, dtype=torch.float8_e4m3fn), r"x must have dtype torch.bfloat16"),
        (torch.zeros((), dtype=torch.bfloat16), r"x must be \[m, hidden=512\], got shape \[\]"),
        (torch.zeros(HIDDEN, 2, dtype=torch.bfloat16), r"x must be \[m, hidden=512\]"),
        (None, r"x must be a torch.Tensor \[m, 512\] bf16, got NoneType"),
        ([[0.0] * HIDDEN], r"x must be a torch.Tensor \[m, 512\] bf16, got list"),
    ],
)
def test_more_bad_x(weights, x, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _mlp(weights)(x)


# ---- prepare is linear in the number of token counts ---------------------------------------------


class _CountingInt(int):
    """An int that counts equality tests: a list-membership dedup does O(n^2) of them."""

    comparisons = 0

    def __eq__(self, other: object) -> bool:
        type(self).comparisons += 1
        return int.__eq__(self, other)

    __hash__ = int.__hash__


def test_prepare_dedups_token_counts_in_linear_time(weights, monkeypatch) -> None:
    """Structural, not timed: prepare(range(1, 30000)) took 8.5 s when each count was looked
    up in the list of counts seen so far; with a set only duplicates are compared."""
    n = 1000
    tokens = [_CountingInt(t) for t in range(1, n + 1)]
    tokens += tokens[:10]  # duplicates: at most one comparison each
    monkeypatch.setattr(_CountingInt, "comparisons", 0)
    _mlp(weights).prepare(tokens)
    assert _CountingInt.comparisons <= len(tokens)  # a list scan: about n^2 / 2 = 500000


def test_token_counts_keep_first_seen_order_as_plain_ints() -> None:
    counts = dense_mlp._token_counts([3, 1, _CountingInt(3), 2, 1, _CountingInt(9)])
    assert counts == [3, 1, 2, 9]
    assert all(type(m) is int for m in counts)


# ---- weight-scale checks queued without a host sync (as on a GPU) ------------------------------


@pytest.fixture()
def queued_checks(monkeypatch):
    """CPU scales checked the way CUDA ones are (queued, resolved together), and a count of
    the host syncs a CUDA tensor would take: bool(), item(), tolist(), cpu()."""
    import mlpjit.scales as scales

    monkeypatch.setattr(scales, "_queued", lambda scale: scale.numel() > 0)
    monkeypatch.setattr(scales, "_open_checks", [])
    syncs: list[str] = []
    for name in ("__bool__", "item", "tolist", "cpu"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            syncs.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return syncs


def _bad_scales(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    bad = dict(weights)
    bad["w2_scale"] = weights["w2_scale"].clone()
    bad["w2_scale"][1, 0] = float("nan")
    return bad


def test_construction_queues_the_scale_checks_without_a_sync(weights, queued_checks) -> None:
    syncs = queued_checks
    layers = [_mlp(weights) for _ in range(5)] + [_mlp(_bad_scales(weights))]
    assert syncs == []  # a bad scale too: found later, never at construction
    with pytest.raises(ValueError, match=r"^layer 5: w2_scale has 1 NaN value; first at block"):
        DenseMlp.check_weight_scales(layers)
    with pytest.raises(ValueError, match=r"^layer 'shared': w2_scale has 1 NaN value"):
        DenseMlp.check_weight_scales({"dense": layers[0], "shared": layers[5]})
    DenseMlp.check_weight_scales(layers[:5])  # resolved: no more syncs for them


def test_good_scales_of_many_layers_cost_one_sync(weights, queued_checks) -> None:
    syncs = queued_checks
    layers = [_mlp(weights) for _ in range(8)]
    layers[0].prepare(range(1, 9))  # resolves every layer's check at once
    assert syncs == ["__bool__"]
    for layer in layers:
        layer.prepare(range(1, 9))
        layer(_x(2))
    assert syncs == ["__bool__"]


def test_a_bad_scale_fails_its_layers_prepare_and_calls_every_time(
    weights, queued_checks
) -> None:
    good, bad = _mlp(weights), _mlp(_bad_scales(weights))
    good.prepare([1])  # resolves both; the good layer is not blamed for the bad one
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^w2_scale has 1 NaN value"):
            bad.prepare([1])
        with pytest.raises(ValueError, match=r"^w2_scale has 1 NaN value"):
            bad(_x(1))
    assert torch.equal(good(_x(1)), _mlp(weights)(_x(1)))


def test_scale_checks_wait_out_graph_capture(weights, queued_checks, monkeypatch) -> None:
    """No sync while the device captures: the check stays open and is resolved (and its
    error raised) at the first prepare or call after the capture."""
    import mlpjit.scales as scales

    bad = _mlp(_bad_scales(weights))
    monkeypatch.setattr(scales, "current_stream_capturing", lambda device: True)
    bad(_x(1))  # CPU: the reference math; the check cannot run yet
    DenseMlp.check_weight_scales([bad])
    assert queued_checks == []
    monkeypatch.setattr(scales, "current_stream_capturing", lambda device: False)
    with pytest.raises(ValueError, match=r"^w2_scale has 1 NaN value"):
        bad(_x(1))


def test_a_dropped_layer_leaves_no_open_check(weights, queued_checks) -> None:
    import gc

    import mlpjit.scales as scales

    _mlp(_bad_scales(weights))
    gc.collect()
    scales.resolve_scale_checks()  # nothing left to check: the layer is gone
    assert queued_checks == [] and scales._open_checks == []
