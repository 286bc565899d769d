"""Every `mlpjit cache` command, and a lookup, against every bad on-disk state.

The matrix is states x commands. Each state is made in a fresh tiny cache (hand-made
entries, no compile): symlinks where a directory or file belongs, FIFOs, character devices,
another owner (uid nobody), group/other write bits, huge and malformed manifest numbers,
deeply nested JSON, truncation, and read-only layers that fail the tier rule. Each command
runs in a child process with a timeout and a 4 GiB address-space limit, and must:

- finish (no hang) without a traceback (a failure is one line on stderr);
- delete nothing outside the cache (links point at a sentinel directory that must survive);
- never load a planted byte (planted cubins carry a marker that no output may contain).

The commands are discovered from the CLI parser, so a new `mlpjit cache` command is covered
without touching this file (give it arguments in ARGS if it needs some). `mlpjit warm` runs
too, without compiling: each of its modes (--kernel, --model, ..., also discovered from the
parser; a new one needs its arguments in WARM_ARGS) with --dry-run, and --kernel and --from
for real against the hand-made entries (the hit path), in a child whose compiler is off, so
a miss is a one-line error instead of a compile. The manifest numbers are also fuzzed
in-process with hypothesis, through the same functions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import struct
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from entries import (
    OTHER_UID,
    made,
    paths,
    publish,
    run_cli,
    run_python,
    sentinel,
    sentinel_intact,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlpjit import cli
from mlpjit.cli.parser import build_parser
from mlpjit.jit.archive import export_archive
from mlpjit.jit.binary import KernelBinary
from mlpjit.jit.key import spec_key
from mlpjit.jit.spec import KernelRequest
from mlpjit.jit.store import CacheStore

MARKER = b"PLANTED-CUBIN-BYTES"
TIMEOUT = 60
PARALLEL = 4


def cache_commands() -> list[str]:
    """The `mlpjit cache` subcommands, as the CLI parser defines them."""
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (group,) = [
        a for a in commands.choices["cache"]._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return sorted(group.choices)


# Arguments a command needs; "{out}" is a fresh path, "{archive}" a good archive, "{key}" a key
# prefix of a good entry.
ARGS: dict[str, list[str]] = {
    "info": ["{key}"],
    "prune": ["--max-size", "1K"],
    "export": ["{out}"],
    "import": ["{archive}"],
}


def warm_modes() -> list[str]:
    """The options of `mlpjit warm` that choose what to warm (one of them is required)."""
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    warm = commands.choices["warm"]
    (group,) = [g for g in warm._mutually_exclusive_groups if g.required]
    return sorted(
        a.option_strings[-1] if a.dest == "requests" else a.option_strings[0]
        for a in group._group_actions
    )


# Arguments of each warm mode; "{checkpoint}" is a tiny checkpoint dir, "{requests}" a request
# file of hand-made entries 0, 1 (in the root) and 2 (planted in the layer states).
_SMOKE_PARAMS = ["--param", "scale=2.0", "--param", "block=128", "--arch", "sm_90a"]
WARM_ARGS: dict[str, list[str]] = {
    "--kernel": ["--kernel", "smoke", "--param", "n=1024,1025", *_SMOKE_PARAMS],
    # --sms and --arch: no GPU query (which imports torch: seconds per run)
    "--model": ["--model", "glm5", "--tp", "8", "--tokens", "1", "--sms", "132"],
    "--hidden": ["--hidden", "1024", "--intermediate", "1024", "--tokens", "1,2", "--sms", "132"],
    "--checkpoint": ["--checkpoint", "{checkpoint}", "--arch", "sm_90a", "--sms", "132"],
    "--requests": ["--from", "{requests}"],
}
# The warm runs of the matrix: every mode with --dry-run (plans, lists the cache), and the
# modes that name hand-made entries for real (the hit path; a miss is refused, see WARM).
WARM_RUNS: dict[str, list[str]] = {
    **{f"warm {m} --dry-run": [*WARM_ARGS[m], "--dry-run", "--arch", "sm_90a"] for m in WARM_ARGS},
    # --jobs 1: the compiler is switched off in this process only (see WARM)
    "warm --kernel": [*WARM_ARGS["--kernel"], "--jobs", "1"],
    "warm --from": [*WARM_ARGS["--requests"], "--jobs", "1"],
}

# `mlpjit warm` with compiling off (a miss is a one-line error, not minutes of CuTe DSL) and
# every entry the store hands out printed, so a planted cubin that was loaded shows.
WARM = """
import sys
from mlpjit.errors import MlpjitError
from mlpjit.jit.manager import CompileManager
from mlpjit.jit.store import CacheStore
def no_compile(self, r):
    raise MlpjitError(f"kernel {r.key[:12]} is not cached, and this test compiles nothing")
