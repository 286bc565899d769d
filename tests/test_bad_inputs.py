"""Hostile inputs against every entry point: no hang, no traceback, one line naming the input.

Each case runs in a child process under a wall-clock timeout and an address-space limit
(RLIMIT_AS), so a hang fails as a timeout and a read without bound fails as a MemoryError
instead of taking the test run with it. Entry points:

- ``mlpjit warm --checkpoint DIR --dry-run`` and ``mlpjit warm --hidden/--intermediate
  ... --dry-run`` (and --sms, --limit, --tp, --param of warm): exit 1 or 2, stderr one line;
- ``DenseMlp.from_checkpoint``, ``find_mlp_prefixes``, ``checkpoint_mlp_shapes``: a ValueError
  of one line, or a result where the broken file is not one that entry point reads;
- ``DenseMlp(...)``, ``DenseMlp.prepare``: a ValueError of one line naming the argument.

The CLI children run concurrently (a few at a time). The Python entry points import torch,
which takes seconds, so they run in one child for all checkpoint cases and one for all
DenseMlp cases, each case under an alarm and an address-space budget of its own
(_CASE_RUNNER): a case that hangs or reads without bound is reported as such, and the next
case still runs.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from mlpjit import layer_plan
from mlpjit.checkpoint import checkpoint_mlp_shapes
from mlpjit.kernels.fp8_gemv.params import MAX_HIDDEN, MAX_INTERMEDIATE
from mlpjit.kernels.hopper import MAX_SMS, MIN_SMS

REPO = Path(__file__).resolve().parent.parent
ADDRESS_SPACE = 4 << 30  # a read without bound fails as MemoryError well before the host does
TIMEOUT_S = 90  # per child, with the matrix running concurrently on a loaded two-core CI box
CASE_SECONDS = 20  # per case of a child that runs many (_CASE_RUNNER)
CASE_MEMORY = 2 << 30  # bytes of address space a case may add to what its child holds
CASES_ADDRESS_SPACE = 16 << 30  # the hard limit of such a child: torch, plus one case's budget
CASES_TIMEOUT_S = 300  # such a child runs every case, each within CASE_SECONDS
PREFIX = "model.layers.0.mlp"
SHARD = "model-00001-of-00001.safetensors"

_POOL = ThreadPoolExecutor(max_workers=4)


def _limit_memory(limit: int = ADDRESS_SPACE) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _run(argv: list[str], cwd: Path, many: bool = False) -> subprocess.CompletedProcess | str:
    """Run ``python ARGV`` under the limits (``many``: a _CASE_RUNNER child, which limits
    each case itself within a larger whole); the CompletedProcess, or "hung" on a timeout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["MLPJIT_CACHE_DIR"] = str(cwd / "cache")
    env["TMPDIR"] = str(cwd)
    for name in ("MLPJIT_CACHE_PATH", "MLPJIT_ARCH", "MLPJIT_RECORD", "MLPJIT_REMOTE_CACHE"):
        env.pop(name, None)
    try:
        return subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=CASES_TIMEOUT_S if many else TIMEOUT_S,
            preexec_fn=(lambda: _limit_memory(CASES_ADDRESS_SPACE)) if many else _limit_memory,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "hung"


def _start(argv: list[str], cwd: Path, many: bool = False) -> Future:
    return _POOL.submit(_run, argv, cwd, many)


def _case_runner(seconds: int = CASE_SECONDS, memory: int = CASE_MEMORY) -> str:
    """The head of a child that runs many cases: run(call) calls ``call()`` under an alarm
    of ``seconds`` and an address-space limit of what the child holds now plus ``memory``,
    both lifted afterwards, and returns "ok", "error: <ValueError>", "hung", "out of memory"
    or "crash: <other exception>" (so one case's failure never stops the next)."""
    return f"""
import json, resource, signal, sys
class Hung(BaseException):
    pass
def on_alarm(*_):
    raise Hung()
signal.signal(signal.SIGALRM, on_alarm)
def address_space():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")
def run(call):
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (min(address_space() + {memory}, hard), hard))
    signal.alarm({seconds})
    try:
        call()
        return "ok"
    except ValueError as err:
        return "error: " + str(err)
    except Hung:
        return "hung"
    except MemoryError:
        return "out of memory"
    except Exception as err:
        return f"crash: {{type(err).__name__}}: {{err}}"
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
"""


