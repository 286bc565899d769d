"""mlpjit.jit.cache_layout: every path and file name of a cache tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlpjit.jit import cache_layout

KEY = "ab" + "0" * 62


def test_paths_of_a_tier():
    tier = Path("/cache")
    assert cache_layout.version_dir(tier) == tier / "v1"
    assert cache_layout.entry_paths(tier, KEY) == (
        tier / "v1" / "entries" / "ab" / f"{KEY}.json",
        tier / "v1" / "entries" / "ab" / f"{KEY}.cubin",
    )
    assert cache_layout.alias_path(tier, KEY) == tier / "v1" / "aliases" / KEY
    assert cache_layout.lock_path(tier, KEY) == tier / "v1" / "locks" / f"{KEY}.lock"
    quarantined = cache_layout.quarantine_dir(tier, KEY)
    assert quarantined.parent == tier / "v1" / "quarantine" and quarantined.name.startswith(KEY)
    assert [cache_layout.area(tier, a).name for a in cache_layout.AREAS] == list(cache_layout.AREAS)
    with pytest.raises(ValueError, match="cache area must be one of"):
        cache_layout.area(tier, "../etc")


def test_names_read_back():
    assert cache_layout.key_of_lock_file(f"{KEY}.lock") == KEY
    assert cache_layout.key_of_lock_file(f"{KEY}.lck") is None
    assert cache_layout.key_of_lock_file("x.lock") is None
    name = cache_layout.temp_prefix() + "random"
    assert cache_layout.temp_pid(name) is not None and cache_layout.temp_pid("tmpxyz") is None
    assert cache_layout.is_shard("ab") and not cache_layout.is_shard("AB")
    assert not cache_layout.is_shard("abc")


@pytest.mark.parametrize("bad", ["", "A" * 64, "a" * 63, "a" * 64 + "\n", "../" + "a" * 61, 7])
def test_only_full_keys_become_names(bad):
    assert not cache_layout.is_key(bad)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        cache_layout.check_key(bad)
