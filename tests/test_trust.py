"""mlpjit.jit.trust: which directories and files of a cache tier are trusted."""

from __future__ import annotations

import os

import pytest

from mlpjit.errors import CacheDirError, CorruptEntryError
from mlpjit.jit import trust


def test_a_private_dir_is_trusted(tmp_path):
    tier = tmp_path / "tier"
    tier.mkdir(mode=0o700)
    assert trust.dir_problem(os.lstat(tier)) == ""
    assert trust.unsafe_dir_reason(tier) is None
    assert trust.tier_problem(tier) is None
    assert trust.tier_problem(tmp_path / "nowhere") == "missing"


def test_group_writable_dirs_and_files_are_not(tmp_path):
    tier = tmp_path / "tier"
    tier.mkdir()
    os.chmod(tier, 0o770)
    assert "writable by group" in trust.tier_problem(tier)
    with pytest.raises(CacheDirError, match="writable by group"):
        trust.refuse_root_dir(tier, os.lstat(tier), is_root=True)
    entry = tmp_path / "entry.json"
    entry.write_bytes(b"{}")
    os.chmod(entry, 0o664)
    with pytest.raises(CorruptEntryError, match="writable by group"):
        trust.read_trusted(entry, 100)
    os.chmod(entry, 0o644)
    assert trust.read_trusted(entry, 100) == b"{}"
    with pytest.raises(CorruptEntryError):
        trust.read_trusted(entry, 1)  # over the cap


def test_a_symlink_is_no_dir_and_a_group_writable_parent_exposes_the_tier(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert "not a directory" in trust.dir_problem(os.lstat(link))
    assert not trust.is_real_dir(link) and trust.is_real_dir(real)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "tier").mkdir(mode=0o700)
    assert "sticky" in trust.tier_problem(shared / "tier")
    with pytest.raises(CacheDirError, match="sticky"):
        trust.refuse_root_parents(shared / "tier")
    os.chmod(shared, 0o1777)
    assert trust.tier_problem(shared / "tier") is None


def test_same_file_notices_a_replacement(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"one")
    st = os.lstat(path)
    assert trust.same_file(path, st) and trust.regular_size(path) == 3
    (tmp_path / "g").write_bytes(b"two!")
    os.replace(tmp_path / "g", path)
    assert not trust.same_file(path, st)
    assert trust.regular_size(tmp_path) == 0