def shown(find):
    def wrapper(*args, **kwargs):
        entry = find(*args, **kwargs)
        if entry is not None:
            print("served", entry.cubin.hex())
        return entry
    return wrapper
CompileManager._compile = no_compile
CacheStore.lookup = shown(CacheStore.lookup)
CacheStore.lookup_alias = shown(CacheStore.lookup_alias)
from mlpjit.cli import main
sys.exit(main(sys.argv[1:]))
"""

# The manager's lookup (what a hit in `mlpjit warm` or a server does): root, layers, alias.
LOOKUP = """
import json, sys
from mlpjit.errors import MlpjitError
from mlpjit.jit.manager import CompileManager
store = CompileManager().store
found = []
try:
    for key, spec in json.loads(sys.argv[1]):
        for entry in (store.lookup(key), store.lookup_alias(spec)):
            if entry is not None:
                found.append(entry.cubin.hex())
except MlpjitError as err:  # e.g. CacheDirError for a refused root: the caller's to handle
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)
print(json.dumps(found))
"""


# --------------------------------------------------------------------- states


def _planted(base: Path, i: int = 0) -> Path:
    """A cache outside the root holding a self-consistent entry ``i`` with MARKER bytes."""
    key, components, binary = made(i)
    planted = KernelBinary(**{**vars(binary), "cubin": b"\x7fELF" + MARKER})
    root = base / "planted"
    assert CacheStore(root=root, read_only=()).publish(key, components, planted, 0.1).persisted
    return root


def _replace_with_link(path: Path, target: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    path.symlink_to(target)


def _manifest_edit(**fields: object) -> Callable[[Path, Path], None]:
    def edit(root: Path, base: Path) -> None:
        mpath = paths(root, made(0)[0])[0]
        manifest = json.loads(mpath.read_text())
        manifest.update(fields)
        mpath.write_text(json.dumps(manifest))

    return edit


def _area(root: Path, name: str) -> Path:
    key = made(0)[0]
    v1 = root / "v1"
    return {
        "v1": v1,
        "shard": v1 / "entries" / key[:2],
        "manifest": paths(root, key)[0],
        "cubin": paths(root, key)[1],
        "alias": v1 / "aliases" / spec_key(made(0)[1]),
    }.get(name, v1 / name)


def _link_dir(name: str) -> Callable[[Path, Path], None]:
    """``name`` becomes a link to the sentinel (a shard: to a planted shard)."""

    def make(root: Path, base: Path) -> None:
        (root / "v1" / "quarantine").mkdir(exist_ok=True)
        (root / "v1" / "tmp").mkdir(exist_ok=True)
        target = sentinel(base) if name != "shard" else None
        if target is None:
            target = _area(_planted(base), "shard")
        _replace_with_link(_area(root, name), target)

    return make


def _link_file(name: str) -> Callable[[Path, Path], None]:
    def make(root: Path, base: Path) -> None:
        _replace_with_link(_area(root, name), _area(_planted(base), name))

    return make


def _special(name: str, kind: str) -> Callable[[Path, Path], None]:
    """A FIFO or a character device (a copy of /dev/null) where ``name`` belongs."""

    def make(root: Path, base: Path) -> None:
        path = _area(root, name)
        if name in ("quarantine", "tmp"):
            path.mkdir(exist_ok=True)
            path = path / "thing"
        elif os.path.lexists(path):
            path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        else:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)

    return make


def _owner(name: str) -> Callable[[Path, Path], None]:
    def make(root: Path, base: Path) -> None:
        os.chown(_area(root, name), OTHER_UID, OTHER_UID)

    return make


def _mode(name: str, mode: int) -> Callable[[Path, Path], None]:
    def make(root: Path, base: Path) -> None:
        os.chmod(_area(root, name), mode)

    return make


def _truncate(name: str) -> Callable[[Path, Path], None]:
    def make(root: Path, base: Path) -> None:
        path = _area(root, name)
        os.truncate(path, path.stat().st_size // 2)

    return make


def _deep_json(root: Path, base: Path) -> None:
    _area(root, "manifest").write_bytes(b"[" * 200_000)


def _untrusted_layer(root: Path, base: Path) -> dict[str, str]:
    """A layer owned by another user, holding a planted entry for a key the root lacks."""
    layer = base / "layer"
    shutil.copytree(_planted(base / "p2", 2), layer, symlinks=True)
    for path in [layer, *layer.rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    return {"MLPJIT_CACHE_PATH": str(layer)}


def _exposed_layer(root: Path, base: Path) -> dict[str, str]:
    """A planted layer of ours inside a directory other users can write."""
    shared = base / "shared"
    shared.mkdir()
    shutil.copytree(_planted(base / "p2", 2), shared / "layer", symlinks=True)
    os.chmod(shared, 0o777)
    return {"MLPJIT_CACHE_PATH": str(shared / "layer")}


def _missing_layer(root: Path, base: Path) -> dict[str, str]:
    return {"MLPJIT_CACHE_PATH": str(base / "nowhere" / "layer")}


STATES: dict[str, Callable[[Path, Path], dict[str, str] | None]] = {
    **{f"symlinked-{n}": _link_dir(n) for n in ("v1", "entries", "shard", "aliases")},
    **{f"symlinked-{n}": _link_dir(n) for n in ("locks", "quarantine", "tmp")},
    **{f"symlinked-{n}": _link_file(n) for n in ("manifest", "cubin")},
    **{f"fifo-{n}": _special(n, "fifo") for n in ("manifest", "cubin", "alias")},
    **{f"fifo-in-{n}": _special(n, "fifo") for n in ("quarantine", "tmp")},
    **{f"chardev-{n}": _special(n, "chr") for n in ("manifest", "alias")},
    "chardev-in-quarantine": _special("quarantine", "chr"),
    **{f"other-owner-{n}": _owner(n) for n in ("v1", "shard", "manifest", "cubin")},
    "group-writable-entries": _mode("entries", 0o775),
    "other-writable-cubin": _mode("cubin", 0o646),
    "group-writable-root": lambda root, base: os.chmod(root, 0o770),
    "huge-numbers": _manifest_edit(created=1e300, last_used=-1e300, cubin_bytes=10**400),
    "malformed-numbers": _manifest_edit(created="soon", last_used=[1], compile_seconds=1e308),
    "deep-json-manifest": _deep_json,
    **{f"truncated-{n}": _truncate(n) for n in ("manifest", "cubin")},
    "untrusted-layer": _untrusted_layer,
    "exposed-layer": _exposed_layer,
    "missing-layer": _missing_layer,
}


# --------------------------------------------------------------------- the matrix


def _safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A safetensors file of zero-filled tensors, {name: (dtype, shape, bytes per item)},
    written by hand (no torch in this module)."""
    header, offset = {}, 0
    for name, (dtype, shape, item) in tensors.items():
        size = item
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def _checkpoint(root: Path) -> Path:
    """A one-layer FP8 checkpoint, hidden and intermediate 128 (config.json and one file)."""
    root.mkdir(parents=True)
    config = {
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    (root / "config.json").write_text(json.dumps(config))
    tensors = {}
    for proj in ("gate_proj", "up_proj", "down_proj"):
        tensors[f"model.layers.0.mlp.{proj}.weight"] = ("F8_E4M3", [128, 128], 1)
        tensors[f"model.layers.0.mlp.{proj}.weight_scale_inv"] = ("F32", [1, 1], 4)
    _safetensors(root / "model.safetensors", tensors)
    return root


@pytest.fixture(scope="module")
def warm_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The files warm's modes read: a tiny checkpoint and a request file."""
    base = tmp_path_factory.mktemp("warm-inputs")
    requests = base / "requests.jsonl"
    lines = [
        KernelRequest("smoke", {"n": 1024 + i, "scale": 2.0, "block": 128}, "sm_90a").to_json_line()
        for i in range(3)
    ]
    requests.write_text("\n".join(lines) + "\n")
    return {"checkpoint": str(_checkpoint(base / "ckpt")), "requests": str(requests)}


@pytest.fixture(scope="module")
def good_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An archive of good entries (2 and 3) to import into each bad state."""
    base = tmp_path_factory.mktemp("archive")
    root = base / "cache"
    publish(root, 2)
    publish(root, 3)
    path = base / "good.tar"
    export_archive(CacheStore(root=root, read_only=()), path)
    return path


def _run(state: str, command: str | None, base: Path, inputs: dict[str, str]) -> tuple[str, str]:
    """Make ``state`` under ``base`` and run ``command`` (a cache command, a WARM_RUNS name, or
    None: the lookup) against it; returns (what went wrong or "", everything the child
    printed)."""
    base.mkdir()
    root = base / "cache"
    publish(root, 0)
    publish(root, 1)
    env = STATES[state](root, base) or {}
    if not (base / "sentinel").exists():
        sentinel(base)
    outside = _snapshot(base)
    try:
        if command is None:
            keys = [(made(i)[0], spec_key(made(i)[1])) for i in range(3)]
            proc = run_python(
                LOOKUP, json.dumps(keys), timeout=TIMEOUT, MLPJIT_CACHE_DIR=str(root), **env
            )
        elif command in WARM_RUNS:
            args = ["warm", *(a.format(**inputs) for a in WARM_RUNS[command])]
            modules = {"MLPJIT_KERNEL_MODULES": "mlpjit.testing.smoke"}
            proc = run_python(
                WARM, *args, timeout=TIMEOUT, MLPJIT_CACHE_DIR=str(root), **modules, **env
            )
        else:
            fill = {**inputs, "out": str(base / "out.tar"), "key": made(0)[0][:8]}
            args = [a.format(**fill) for a in ARGS.get(command, [])]
            proc = run_cli(root, "cache", command, *args, timeout=TIMEOUT, **env)
    except subprocess.TimeoutExpired:
        return f"hung for {TIMEOUT} s", ""
    output = proc.stdout + proc.stderr
    out_tar = base / "out.tar"
    if out_tar.is_file() and MARKER in out_tar.read_bytes():
        return "exported a planted cubin", output
    if "Traceback" in proc.stderr:
        return "traceback", output
    if proc.returncode not in (0, 1):
        return f"exit status {proc.returncode}", output
    if MARKER.hex() in output:
        return "loaded a planted cubin", output
    if _snapshot(base) != outside or not sentinel_intact(base / "sentinel"):
        return "changed something outside the cache", output
    return "", output


def _snapshot(base: Path) -> dict[str, tuple[int, int]]:
    """(mode, size) of everything under ``base`` but the cache root and the export."""
    found = {}
    for path in base.rglob("*"):
        rel = path.relative_to(base)
        if rel.parts[0] in ("cache", "out.tar") or rel.name.startswith(".out.tar"):
            continue
        st = os.lstat(path)
        found[str(rel)] = (st.st_mode, st.st_size if not stat.S_ISDIR(st.st_mode) else 0)
    return found


def _dir_name(command: str | None) -> str:
    """A directory name for ``command``'s run ("warm --kernel" -> "warm_kernel")."""
    return "_".join((command or "lookup").replace("-", " ").split())


@pytest.mark.parametrize("state", sorted(STATES))
def test_every_command_survives_the_state(
    state: str, tmp_path: Path, good_archive: Path, warm_inputs: dict[str, str]
) -> None:
    commands: list[str | None] = [*cache_commands(), None, *WARM_RUNS]
    inputs = {**warm_inputs, "archive": str(good_archive)}
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = pool.map(lambda c: _run(state, c, tmp_path / _dir_name(c), inputs), commands)
        failures = {
            c or "lookup": (problem, output[-1500:])
            for c, (problem, output) in zip(commands, results, strict=True)
            if problem
        }
    assert not failures, failures


def test_the_matrix_covers_every_cache_command() -> None:
    names = cache_commands()
    assert {"path", "ls", "info", "stats", "verify", "prune", "clear", "export"} <= set(names)
    assert "import" in names


def test_the_matrix_covers_every_warm_mode() -> None:
    """A new way to choose what to warm fails here until WARM_ARGS gives it arguments."""
    modes = warm_modes()
    assert {"--kernel", "--model", "--hidden", "--checkpoint", "--requests"} <= set(modes)
    assert set(modes) == set(WARM_ARGS)
    assert all(f"warm {m} --dry-run" in WARM_RUNS for m in modes)


def test_warm_in_the_matrix_hits_the_hand_made_entries(
    tmp_path: Path, warm_inputs: dict[str, str]
) -> None:
    """In a good cache the matrix's warm runs really take the hit path (served entries, no
    compile) and every dry run plans something: a bad state is tested against a warm that
    works, not one that fails for a reason of its own."""
    root = tmp_path / "cache"
    served = {publish(root, i)[2].cubin.hex() for i in range(2)}
    for name, args in WARM_RUNS.items():
        argv = ["warm", *(a.format(**warm_inputs) for a in args), "--json"]
        proc = run_python(
            WARM, *argv, MLPJIT_CACHE_DIR=str(root), MLPJIT_KERNEL_MODULES="mlpjit.testing.smoke"
        )
        assert "Traceback" not in proc.stderr, (name, proc.stderr[-2000:])
        if name == "warm --from":  # entry 2 is not cached: refused, not compiled
            assert proc.returncode == 1 and "this test compiles nothing" in proc.stderr, name
            continue
        assert proc.returncode == 0, (name, proc.stderr[-2000:])
        report = json.loads(proc.stdout[proc.stdout.index("{") :])
        assert report["total"] > 0, (name, report)
        if name == "warm --kernel":
            assert report["hits"] == 2 and report["compiles"] == 0, report
            assert {
                line.split()[1] for line in proc.stdout.splitlines() if line.startswith("served")
            } == served


# --------------------------------------------------------------------- fuzzed numbers

_NUMBERS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
)
_FIELDS = ("created", "last_used", "cubin_bytes", "compile_seconds")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.fixed_dictionaries({f: _NUMBERS for f in _FIELDS}))
def test_any_manifest_numbers_break_no_listing(tmp_path_factory, monkeypatch, values) -> None:
    """Whatever numbers an (otherwise verified) manifest holds outside its checksum, ls,
    stats, info and prune print and exit without an exception."""
    base = tmp_path_factory.mktemp("fuzz")
    root = base / "cache"
    key = publish(root, 0)[0]
    mpath = paths(root, key)[0]
    manifest = json.loads(mpath.read_text())
    manifest.update(values)
    mpath.write_text(json.dumps(manifest))
    monkeypatch.setenv("MLPJIT_CACHE_DIR", str(root))
    for args in (["ls"], ["ls", "--json"], ["stats"], ["info", key[:8]], ["verify"]):
        assert cli.main(["cache", *args]) in (0, 1), args
    assert cli.main(["cache", "prune", "--max-size", "1T"]) == 0