_CASE_RUNNER = _case_runner()


def _check_cli(result: subprocess.CompletedProcess | str, needles: tuple[str, ...]) -> None:
    """An expected failure of the CLI: exit 1 or 2, one stderr line naming every needle."""
    assert result != "hung", "the command hung"
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode in (1, 2), (result.returncode, result.stderr[-2000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("mlpjit"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ---- broken checkpoints ---------------------------------------------------------------------


def _config(**changes: object) -> dict:
    config = {
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    config.update(changes)
    return config


def _write_checkpoint(root: Path, single: bool = False) -> Path:
    """A valid one-layer FP8 checkpoint, hidden 128, intermediate 128 (index + one shard,
    or one model.safetensors)."""
    root.mkdir(parents=True)
    tensors = {}
    for proj in ("gate_proj", "up_proj", "down_proj"):
        tensors[f"{PREFIX}.{proj}.weight"] = torch.zeros(128, 128).to(torch.float8_e4m3fn)
        tensors[f"{PREFIX}.{proj}.weight_scale_inv"] = torch.ones(1, 1)
    (root / "config.json").write_text(json.dumps(_config()))
    if single:
        save_file(tensors, str(root / "model.safetensors"))
    else:
        save_file(tensors, str(root / SHARD))
        index = {"weight_map": dict.fromkeys(tensors, SHARD)}
        (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def _replace_with_fifo(file: Path) -> None:
    file.unlink()
    os.mkfifo(file)


def _replace_with_link(file: Path, target: str) -> None:
    file.unlink()
    file.symlink_to(target)


def _set_config(**changes: object) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        (root / "config.json").write_text(json.dumps(_config(**changes)))

    return mutate


def _raw_config(raw: bytes) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        (root / "config.json").write_bytes(raw)

    return mutate


_ENTRIES = ("from_checkpoint", "find_mlp_prefixes", "checkpoint_mlp_shapes")
_CONFIG_READERS = ("warm", "from_checkpoint", "checkpoint_mlp_shapes")
_ALL = ("warm", *_ENTRIES)
_MOE = {"n_routed_experts": 4, "first_k_dense_replace": 0, "moe_intermediate_size": 128}

# case: (layout, mutation, entry points that must fail, needles every failure names)
CHECKPOINT_CASES: dict[str, tuple[str, Callable[[Path], None], tuple[str, ...], tuple]] = {
    "config_fifo": (
        "index",
        lambda root: _replace_with_fifo(root / "config.json"),
        _CONFIG_READERS,
        ("config.json", "not a regular file"),
    ),
    "config_dev_zero": (
        "index",
        lambda root: _replace_with_link(root / "config.json", "/dev/zero"),
        _CONFIG_READERS,
        ("config.json", "not a regular file"),
    ),
    "config_huge": (
        "index",
        _raw_config(b'{"pad": "' + b"x" * (40 << 20) + b'"}'),
        _CONFIG_READERS,
        ("config.json", "byte limit"),
    ),
    "config_deeply_nested": (
        "index",
        _raw_config(b"[" * 200_000),
        _CONFIG_READERS,
        ("config.json", "nested too deeply"),
    ),
    "config_not_utf8": (
        "index",
        _raw_config(b'{"hidden_size": "\xff"}'),
        _CONFIG_READERS,
        ("config.json", "not valid JSON"),
    ),
    "hidden_not_a_number": (
        "index",
        _set_config(hidden_size="abc"),
        ("warm", "checkpoint_mlp_shapes"),
        ("config.json", "hidden_size"),
    ),
    "hidden_huge": (
        "index",
        _set_config(hidden_size=10**30),
        ("warm", "checkpoint_mlp_shapes"),
        ("config.json", "hidden_size", str(MAX_HIDDEN)),
    ),
    "intermediate_fraction": (
        "index",
        _set_config(intermediate_size=128.5),
        ("warm", "checkpoint_mlp_shapes"),
        ("config.json", "intermediate_size"),
    ),
    "layers_1e9": (
        "index",
        _set_config(num_hidden_layers=10**9),
        ("warm", "checkpoint_mlp_shapes"),
        ("config.json", "num_hidden_layers"),
    ),
    "layers_1e12": (
        "index",
        _set_config(num_hidden_layers=10**12),
        ("warm", "checkpoint_mlp_shapes"),
        ("config.json", "num_hidden_layers"),
    ),
    "layers_infinite": (
        "index",
        _raw_config(
            json.dumps(_config())
            .replace('"num_hidden_layers": 1', '"num_hidden_layers": Infinity')
            .encode()
        ),
        ("warm", "checkpoint_mlp_shapes"),
        ("config.json", "num_hidden_layers"),
    ),
    "shared_experts_huge": (
        "index",
        _set_config(**_MOE, n_shared_experts=10**12),
        ("warm", "checkpoint_mlp_shapes"),
        ("config.json", "n_shared_experts"),
    ),
    "moe_layer_freq_huge": (
        "index",
        _set_config(**_MOE, n_shared_experts=1, moe_layer_freq=10**40),
        ("warm", "checkpoint_mlp_shapes"),
        ("config.json", "moe_layer_freq"),
    ),
    "index_fifo": (
        "index",
        lambda root: _replace_with_fifo(root / "model.safetensors.index.json"),
        _ALL,
        ("model.safetensors.index.json", "not a regular file"),
    ),
    "index_deeply_nested": (
        "index",
        lambda root: (root / "model.safetensors.index.json").write_bytes(b'{"a": ' * 200_000),
        _ALL,
        ("model.safetensors.index.json", "nested too deeply"),
    ),
    "shard_fifo": (
        "index",
        lambda root: _replace_with_fifo(root / SHARD),
        ("warm", "from_checkpoint", "checkpoint_mlp_shapes"),  # find reads the index only
        (SHARD, "not a regular file"),
    ),
    "shard_dev_zero": (
        "index",
        lambda root: _replace_with_link(root / SHARD, "/dev/zero"),
        ("warm", "from_checkpoint", "checkpoint_mlp_shapes"),
        (SHARD, "not a regular file"),
    ),
    "single_file_fifo": (
        "single",
        lambda root: _replace_with_fifo(root / "model.safetensors"),
        _ALL,
        ("model.safetensors", "not a regular file"),
    ),
}

# Runs every Python entry point on every checkpoint of argv[1] ({case: path}), each call a
# case of its own for run(); prints {case: {entry: "ok" | "error: ..." | "hung" | ...}}.
_CHECKPOINT_CHILD = (
    _CASE_RUNNER
    + """
from mlpjit import DenseMlp
from mlpjit.checkpoint import checkpoint_mlp_shapes, find_mlp_prefixes
prefix = sys.argv[2]
calls = {
    "from_checkpoint": lambda path: DenseMlp.from_checkpoint(path, prefix, device="cpu"),
    "find_mlp_prefixes": find_mlp_prefixes,
    "checkpoint_mlp_shapes": checkpoint_mlp_shapes,
}
results = {}
for case, path in json.loads(sys.argv[1]).items():
    results[case] = {name: run(lambda: call(path)) for name, call in calls.items()}
print(json.dumps(results))
"""
)


@pytest.fixture(scope="module")
def checkpoint_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Future], Future]:
    """Every broken checkpoint: its `mlpjit warm` child, and the one Python child of all."""
    warms, paths = {}, {}
    for name, (layout, mutate, _, _) in CHECKPOINT_CASES.items():
        work = tmp_path_factory.mktemp(name)
        root = _write_checkpoint(work / "ckpt", single=layout == "single")
        mutate(root)
        warm = ["-m", "mlpjit", "warm", "--checkpoint", str(root), "--arch", "sm_90a"]
        warm += ["--sms", "132", "--dry-run"]
        warms[name], paths[name] = _start(warm, work), str(root)
    python = ["-c", _CHECKPOINT_CHILD, json.dumps(paths), PREFIX]
    return warms, _start(python, tmp_path_factory.mktemp("python"), many=True)


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_broken_checkpoint(case: str, checkpoint_runs: tuple[dict[str, Future], Future]) -> None:
    _, _, failing, needles = CHECKPOINT_CASES[case]
    warms, python = checkpoint_runs
    if "warm" in failing:
        _check_cli(warms[case].result(), needles)
    results = _case_results(python.result())[case]
    for entry in _ENTRIES:
        outcome = results[entry]
        if entry not in failing:
            assert outcome == "ok", (entry, outcome)
            continue
        assert outcome.startswith("error: ") and "\n" not in outcome, (entry, outcome)
        for needle in needles:
            assert needle in outcome, (entry, needle, outcome)


_CONFIG_VALUES = st.one_of(
    st.integers(min_value=-(10**50), max_value=10**50),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
)
_CONFIG_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    "moe_layer_freq",
)


@settings(
    max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.dictionaries(st.sampled_from(_CONFIG_KEYS), _CONFIG_VALUES, min_size=1))
def test_generated_config_values_are_refused_by_name_or_read(tmp_path: Path, changes) -> None:
    """Any JSON value in any sizing key of config.json: the shapes are read, or a one-line
    ValueError names config.json; never a hang, an OverflowError or a huge allocation."""
    root = tmp_path / "ckpt"
    if not root.exists():
        _write_checkpoint(root)
    config = _config(**{**_MOE, "n_shared_experts": 1, **changes})
    (root / "config.json").write_text(json.dumps(config))
    try:
        shapes = checkpoint_mlp_shapes(root)
    except ValueError as err:
        message = str(err)
        assert "\n" not in message and "config.json" in message, message
    else:
        assert len(shapes) <= 1024


# ---- huge and bad sizes on the command line -------------------------------------------------

_HIDDEN = ["warm", "--arch", "sm_90a", "--dry-run", "--sms", "132"]
CLI_CASES: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "hidden_1e18": (
        [*_HIDDEN, "--hidden", str(10**18), "--intermediate", "128", "--tp", "1", "--tokens", "1"],
        ("--hidden", str(MAX_HIDDEN)),
    ),
    "hidden_1.3e8": (
        [*_HIDDEN, "--hidden", "130000000", "--intermediate", "128"],
        ("--hidden", str(MAX_HIDDEN)),
    ),
    "hidden_digits": ([*_HIDDEN, "--hidden", "9" * 5000, "--intermediate", "128"], ("--hidden",)),
    "intermediate_1e18": (
        [*_HIDDEN, "--hidden", "128", "--intermediate", str(10**18)],
        ("--intermediate", str(MAX_INTERMEDIATE)),
    ),
    "tp_huge": (
        [*_HIDDEN, "--hidden", "128", "--intermediate", "128", "--tp", "1" * 60],
        ("--tp",),
    ),
    "sms_1": (
        [*_HIDDEN, "--hidden", "128", "--intermediate", "128", "--sms", "1"],
        ("--sms", f"[{MIN_SMS}, {MAX_SMS}]"),
    ),
    "sms_0": ([*_HIDDEN, "--hidden", "128", "--intermediate", "128", "--sms", "0"], ("--sms",)),
    "sms_huge": (
        [*_HIDDEN, "--hidden", "128", "--intermediate", "128", "--sms", "9" * 50],
        ("--sms",),
    ),
    "sms_text": (
        [*_HIDDEN, "--hidden", "128", "--intermediate", "128", "--sms", "many"],
        ("--sms",),
    ),
    "limit_inf": (
        [*_HIDDEN, "--hidden", "128", "--intermediate", "128", "--limit", "1e400"],
        ("--limit",),
    ),
    "limit_nan": (
        [*_HIDDEN, "--hidden", "128", "--intermediate", "128", "--limit", "nan"],
        ("--limit",),
    ),
    "limit_negative": (
        [*_HIDDEN, "--hidden", "128", "--intermediate", "128", "--limit", "-1"],
        ("--limit",),
    ),
    "param_product": (
        ["warm", "--kernel", "smoke", "--arch", "sm_90a", "--dry-run"]
        + [
            arg
            for name in ("n", "scale", "block")
            for arg in ("--param", f"{name}=" + ",".join(map(str, range(1, 200))))
        ],
        ("--param", "4096"),
    ),
    "param_one_long_list": (
        [
            "warm",
            "--kernel",
            "smoke",
            "--arch",
            "sm_90a",
            "--dry-run",
            "--param",
            "n=" + ",".join(map(str, range(1, 10_000))),
        ],
        ("--param", "4096"),
    ),
    "param_huge_number": (
        [
            "warm",
            "--kernel",
            "fp8_gemv",
            "--arch",
            "sm_90a",
            "--dry-run",
            "--param",
            "rows=" + "9" * 5000,
        ],
        ("--param", "rows"),
    ),
    "kernel_rows_huge": (
        ["warm", "--kernel", "fp8_gemv", "--arch", "sm_90a", "--dry-run"]
        + ["--param", f"rows={10**18}", "--param", "k=128", "--param", "tokens=1"]
        + ["--param", "tiles=1", "--param", "in_regs=0", "--param", "ctas_per_sm=1"]
        + ["--param", "swiglu=false", "--param", "limit=none", "--param", "ue8m0=true"],
        ("rows",),
    ),
}


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future]:
    runs = {}
    for name, (args, _) in CLI_CASES.items():
        work = tmp_path_factory.mktemp("cli")
        runs[name] = _start(["-m", "mlpjit", *args], work)
    return runs


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_cli_sizes(case: str, cli_runs: dict) -> None:
    _check_cli(cli_runs[case].result(), CLI_CASES[case][1])


