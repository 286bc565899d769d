"""mlpjit.jit.safe_fs: operations through directory fds never follow a link or block."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from entries import hostile_file

from mlpjit.jit.safe_fs import (
    create_exclusive_at,
    lstat_at,
    open_append,
    opened_dir,
    remove_at,
    replace_at,
)


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "keep").write_text("keep")
    return outside


def test_remove_at_removes_a_tree_of_links_fifos_and_devices_not_their_targets(tmp_path):
    outside = _outside(tmp_path)
    tree = tmp_path / "tree"
    (tree / "deep").mkdir(parents=True)
    (tree / "deep" / "to-dir").symlink_to(outside)
    (tree / "deep" / "to-file").symlink_to(outside / "sub" / "keep")
    os.mkfifo(tree / "fifo")
    os.mknod(tree / "null", 0o666 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)
    (tree / "file").write_text("x")
    with opened_dir(tmp_path) as fd:
        assert remove_at(fd, "tree") and not remove_at(fd, "tree")
        (tmp_path / "link").symlink_to(outside)
        assert remove_at(fd, "link")
    assert not tree.exists() and not (tmp_path / "link").exists()
    assert (outside / "sub" / "keep").read_text() == "keep"


def test_opened_dir_refuses_a_symlinked_step(tmp_path):
    outside = _outside(tmp_path)
    (tmp_path / "a").symlink_to(outside)
    with pytest.raises(OSError), opened_dir(tmp_path, "a"):
        pass
    with pytest.raises(OSError), opened_dir(tmp_path / "a"):
        pass
    with opened_dir(tmp_path, "outside", "sub") as fd:
        assert lstat_at(fd, "keep") is not None and lstat_at(fd, "nothing") is None


def test_create_exclusive_sets_the_mode_whatever_the_umask_and_replace_swaps_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "dest").symlink_to(victim)
    old = os.umask(0o077)
    try:
        with opened_dir(tmp_path) as fd:
            out, name = create_exclusive_at(fd, ".x.", ".tmp", 0o644)
            os.write(out, b"new")
            os.close(out)
            replace_at(fd, name, "dest")
    finally:
        os.umask(old)
    dest = tmp_path / "dest"
    assert not dest.is_symlink() and dest.read_text() == "new" and victim.read_text() == "precious"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644


@pytest.mark.parametrize("how", ["symlink", "fifo", "other-owner", "group-writable", "dir"])
def test_open_append_refuses_what_is_not_our_own_regular_file(tmp_path, how):
    path = tmp_path / "record"
    (tmp_path / "target").write_text("")
    hostile_file(path, how, tmp_path / "target")
    with pytest.raises(OSError):
        os.close(open_append(path))


def test_open_append_creates_0600_and_appends(tmp_path):
    path = tmp_path / "record"
    for line in (b"a\n", b"b\n"):
        fd = open_append(path)
        os.write(fd, line)
        os.close(fd)
    assert path.read_bytes() == b"a\nb\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
