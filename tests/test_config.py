"""mlpjit.jit.config: typed MLPJIT_* readers, read at call time, clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlpjit.jit import config
from mlpjit.jit.spec import check_arch


def test_every_reader_has_a_documented_variable():
    assert set(config.ENV_VARS) == {
        "MLPJIT_CACHE_DIR",
        "MLPJIT_CACHE_PATH",
        "MLPJIT_LOCK_TIMEOUT",
        "MLPJIT_ARCH",
        "MLPJIT_RECORD",
        "MLPJIT_KERNEL_MODULES",
        "MLPJIT_REMOTE_CACHE",
        "MLPJIT_REMOTE_PREFIX",
        "MLPJIT_REMOTE_TTL",
        "MLPJIT_REMOTE_TIMEOUT",
    }
    for name, var in config.ENV_VARS.items():
        assert var.name == name and len(var.doc) > 20 and var.default


def test_cache_dir_from_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("MLPJIT_CACHE_DIR", str(tmp_path / "x"))
    assert config.cache_dir() == tmp_path / "x"
    monkeypatch.setenv("MLPJIT_CACHE_DIR", "")
    default = config.cache_dir()
    assert default.is_absolute() and "mlpjit" in default.parts[-1]


def test_cache_path_is_a_pathsep_list(monkeypatch):
    monkeypatch.setenv("MLPJIT_CACHE_PATH", os.pathsep.join(["/a", "", "/b/c"]))
    assert config.cache_path() == (Path("/a"), Path("/b/c"))
    monkeypatch.delenv("MLPJIT_CACHE_PATH")
    assert config.cache_path() == ()


def test_lock_timeout(monkeypatch):
    assert config.lock_timeout() == config.DEFAULT_LOCK_TIMEOUT
    monkeypatch.setenv("MLPJIT_LOCK_TIMEOUT", "2.5")
    assert config.lock_timeout() == 2.5
    for bad in ("0", "-1", "abc", "nan", "inf"):
        monkeypatch.setenv("MLPJIT_LOCK_TIMEOUT", bad)
        with pytest.raises(ValueError, match="MLPJIT_LOCK_TIMEOUT"):
            config.lock_timeout()


def test_arch_override(monkeypatch):
    assert config.arch_override() is None
    monkeypatch.setenv("MLPJIT_ARCH", "sm_90a")
    assert config.arch_override() == "sm_90a"
    monkeypatch.setenv("MLPJIT_ARCH", "hopper")
    with pytest.raises(ValueError, match="MLPJIT_ARCH"):
        config.arch_override()


def test_check_arch():
    for good in ("sm_90a", "sm_100a", "sm_80", "sm_120f"):
        assert check_arch(good) == good
    for bad in ("sm90a", "SM_90A", "sm_9", "", None, "sm_90a "):
        with pytest.raises(ValueError, match="arch"):
            check_arch(bad)


def test_record_file(monkeypatch, tmp_path):
    assert config.record_file() is None
    monkeypatch.setenv("MLPJIT_RECORD", str(tmp_path / "r.jsonl"))
    assert config.record_file() == tmp_path / "r.jsonl"