@pytest.mark.parametrize("sms", [MIN_SMS, 9, 12, 15, 16, 33, 64, 78, 114, 132, 1000, MAX_SMS])
def test_every_sms_count_plans(sms: int) -> None:
    """--sms 1 to 8 were a ZeroDivisionError deep in the planner (no cluster of the K splits
    resident): every count of the allowed range plans, at worst with the stock path."""
    for hidden, inter, tp in ((7168, 18432, 8), (7168, 2048, 8), (1024, 1024, 1)):
        requests = layer_plan.dense_mlp_requests(hidden, inter, tp, range(1, 9), "sm_90a", sms=sms)
        assert requests or sms < 78, (hidden, inter, tp, sms)  # an H20 (78 SMs) plans them


@pytest.mark.parametrize("sms", [-1, 0, 1, MIN_SMS - 1, MAX_SMS + 1, 10**50, True, 8.0])
def test_sms_out_of_range_is_refused_by_name(sms: object) -> None:
    with pytest.raises(ValueError, match=rf"^sms must be an int in \[{MIN_SMS}, {MAX_SMS}\]"):
        layer_plan.dense_mlp_requests(1024, 1024, 1, [1], "sm_90a", sms=sms)


_SIZES = st.one_of(
    st.integers(min_value=1, max_value=64).map(lambda blocks: 128 * blocks),
    st.integers(min_value=1, max_value=10**30),
)


