"""Cubin wheels (mlpjit.jit.wheel): the wheel format, names and versions, atomic writes, and
an installed wheel serving a fresh venv with no compile."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from entries import publish

from mlpjit.jit.manager import CompileManager
from mlpjit.jit.spec import KernelRequest
from mlpjit.jit.store import CacheStore
from mlpjit.jit.wheel import (
    check_name,
    check_version,
    default_version,
    wheel_file_name,
    write_wheel,
)

REPO = Path(__file__).resolve().parent.parent
SMOKE = [{"n": n, "scale": 3.0, "block": 64} for n in (256, 512)]


def source(tmp_path: Path, count: int = 3) -> CacheStore:
    """A store of ``count`` hand-made entries (no compile)."""
    for i in range(count):
        publish(tmp_path / "src", i)
    return CacheStore(tmp_path / "src", read_only=(), installed=())


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def test_the_wheel_follows_the_binary_distribution_format(tmp_path: Path) -> None:
    store = source(tmp_path)
    report = write_wheel(store, tmp_path / "dist", name="mlpjit-cubins-test", version="1.0")
    path = Path(report.path)
    assert (
        path.name
        == "mlpjit_cubins_test-1.0-py3-none-any.whl"
        == wheel_file_name("mlpjit-cubins-test", "1.0")
    )
    assert report.entries == 3 and report.bytes == path.stat().st_size
    assert path.stat().st_mode & 0o777 == 0o644
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        files = {n: wheel.read(n) for n in names}
    info = "mlpjit_cubins_test-1.0.dist-info"
    assert names[-1] == f"{info}/RECORD"
    rows = [r.split(",") for r in files[f"{info}/RECORD"].decode().splitlines()]
    assert rows[-1] == [f"{info}/RECORD", "", ""]
    assert {r[0] for r in rows} == set(names)
    for name, digest, size in rows[:-1]:  # every file's hash and size
        assert digest == record_hash(files[name]) and int(size) == len(files[name])
    assert b"Wheel-Version: 1.0\n" in files[f"{info}/WHEEL"]
    assert b"Root-Is-Purelib: true\nTag: py3-none-any\n" in files[f"{info}/WHEEL"]
    metadata = files[f"{info}/METADATA"].decode()
    assert "Metadata-Version: 2.1\nName: mlpjit-cubins-test\nVersion: 1.0\n" in metadata
    assert files[f"{info}/entry_points.txt"].decode() == (
        "[mlpjit.cache_dirs]\nmlpjit-cubins-test = mlpjit_cubins_test:cache_dir\n"
    )
    keys = sorted(k for k, _ in store.iter_manifests())
    for key in keys:  # the layout of a cache tier, inside the package
        entry = f"mlpjit_cubins_test/cache/v1/entries/{key[:2]}/{key}"
        assert files[f"{entry}.cubin"] == store.lookup(key).cubin
        assert json.loads(files[f"{entry}.json"])["key"] == key
    aliases = [n for n in names if "/cache/v1/aliases/" in n]
    assert sorted(files[n].decode().strip() for n in aliases) == keys

    again = write_wheel(store, tmp_path / "again", name="mlpjit-cubins-test", version="1.0")
    assert Path(again.path).read_bytes() == path.read_bytes()  # deterministic


def test_defaults_name_the_filters_and_arch_and_hash_the_keys(tmp_path: Path) -> None:
    store = source(tmp_path)
    report = write_wheel(store, tmp_path / "dist", tags=["glm5", "tp8", "gate_up"])
    assert report.name == "mlpjit-cubins-glm5-tp8-gate-up-sm90a"
    assert report.version.split("+g")[0].count(".") == 2 and len(report.version) > 15
    subset = [e for e in (store.lookup(k) for k, _ in store.iter_manifests())][:2]
    assert default_version(subset) != report.version  # other entries, another version
    assert check_version(report.version) == report.version


@pytest.mark.parametrize(
    "name, normalized",
    [("mlpjit-cubins", "mlpjit-cubins"), ("MLPJIT_Cubins.GLM5", "mlpjit-cubins-glm5")],
)
def test_good_names_are_normalized(name: str, normalized: str) -> None:
    assert check_name(name) == normalized


@pytest.mark.parametrize(
    "name, message",
    [
        ("torch", "must start with 'mlpjit-cubins'"),
        ("mlpjit", "must start with 'mlpjit-cubins'"),
        ("mlpjit-cubinsx", "must start with 'mlpjit-cubins'"),
        ("mlpjit-cubins-", "letters, digits"),
        ("mlpjit-cubins/../x", "letters, digits"),
        ("mlpjit-cubins-" + "x" * 100, "at most 100"),
    ],
)
def test_bad_names_are_one_line_errors(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        check_name(name)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("version", ["1.0", "2026.1.2", "1!2.0rc1.post3.dev4", "1.0+g3f2a.x1"])
def test_good_versions(version: str) -> None:
    assert check_version(version) == version


@pytest.mark.parametrize("version", ["v1", "01.0", "1.0-1", "1.0+", "", "1.0 ", "1..0"])
def test_bad_versions_are_one_line_errors(version: str) -> None:
    with pytest.raises(ValueError, match="normalized PEP 440") as err:
        check_version(version)
    assert "\n" not in str(err.value)


def test_nothing_to_write_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    empty = CacheStore(tmp_path / "empty", read_only=(), installed=())
    with pytest.raises(ValueError, match="no verified entries"):
        write_wheel(empty, tmp_path / "dist")
    assert not (tmp_path / "dist").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        write_wheel(source(tmp_path), tmp_path / "file")


def test_a_failed_write_leaves_no_half_wheel(tmp_path: Path, monkeypatch) -> None:
    store = source(tmp_path)
    (tmp_path / "dist").mkdir()

    def broken(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(zipfile.ZipFile, "writestr", broken)
    with pytest.raises(OSError, match="No space"):
        write_wheel(store, tmp_path / "dist", name="mlpjit-cubins-x", version="1")
    assert os.listdir(tmp_path / "dist") == []


# ------------------------------------------------------------ a fresh venv, no compile


def _pip(venv: Path, *args: str) -> None:
    """pip (this interpreter's) installing into ``venv``: a venv made --without-pip sees the
    system's setuptools through --system-site-packages, and nothing is fetched."""
    run = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "-q", "--no-deps", "--no-index", "--no-build-isolation", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


def _copy_source(dest: Path) -> Path:
    """The package's sources (what pip builds), copied so no build output lands in the repo."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "mlpjit", dest / "mlpjit", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    return dest


def test_an_installed_wheel_serves_a_fresh_venv_without_compiling(tmp_path: Path) -> None:
    """Compile two smoke kernels here, `cache export --wheel` them, install mlpjit and the
    wheel into a fresh venv: warm there finds both in the wheel, compiles nothing and
    writes nothing to its own (empty) cache dir."""
    build = CacheStore(tmp_path / "build-cache", read_only=(), installed=())
    manager = CompileManager(build)
    for params in SMOKE:
        manager.get(KernelRequest("smoke", params, "sm_90a"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLPJIT_")}
    env.pop("PYTHONPATH", None)  # the venv's own mlpjit, not this checkout through the path
    cli = [sys.executable, "-m", "mlpjit"]
    export = subprocess.run(
        [*cli, "cache", "export", "--wheel", str(tmp_path / "dist"), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**env, "PYTHONPATH": str(REPO), "MLPJIT_CACHE_DIR": str(build.root)},
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    wheel = json.loads(export.stdout)
    assert wheel["entries"] == 2 and wheel["name"] == "mlpjit-cubins-sm90a"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=120)  # fmt: skip
    _pip(venv, str(_copy_source(tmp_path / "src")))
    _pip(venv, wheel["path"])

    fresh = tmp_path / "fresh-cache"
    python = str(venv / "bin" / "python")
    venv_env = {
        **env,
        "MLPJIT_CACHE_DIR": str(fresh),
        "MLPJIT_KERNEL_MODULES": "mlpjit.testing.smoke",
    }
    here = {"cwd": tmp_path, "env": venv_env}  # not the checkout, which `-c` and `-m` would import
    where = subprocess.run([python, "-c", "import mlpjit; print(mlpjit.__file__)"],
                           capture_output=True, text=True, check=True, **here)  # fmt: skip
    assert where.stdout.startswith(str(venv)), where.stdout
    params = ["--param", "n=256,512", "--param", "scale=3.0", "--param", "block=64"]
    warm = [python, "-m", "mlpjit", "warm", "--kernel", "smoke", *params, "--arch", "sm_90a"]
    run = subprocess.run([*warm, "--json"], capture_output=True, text=True, timeout=300,
                         check=False, **here)  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert (summary["total"], summary["compiled"], summary["compiles"]) == (2, 0, 0), summary
    assert not (fresh / "v1" / "entries").exists() or not any((fresh / "v1" / "entries").iterdir())

    listing = subprocess.run([python, "-m", "mlpjit", "cache", "ls", "--json"],
                             capture_output=True, text=True, check=True, **here)  # fmt: skip
    origins = {row["origin"] for row in json.loads(listing.stdout)}
    assert len(origins) == 1 and "site-packages/mlpjit_cubins_sm90a/cache" in origins.pop()

    off = subprocess.run([*warm, "--dry-run"], capture_output=True, text=True,
                         env={**venv_env, "MLPJIT_CACHE_WHEELS": "0"}, cwd=tmp_path,
                         check=True)  # fmt: skip
    assert off.stdout.splitlines()[-1].endswith("0 already cached"), off.stdout
