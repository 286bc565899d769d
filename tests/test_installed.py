"""Installed cubin wheels as read-only tiers (mlpjit.jit.installed): found through entry
points on sys.path, in the store after MLPJIT_CACHE_PATH, the same trust rules, off with
MLPJIT_CACHE_WHEELS=0, shown by `cache path`, `cache stats`, `cache info` and doctor."""

from __future__ import annotations

import json
import logging
import os
import sys
import zipfile
from pathlib import Path

import pytest
from entries import publish, run_cli

from mlpjit.jit.installed import installed_caches
from mlpjit.jit.key import spec_key
from mlpjit.jit.store import CacheStore
from mlpjit.jit.wheel import write_wheel


@pytest.fixture
def site(tmp_path: Path, monkeypatch) -> tuple[Path, list[str]]:
    """A wheel of two entries unpacked into a site dir on sys.path (what pip does); its
    keys."""
    keys = [publish(tmp_path / "src", i)[0] for i in range(2)]
    store = CacheStore(tmp_path / "src", read_only=(), installed=())
    report = write_wheel(store, tmp_path / "dist", name="mlpjit-cubins-t", version="1.0")
    site = tmp_path / "site"
    with zipfile.ZipFile(report.path) as wheel:
        wheel.extractall(site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "mlpjit_cubins_t", raising=False)  # another test's site
    return site, keys


def test_an_installed_wheel_is_a_read_only_tier_after_the_cache_path(
    site: tuple[Path, list[str]], tmp_path: Path
) -> None:
    path, keys = site
    (found,) = installed_caches()
    assert (found.name, found.dist, found.version) == ("mlpjit-cubins-t", "mlpjit-cubins-t", "1.0")
    assert found.path == path / "mlpjit_cubins_t" / "cache" and found.problem == ""
    layer = tmp_path / "layer"
    layer.mkdir(mode=0o755)
    store = CacheStore(read_only=[layer])
    assert store.read_only == (layer, found.path)
    entry = store.lookup(keys[0])
    assert entry is not None and entry.origin == found.path
    assert store.lookup_alias(spec_key(entry.manifest["components"])).key == keys[0]
    assert store.wheel_of(entry.origin) == found and store.wheel_of(layer) is None
    assert CacheStore(installed=()).lookup(keys[0]) is None


def test_mlpjit_cache_wheels_0_turns_them_off(site, monkeypatch) -> None:
    monkeypatch.setenv("MLPJIT_CACHE_WHEELS", "0")
    assert installed_caches() == () and CacheStore().read_only == ()


def test_the_trust_rules_of_any_read_only_dir_apply(site, caplog) -> None:
    path, keys = site
    os.chmod(path / "mlpjit_cubins_t" / "cache", 0o777)  # a dir anyone may plant cubins in
    with caplog.at_level(logging.WARNING, "mlpjit.jit.store"):
        assert CacheStore().lookup(keys[0]) is None
    assert "writable by group or other users" in caplog.text


def test_a_broken_entry_point_is_skipped_with_one_warning(tmp_path: Path, monkeypatch, caplog):
    info = tmp_path / "site" / "mlpjit_cubins_bad-1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mlpjit-cubins-bad\nVersion: 1\n")
    (info / "entry_points.txt").write_text("[mlpjit.cache_dirs]\nbad = json:dumps\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with caplog.at_level(logging.WARNING, "mlpjit.jit.store"):
        (found,) = installed_caches()
    assert found.path is None and "json:dumps failed" in found.problem
    assert "skipping cubin wheel mlpjit-cubins-bad" in caplog.text
    assert CacheStore().read_only == ()


def test_the_cli_shows_wheel_tiers(site, tmp_path: Path) -> None:
    path, keys = site
    env = {"PYTHONPATH": os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")])}
    cache = tmp_path / "cache"
    shown = run_cli(cache, "cache", "path", **env)
    assert "(cubin wheel mlpjit-cubins-t 1.0)" in shown.stdout, shown.stderr
    stats = json.loads(run_cli(cache, "cache", "stats", "--json", **env).stdout)
    assert list(stats["wheels"].values()) == ["mlpjit-cubins-t 1.0"] and stats["entries"] == 2
    info = json.loads(run_cli(cache, "cache", "info", keys[0][:10], "--json", **env).stdout)
    assert info["wheel"] == "mlpjit-cubins-t 1.0"
    doctor = json.loads(run_cli(cache, "doctor", "--json", **env).stdout)
    (check,) = [c for c in doctor["checks"] if c["name"].startswith("cubin wheel")]
    assert check["name"] == "cubin wheel mlpjit-cubins-t 1.0" and check["summary"] == "2 entries"
    off = run_cli(cache, "cache", "path", **env, MLPJIT_CACHE_WHEELS="maybe")
    assert off.returncode != 0 and "MLPJIT_CACHE_WHEELS must be 1 or 0" in off.stderr
    assert len(off.stderr.strip().splitlines()) == 1, off.stderr


def test_only_cubin_wheel_dist_infos_are_read(tmp_path: Path, monkeypatch) -> None:
    """Another distribution declaring the group is not a cubin wheel (nor read: start-up
    never parses every installed distribution's metadata)."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    for dist in ("other_pkg-1.0", "mlpjit_cubins_x-2.0"):
        info = tmp_path / "site" / f"{dist}.dist-info"
        info.mkdir(parents=True)
        name = dist.split("-")[0].replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1\n")
        (info / "entry_points.txt").write_text(
            f"[mlpjit.cache_dirs]\n{name} = os.path:abspath\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (found,) = installed_caches()
    assert found.name == "mlpjit-cubins-x"