@given(_SIZES, _SIZES, st.integers(min_value=-5, max_value=5000))
@settings(max_examples=60, deadline=5000)
def test_generated_sizes_plan_fast_or_are_refused(hidden: int, inter: int, sms: int) -> None:
    """Any sizes and SM count: a plan (quickly: sizes are bounded before any search) or a
    one-line ValueError naming the argument."""
    try:
        layer_plan.dense_mlp_requests(hidden, inter, 1, [1, 8], "sm_90a", sms=sms)
    except ValueError as err:
        message = str(err)
        assert "\n" not in message
        assert message.split()[0] in ("hidden", "intermediate", "sms"), message


# ---- bad DenseMlp arguments -----------------------------------------------------------------

_DENSE_SETUP = """
import itertools, json, sys
import torch
from mlpjit import DenseMlp
w13 = torch.zeros(256, 128).to(torch.float8_e4m3fn)
w2 = torch.zeros(128, 128).to(torch.float8_e4m3fn)
s13, s2 = torch.ones(2, 1), torch.ones(1, 1)
def make(**kw):
    return DenseMlp(w13, s13, w2, s2, **kw)
"""

# case: (the call, needles of its one-line ValueError)
DENSE_CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "limit_10**400": ("make(limit=10**400)", ("limit",)),
    "limit_inf": ("make(limit=float('inf'))", ("limit",)),
    "limit_nan": ("make(limit=float('nan'))", ("limit",)),
    "limit_over_bf16": ("make(limit=1e39)", ("limit", "3.38953e+38")),
    "limit_text": ("make(limit='1')", ("limit",)),
    "ue8m0_text": ("make(ue8m0='yes')", ("ue8m0",)),
    "prepare_endless": ("make().prepare(itertools.count(1))", ("tokens", "at most")),
    "prepare_zero": ("make().prepare([0])", ("tokens",)),
    "prepare_not_iterable": ("make().prepare(8)", ("tokens",)),
    "prepare_floats": ("make().prepare([1.5])", ("tokens",)),
    "kernel_requests_endless": (
        "__import__('mlpjit').dense_mlp.kernel_requests(128, 128, itertools.count(1), 'sm_90a', "
        "limit=None, ue8m0=True)",
        ("tokens",),
    ),
    "device_bogus": ("DenseMlp.from_checkpoint('.', 'x', device='bogus')", ("device", "'cpu'")),
    "device_int": ("DenseMlp.from_checkpoint('.', 'x', device=[1])", ("device",)),
    "device_cuda_99": ("DenseMlp.from_checkpoint('.', 'x', device='cuda:99')", ("device",)),
    "from_checkpoint_limit": (
        "DenseMlp.from_checkpoint('.', 'x', device='cpu', limit=-1.0)",
        ("limit",),
    ),
}

