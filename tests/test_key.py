"""mlpjit.jit.key: every component changes the key; paths, hosts, cwd and env do not."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mlpjit.jit import key as keymod
from mlpjit.jit.key import cache_key, key_components, spec_key
from mlpjit.kernels.fp8_gemv import SPEC as FP8_GEMV
from mlpjit.testing.smoke import SPEC as SMOKE

REPO = Path(__file__).resolve().parent.parent
PARAMS = {"n": 4096, "scale": 2.0, "block": 128}
PRINT_KEY = (
    "import json, sys; from mlpjit.jit.key import key_components, cache_key; "
    "from mlpjit.testing.smoke import SPEC; "
    "c = key_components(SPEC, {'n': 4096, 'scale': 2.0, 'block': 128}, 'sm_90a'); "
    "print(json.dumps({'key': cache_key(c), 'cutlass': 'cutlass' in sys.modules}))"
)


def _key_in_subprocess(pythonpath: Path, cwd: Path, env: dict | None = None) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MLPJIT_")}
    full.update(env or {})
    full["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run(
        [sys.executable, "-c", PRINT_KEY], cwd=cwd, env=full, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _copy_package(dest: Path) -> Path:
    shutil.copytree(REPO / "mlpjit", dest / "mlpjit", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_key_shape_and_determinism():
    c1 = key_components(SMOKE, PARAMS, "sm_90a")
    c2 = key_components(SMOKE, dict(reversed(list(PARAMS.items()))), "sm_90a")
    assert c1 == c2
    assert set(c1) == {"format", "kernel", "source", "params", "arch", "toolchain"}
    k = cache_key(c1)
    assert len(k) == 64 and all(ch in "0123456789abcdef" for ch in k)
    assert k == cache_key(c2)
    json.dumps(c1)  # plain JSON


def test_every_component_changes_the_key():
    base = key_components(SMOKE, PARAMS, "sm_90a")
    variants = {
        "format": base["format"] + 1,
        "kernel": "fp8_gemv",
        "source": "0" * 64,
        "params": {**base["params"], "n": 2048},
        "arch": "sm_100a",
        "toolchain": {**base["toolchain"], "nvidia-cutlass-dsl": "9.9.9"},
    }
    seen = {cache_key(base)}
    for name, value in variants.items():
        k = cache_key({**base, name: value})
        assert k not in seen, name
        seen.add(k)
    # Through key_components too: every parameter and the arch.
    for change in ({"n": 4128}, {"scale": 3.0}, {"block": 256}):
        assert cache_key(key_components(SMOKE, {**PARAMS, **change}, "sm_90a")) not in seen
    assert cache_key(key_components(SMOKE, PARAMS, "sm_100a")) == cache_key(
        {**base, "arch": "sm_100a"}
    )


def test_param_types_are_part_of_the_key():
    a = cache_key(key_components(SMOKE, {**PARAMS, "scale": 2}, "sm_90a"))
    b = cache_key(key_components(SMOKE, PARAMS, "sm_90a"))
    assert a != b  # 2 and 2.0 are different JSON; kernels see different Python types


def test_spec_key_ignores_only_the_toolchain():
    base = key_components(SMOKE, PARAMS, "sm_90a")
    other_tc = {**base, "toolchain": {"nvidia-cutlass-dsl": "0.0.1"}}
    assert spec_key(base) == spec_key(other_tc)
    assert cache_key(base) != cache_key(other_tc)
    assert spec_key(base) != spec_key({**base, "arch": "sm_100a"})
    assert spec_key(base) != cache_key(base)


def test_toolchain_lists_every_cutlass_dsl_distribution(monkeypatch, tmp_path):
    def dist(where, dirname, name, version):
        d = tmp_path / where / dirname
        d.mkdir(parents=True)
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")

    dist("a", "nvidia_cutlass_dsl-4.8.1.dist-info", "nvidia-cutlass-dsl", "4.8.1")
    dist(
        "a", "nvidia_cutlass_dsl_libs_base-4.8.1.dist-info", "nvidia-cutlass-dsl-libs-base", "4.8.1"
    )
    dist("a", "torch-2.13.0.dist-info", "torch", "2.13.0")
    dist("a", "nvidia_cublas-13.0.dist-info", "nvidia-cublas", "13.0")
    dist("b", "nvidia_cutlass_dsl-4.0.0.dist-info", "nvidia-cutlass-dsl", "4.0.0")  # shadowed
    monkeypatch.setattr(
        sys, "path", [str(tmp_path / "missing"), str(tmp_path / "a"), str(tmp_path / "b")]
    )
    keymod.toolchain.cache_clear()
    try:
        assert keymod.toolchain() == {
            "nvidia-cutlass-dsl": "4.8.1",
            "nvidia-cutlass-dsl-libs-base": "4.8.1",
        }
        monkeypatch.setattr(sys, "path", [str(tmp_path / "b")])
        keymod.toolchain.cache_clear()
        assert keymod.toolchain() == {"nvidia-cutlass-dsl": "4.0.0"}
    finally:
        keymod.toolchain.cache_clear()


def test_real_toolchain_matches_importlib_metadata():
    from importlib import metadata

    tc = keymod.toolchain()
    assert tc.get("nvidia-cutlass-dsl") == metadata.version("nvidia-cutlass-dsl")
    expected = {
        d.metadata["Name"].lower().replace("_", "-"): d.version
        for d in metadata.distributions()
        if d.metadata["Name"].lower().replace("_", "-").startswith("nvidia-cutlass-dsl")
    }
    assert tc == expected


@pytest.mark.parametrize(
    ("spec", "params", "arch", "match"),
    [
        ("smoke", PARAMS, "sm_90a", "spec must be a KernelSpec"),
        (SMOKE, {**PARAMS, "bogus": 1}, "sm_90a", "'bogus'"),
        (SMOKE, {**PARAMS, "n": [1]}, "sm_90a", "'n' must be"),
        (SMOKE, {**PARAMS, "scale": float("nan")}, "sm_90a", "finite"),
        (SMOKE, [("n", 1)], "sm_90a", "mapping"),
        (SMOKE, {"n": 64}, "sm_90a", "smoke param.s. scale, block missing"),
        (SMOKE, PARAMS, "90a", "arch"),
    ],
)
def test_bad_input_is_a_clear_value_error(spec, params, arch, match):
    with pytest.raises(ValueError, match=match):
        key_components(spec, params, arch)


def test_unregistered_kernel_names_the_registered_ones():
    from mlpjit.jit.spec import get_spec

    with pytest.raises(ValueError, match="nope") as raised:
        get_spec("nope")
    # Other tests may have registered more kernels (a probe's module); the built-in ones are
    # always named.
    for name in ("fp8_gemv", "fp8_layer", "fp8_stream", "smoke"):
        assert name in str(raised.value)


def test_no_paths_or_hostname_in_components():
    text = json.dumps(key_components(SMOKE, PARAMS, "sm_90a"))
    assert str(REPO) not in text and "/" not in text
    assert socket.gethostname() not in text


def test_key_independent_of_cwd_install_path_and_env(tmp_path):
    here = _key_in_subprocess(REPO, cwd=tmp_path)
    assert here["cutlass"] is False  # keys never import CuTe DSL
    moved = _copy_package(tmp_path / "elsewhere")
    (tmp_path / "cwd2").mkdir()
    there = _key_in_subprocess(
        moved,
        cwd=tmp_path / "cwd2",
        env={"HOME": str(tmp_path), "FOO": "bar", "CUTE_DSL_ARCH": "sm_100a", "USER": "other"},
    )
    assert there["key"] == here["key"]
    assert cache_key(key_components(SMOKE, PARAMS, "sm_90a")) == here["key"]


def test_key_independent_of_hostname(tmp_path):
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to run under another hostname")
    code = f'hostname mlpjit-other-host && {sys.executable} -c "{PRINT_KEY}"'
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLPJIT_")}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        ["unshare", "--uts", "sh", "-c", code], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        pytest.skip(f"unshare --uts not permitted here: {out.stderr.strip()[:200]}")
    assert json.loads(out.stdout)["key"] == cache_key(key_components(SMOKE, PARAMS, "sm_90a"))


@pytest.mark.parametrize("edited", ["testing/smoke.py", "jit/binary.py", "jit/spec.py"])
def test_source_edit_changes_the_key(tmp_path, edited):
    """An edit to the kernel's own file or to any mlpjit module it imports (binary.py,
    spec.py) changes the key: the hashed files follow the imports, no list to keep."""
    moved = _copy_package(tmp_path / "edited")
    path = moved / "mlpjit" / edited
    path.write_text(path.read_text() + "\n# an edit\n")
    edited_key = _key_in_subprocess(moved, cwd=tmp_path)
    assert edited_key["key"] != cache_key(key_components(SMOKE, PARAMS, "sm_90a"))


def test_source_files_follow_the_imports():
    """fp8_gemv's hash covers its whole package and the mlpjit modules it imports, and
    nothing that cannot change its code (no cli, store or manager)."""
    names = [rel for rel, _ in keymod.source_files(FP8_GEMV.sources)]
    package = {
        f"mlpjit/kernels/fp8_gemv/{p.name}"
        for p in (REPO / "mlpjit" / "kernels" / "fp8_gemv").glob("*.py")
    }
    assert package <= set(names)
    for imported in ("mlpjit/kernels/ptx.py", "mlpjit/kernels/hopper.py", "mlpjit/jit/binary.py"):
        assert imported in names
    for unrelated in ("mlpjit/cli/warm.py", "mlpjit/jit/store.py", "mlpjit/jit/manager.py"):
        assert unrelated not in names
    assert names == sorted(names)
    smoke = [rel for rel, _ in keymod.source_files(SMOKE.sources)]
    assert smoke[0] == "mlpjit/jit/binary.py" and "mlpjit/testing/smoke.py" in smoke


def test_imports_are_read_not_executed():
    """The import scan resolves relative imports, `from pkg import submodule` and
    parenthesized lists, and ignores other packages."""
    text = (
        "import os, mlpjit.jit.binary\n"
        "from . import ptx\n"
        "from ..jit import (\n    spec,\n    binary as b,\n)\n"
        "from mlpjit.kernels.hopper import SMS\n"
        "from cutlass import Float32\n"
    )
    found = keymod._imports(text, "mlpjit.kernels")
    assert found == {
        "mlpjit.jit.binary",
        "mlpjit.kernels.ptx",
        "mlpjit.jit.spec",
        "mlpjit.kernels.hopper",
    }


def test_a_default_valued_optional_param_keys_like_leaving_it_out() -> None:
    base = {"rows": 3072, "k": 6144, "tokens": 1, "tiles": 1, "in_regs": 3, "ctas_per_sm": 2,
            "swiglu": True, "limit": None, "ue8m0": True}  # fmt: skip
    plain = cache_key(key_components(FP8_GEMV, base, "sm_90a"))
    explicit = cache_key(key_components(FP8_GEMV, {**base, "early_launch": False}, "sm_90a"))
    early = cache_key(key_components(FP8_GEMV, {**base, "early_launch": True}, "sm_90a"))
    assert plain == explicit != early
    # The params dataclass checks types: 0 is not False.
    with pytest.raises(ValueError, match="early_launch must be a bool"):
        key_components(FP8_GEMV, {**base, "early_launch": 0}, "sm_90a")