# Each call is a case of its own for run(); prints {case: "ok" | "error: ..." | "hung" | ...}.
_DENSE_CHILD = (
    _CASE_RUNNER
    + _DENSE_SETUP
    + """
calls = json.loads(sys.argv[1])
print(json.dumps({name: run(lambda: eval(call)) for name, call in calls.items()}))
"""
)


def _case_results(result: subprocess.CompletedProcess | str) -> dict:
    """The JSON a _CASE_RUNNER child printed, once it is known to have run to its end."""
    assert result != "hung", f"a child running many cases took over {CASES_TIMEOUT_S} s"
    assert "Traceback" not in result.stderr and result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def dense_run(tmp_path_factory: pytest.TempPathFactory) -> Future:
    calls = {name: call for name, (call, _) in DENSE_CASES.items()}
    argv = ["-c", _DENSE_CHILD, json.dumps(calls)]
    return _start(argv, tmp_path_factory.mktemp("dense"), many=True)


@pytest.mark.parametrize("case", list(DENSE_CASES))
def test_bad_dense_mlp_arguments(case: str, dense_run: Future) -> None:
    outcome = _case_results(dense_run.result())[case]
    assert outcome.startswith("error: ") and "\n" not in outcome, outcome
    for needle in DENSE_CASES[case][1]:
        assert needle in outcome, (needle, outcome)


def test_each_case_of_a_many_case_child_has_its_own_limits(tmp_path: Path) -> None:
    """A case that hangs, one that allocates without bound and one that raises something
    else are each reported as such, and the cases after them still run."""
    code = (
        _case_runner(seconds=2, memory=256 << 20)
        + """
import itertools, os, time
fifo = sys.argv[1]
os.mkfifo(fifo)
cases = {
    "fifo": lambda: open(fifo).read(),
    "sleep": lambda: time.sleep(60),
    "grow": lambda: [bytes(1 << 20) for _ in itertools.count()],
    "overflow": lambda: float(10**400),
    "refused": lambda: int("x"),
    "fine": lambda: bytes(128 << 20),
}
print(json.dumps({name: run(call) for name, call in cases.items()}))
"""
    )
    results = _case_results(_run(["-c", code, str(tmp_path / "fifo")], tmp_path, many=True))
    assert results == {
        "fifo": "hung",
        "sleep": "hung",
        "grow": "out of memory",
        "overflow": "crash: OverflowError: int too large to convert to float",
        "refused": "error: invalid literal for int() with base 10: 'x'",
        "fine": "ok",
    }


def test_bf16_limit_bound_is_the_largest_finite_bf16() -> None:
    from mlpjit.kernels.fp8_gemv.params import MAX_LIMIT

    assert torch.finfo(torch.bfloat16).max == MAX_LIMIT and math.isfinite(MAX_LIMIT)
