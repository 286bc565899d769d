"""The store's trust rules (docs/SERVER.md, Security model) against hostile files and dirs.

No mocks: real symlinks, FIFOs, /dev/zero, chown to another uid (the tests run as root, so
"another user" is uid nobody and permission denial cannot be used), and child processes with
a timeout and a memory limit wherever a regression would hang or eat memory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from entries import OTHER_UID, as_other_user, limit_memory, made, paths, publish, world_dir

from mlpjit.errors import CacheDirError
from mlpjit.jit.binary import KernelBinary
from mlpjit.jit.cache_layout import MAX_CUBIN_BYTES
from mlpjit.jit.key import canonical_json, spec_key
from mlpjit.jit.store import CacheStore

CHILD_TIMEOUT = 30

_made, _publish, _paths, _limit_memory = made, publish, paths, limit_memory


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


_CHILD = """
import json, sys
from pathlib import Path
from mlpjit.jit.store import CacheStore
key, layer = sys.argv[1], sys.argv[2]
store = CacheStore(read_only=[Path(layer)] if layer else ())
hit = store.lookup(key) is not None
listed = dict(store.iter_manifests())
alias = store.lookup_alias(sys.argv[3]) is not None
print(json.dumps({"hit": hit, "alias": alias, "quarantined": store.quarantined,
                  "listed": {k: "error" in m for k, m in listed.items()}}))
"""


def _lookup_in_child(key: str, spec: str, layer: Path | None = None) -> dict:
    """lookup, iter_manifests and lookup_alias in a child process that must finish in 30 s."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, key, str(layer or ""), spec],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        preexec_fn=_limit_memory,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


# ------------------------------------------------------------------ 2. read-only layers


def _layer_dir(layer: Path, key: str, which: str) -> Path:
    v1 = layer / "v1"
    return {
        "v1": v1,
        "entries": v1 / "entries",
        "shard": v1 / "entries" / key[:2],
        "aliases": v1 / "aliases",
    }[which]


@pytest.mark.parametrize("which", ["v1", "entries", "shard"])
@pytest.mark.parametrize("how", ["group-writable", "other-writable", "other-owner", "symlink"])
def test_unsafe_dir_inside_a_read_only_dir_skips_its_entries(
    tmp_path, cache_dir, caplog, which, how
):
    layer = tmp_path / "layer"
    key, components, binary = _publish(layer)
    path = _layer_dir(layer, key, which)
    if how == "group-writable":
        os.chmod(path, 0o775)
    elif how == "other-writable":
        os.chmod(path, 0o757)
    elif how == "other-owner":
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        real = tmp_path / "moved"
        path.rename(real)
        path.symlink_to(real)
    store = CacheStore(read_only=[layer])
    with caplog.at_level(logging.WARNING, logger="mlpjit"):
        assert store.lookup(key) is None
        assert store.lookup(key) is None
        assert store.lookup_alias(spec_key(components)) is None
        assert key not in dict(store.iter_manifests())
    assert len(_warnings(caplog)) == 1, _warnings(caplog)  # warned once, not per lookup
    assert "read-only cache dir" in _warnings(caplog)[0]
    assert _paths(layer, key)[1].exists()  # a layer is never modified


@pytest.mark.parametrize("how", ["group-writable", "other-owner"])
def test_unsafe_aliases_dir_of_a_read_only_dir_is_not_used(tmp_path, cache_dir, how):
    layer = tmp_path / "layer"
    key, components, _ = _publish(layer)
    aliases = _layer_dir(layer, key, "aliases")
    if how == "group-writable":
        os.chmod(aliases, 0o770)
    else:
        os.chown(aliases, OTHER_UID, OTHER_UID)
    store = CacheStore(read_only=[layer])
    assert store.lookup_alias(spec_key(components)) is None
    assert store.lookup(key) is not None  # the entry itself is still fine


def test_read_only_dir_owned_by_root_is_served_one_owned_by_another_user_is_not(
    tmp_path, cache_dir
):
    """A layer is trusted by the writable root's rule: owned by us or root, nobody else."""
    layer = tmp_path / "layer"
    key, components, binary = _publish(layer)
    os.chown(_paths(layer, key)[1], 0, 0)  # root-owned files are trusted
    entry = CacheStore(read_only=[layer]).lookup(key)
    assert entry is not None and entry.origin == layer and entry.binary() == binary
    for path in [layer, *layer.rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID)
    store = CacheStore(read_only=[layer])
    assert store.lookup(key) is None and store.lookup_alias(spec_key(components)) is None
    assert dict(store.iter_manifests()) == {}


@pytest.mark.parametrize(
    "mode, owner", [(0o777, 0), (0o770, 0), (0o757, 0), (0o1777, OTHER_UID)], ids=str
)
def test_read_only_dir_inside_a_dir_others_can_write_is_skipped(
    tmp_path, cache_dir, caplog, mode, owner
):
    """Whoever can write a directory above a layer can rename it away and put theirs there."""
    shared = tmp_path / "shared"
    layer = shared / "deep" / "layer"
    key, _, _ = _publish(layer)
    os.chmod(shared, mode)
    os.chown(shared, owner, owner)
    store = CacheStore(read_only=[layer])
    with caplog.at_level(logging.WARNING, logger="mlpjit"):
        assert store.lookup(key) is None and dict(store.iter_manifests()) == {}
    assert len(_warnings(caplog)) == 1 and str(shared) in _warnings(caplog)[0]


def test_read_only_dir_inside_a_sticky_dir_of_root_is_served(tmp_path, cache_dir):
    sticky = tmp_path / "sticky"
    layer = sticky / "layer"
    key, _, binary = _publish(layer)
    os.chmod(sticky, 0o1777)
    assert CacheStore(read_only=[layer]).lookup(key).binary() == binary


_PLANT = """
import sys
from pathlib import Path
from entries import publish
become_other_user()
print(publish(Path(sys.argv[1]))[0])
"""


def test_missing_read_only_dir_filled_by_another_user_later_is_never_trusted(cache_dir):
    """A layer path that is missing when the store starts is skipped for good: another user
    who creates it later with self-consistent entries gets none of them served."""
    shared = world_dir("layer")
    try:
        layer = shared / "layer"
        store = CacheStore(read_only=[layer])
        assert store.lookup(made(0)[0]) is None
        planted = as_other_user(_PLANT, str(layer))
        assert planted.returncode == 0, planted.stderr
        key = planted.stdout.strip()
        assert os.stat(layer).st_uid == OTHER_UID
        assert store.lookup(key) is None and dict(store.iter_manifests()) == {}
        assert store.lookup_alias(spec_key(made(0)[1])) is None
        assert CacheStore(read_only=[layer]).lookup(key) is None  # another user's: never
    finally:
        shutil.rmtree(shared)


def test_missing_read_only_dir_is_not_trusted_later_even_if_ours(tmp_path, cache_dir):
    layer = tmp_path / "layer"
    store = CacheStore(read_only=[layer])
    assert store.lookup(made(0)[0]) is None
    key, _, binary = _publish(layer)
    assert store.lookup(key) is None  # what was checked (nothing) is what is used
    assert CacheStore(read_only=[layer]).lookup(key).binary() == binary


@pytest.mark.parametrize("name", ["cubin", "manifest"])
@pytest.mark.parametrize("how", ["other-owner", "group-writable", "other-writable"])
def test_untrusted_entry_file_in_a_read_only_dir_is_skipped(tmp_path, cache_dir, caplog, name, how):
    layer = tmp_path / "layer"
    key, _, _ = _publish(layer)
    mpath, cpath = _paths(layer, key)
    path = cpath if name == "cubin" else mpath
    before = path.read_bytes()
    if how == "other-owner":
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        os.chmod(path, 0o620 if how == "group-writable" else 0o602)
    store = CacheStore(read_only=[layer])
    with caplog.at_level(logging.WARNING, logger="mlpjit"):
        assert store.lookup(key) is None
        assert store.lookup(key) is None
    assert len(_warnings(caplog)) == 1 and "skipping bad entry" in _warnings(caplog)[0]
    assert path.read_bytes() == before and mpath.exists() and cpath.exists()


# ------------------------------------------------------------------ 3. the writable root


def test_symlinked_root_is_resolved_once(tmp_path):
    real, other, link = tmp_path / "real", tmp_path / "other", tmp_path / "link"
    real.mkdir(mode=0o700)
    link.symlink_to(real)
    store = CacheStore(root=link, read_only=())
    key, components, binary = _made(0)
    assert store.publish(key, components, binary, 0.1).persisted
    # Someone re-points the link at a cache of theirs, holding a valid entry for that key.
    planted = KernelBinary(**{**vars(binary), "cubin": b"\x7fELF planted"})
    CacheStore(root=other, read_only=()).publish(key, components, planted, 0.1)
    swapped = tmp_path / "swapped"
    swapped.symlink_to(other)
    os.replace(swapped, link)
    assert store.lookup(key).binary() == binary
    key1, components1, binary1 = _made(1)
    store.publish(key1, components1, binary1, 0.1)
    assert _paths(real, key1)[1].exists() and not _paths(other, key1)[1].exists()
    assert {k for k, _ in store.iter_manifests()} == {key, key1}
    assert store.root == real and store.configured_root == link


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757], ids=oct)
def test_root_inside_a_dir_others_can_write_is_refused(tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    root = shared / "cache"
    key, components, binary = _made(0)
    CacheStore(root=root, read_only=()).publish(key, components, binary, 0.1)
    os.chmod(shared, mode)
    with pytest.raises(CacheDirError, match=f"chmod go-w {shared}"):
        CacheStore(root=root, read_only=()).lookup(key)
    with pytest.raises(CacheDirError, match="sticky"):
        CacheStore(root=root, read_only=()).publish(key, components, binary, 0.1)
    with pytest.raises(CacheDirError):  # also before the root exists
        CacheStore(root=shared / "new", read_only=()).publish(key, components, binary, 0.1)
    assert not (shared / "new").exists()


def test_root_inside_a_sticky_dir_is_accepted(tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # like /tmp
    key, components, binary = _made(0)
    store = CacheStore(root=sticky / "a" / "cache", read_only=())
    assert store.publish(key, components, binary, 0.1).persisted
    assert CacheStore(root=sticky / "a" / "cache", read_only=()).lookup(key).binary() == binary
    assert stat.S_IMODE((sticky / "a").stat().st_mode) & 0o022 == 0


def test_missing_parents_are_created_safe_under_any_umask(tmp_path):
    root = tmp_path / "x" / "y" / "cache"
    key, components, binary = _made(0)
    old = os.umask(0)
    try:
        assert CacheStore(root=root, read_only=()).publish(key, components, binary, 0.1).persisted
    finally:
        os.umask(old)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for parent in (tmp_path / "x", tmp_path / "x" / "y"):
        assert stat.S_IMODE(parent.stat().st_mode) == 0o755


@pytest.mark.parametrize("name", ["cubin", "manifest"])
@pytest.mark.parametrize("how", ["other-owner", "group-writable", "other-writable"])
def test_untrusted_entry_file_in_the_root_is_quarantined(cache_dir, name, how):
    key, components, binary = _publish(cache_dir)
    mpath, cpath = _paths(cache_dir, key)
    path = cpath if name == "cubin" else mpath
    if how == "other-owner":
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        os.chmod(path, 0o620 if how == "group-writable" else 0o602)
    store = CacheStore()
    assert store.lookup(key) is None and store.quarantined == 1
    assert not mpath.exists() and not cpath.exists()
    (qdir,) = (cache_dir / "v1" / "quarantine").iterdir()
    reason = (qdir / "reason.txt").read_text()
    assert ("uid" in reason) if how == "other-owner" else ("writable by group or other" in reason)
    assert store.publish(key, components, binary, 0.1).persisted  # and it can be rebuilt
    assert CacheStore().lookup(key).binary() == binary


def test_symlinked_shard_in_the_root_is_refused(cache_dir, tmp_path):
    key, _, _ = _publish(cache_dir)
    shard = _paths(cache_dir, key)[0].parent
    elsewhere = tmp_path / "elsewhere"
    shard.rename(elsewhere)
    shard.symlink_to(elsewhere)
    with pytest.raises(CacheDirError, match="not a directory"):
        CacheStore().lookup(key)


# ------------------------------------------------------------------ 4. launch checksum


def _flips(data: bytes):
    """Every single-bit flip of ``data``."""
    for i in range(len(data)):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[i] ^= 1 << bit
            yield bytes(flipped)


def test_every_manifest_bit_flip_is_refused_or_harmless(cache_dir):
    """No single-bit change of a manifest can make its cubin launch differently."""
    key, _, binary = _publish(cache_dir)
    mpath, cpath = _paths(cache_dir, key)
    manifest, cubin = mpath.read_bytes(), cpath.read_bytes()
    store = CacheStore()
    accepted = 0
    for flipped in _flips(manifest):
        mpath.write_bytes(flipped)
        cpath.write_bytes(cubin)  # a refused flip quarantines both files
        entry = store.lookup(key)
        if entry is not None:
            accepted += 1
            assert entry.binary() == binary, flipped
    assert store.quarantined == len(manifest) * 8 - accepted
    assert 0 < accepted < len(manifest)  # only fields that do not decide the launch


def test_manifest_without_launch_sha256_is_quarantined_and_rebuilt(cache_dir):
    """An entry from before launch_sha256 existed counts as corrupt: it is recompiled."""
    key, components, binary = _publish(cache_dir)
    mpath, _ = _paths(cache_dir, key)
    old = json.loads(mpath.read_bytes())
    del old["launch_sha256"]
    mpath.write_bytes(canonical_json(old).encode())
    store = CacheStore()
    assert store.lookup(key) is None and store.quarantined == 1
    (qdir,) = (cache_dir / "v1" / "quarantine").iterdir()
    assert "launch_sha256" in (qdir / "reason.txt").read_text()
    store.publish(key, components, binary, 0.1)
    assert CacheStore().lookup(key).binary() == binary


def test_consistent_launch_edit_is_refused(cache_dir):
    """Editing a launch field by hand (valid JSON, right types) is caught by launch_sha256."""
    key, _, _ = _publish(cache_dir)
    mpath, _ = _paths(cache_dir, key)
    for field, value in [
        ("grid", [16, 2, 1]),
        ("block", [256, 1, 1]),
        ("smem_bytes", 0),
        ("pdl", False),
        ("symbol", "other"),
        ("params", [{"name": "out", "kind": "ptr"}]),
        ("cluster", [4, 1, 1]),
    ]:
        _publish(cache_dir)
        manifest = json.loads(mpath.read_bytes())
        manifest[field] = value
        mpath.write_bytes(canonical_json(manifest).encode())
        assert CacheStore().lookup(key) is None, field


# ------------------------------------------------------------------ 5. unparsable JSON

DEEP = b"[" * 100_000


def test_deeply_nested_manifest_is_a_corrupt_entry(cache_dir):
    key, _, _ = _publish(cache_dir)
    mpath, cpath = _paths(cache_dir, key)
    mpath.write_bytes(DEEP)
    listed = dict(CacheStore().iter_manifests())
    assert "nested too deeply" in listed[key]["error"]
    assert CacheStore().remove(key) is True and not cpath.exists()
    _publish(cache_dir)
    mpath.write_bytes(DEEP)
    store = CacheStore()
    assert store.lookup(key) is None and store.quarantined == 1


def test_deeply_nested_manifest_in_a_read_only_dir_is_skipped(tmp_path, cache_dir):
    layer = tmp_path / "layer"
    key, _, _ = _publish(layer)
    _paths(layer, key)[0].write_bytes(DEEP)
    store = CacheStore(read_only=[layer])
    assert store.lookup(key) is None
    assert "error" in dict(store.iter_manifests())[key]


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xfe\x00", b"[1, 2]", b'{"last_used": "soon"}', b'{"last_used": [1]}', b"9" * 5000],
    ids=["bad-utf", "array", "string-last-used", "list-last-used", "huge-int"],
)
def test_unparsable_or_odd_manifest_never_raises(cache_dir, garbage):
    key, _, _ = _publish(cache_dir)
    _paths(cache_dir, key)[0].write_bytes(garbage)
    store = CacheStore()
    listed = dict(store.iter_manifests())
    assert key in listed
    assert store.lookup(key) is None and store.quarantined == 1


# ------------------------------------------------------------------ 6. only regular files


def _make_hostile(path: Path, how: str) -> None:
    path.unlink()
    if how == "fifo":
        os.mkfifo(path, 0o600)
    elif how == "dev-zero":
        path.symlink_to("/dev/zero")
    else:  # "oversize": sparse, so it costs no disk
        with open(path, "wb") as f:
            f.truncate(MAX_CUBIN_BYTES + 1)


HOSTILE = [
    ("cubin", "fifo"),
    ("manifest", "fifo"),
    ("cubin", "dev-zero"),
    ("manifest", "dev-zero"),
    ("cubin", "oversize"),
]


@pytest.mark.parametrize(("name", "how"), HOSTILE)
def test_non_regular_or_huge_file_in_the_root_is_quarantined(cache_dir, name, how):
    key, components, _ = _publish(cache_dir)
    mpath, cpath = _paths(cache_dir, key)
    _make_hostile(cpath if name == "cubin" else mpath, how)
    result = _lookup_in_child(key, spec_key(components))
    assert result["hit"] is False and result["alias"] is False and result["quarantined"] == 1
    assert not mpath.exists() and not os.path.lexists(cpath)
    (qdir,) = (cache_dir / "v1" / "quarantine").iterdir()
    reason = (qdir / "reason.txt").read_text()
    assert any(word in reason for word in ("regular file", "symbolic link", "limit")), reason


@pytest.mark.parametrize(("name", "how"), HOSTILE)
def test_non_regular_or_huge_file_in_a_read_only_dir_is_skipped(tmp_path, cache_dir, name, how):
    layer = tmp_path / "layer"
    key, components, _ = _publish(layer)
    mpath, cpath = _paths(layer, key)
    path = cpath if name == "cubin" else mpath
    _make_hostile(path, how)
    result = _lookup_in_child(key, spec_key(components), layer)
    assert result["hit"] is False and result["quarantined"] == 0
    assert result["listed"] == {key: name == "manifest"}  # a bad manifest is listed as an error
    assert os.path.lexists(path)  # left where it is


def test_fifo_alias_does_not_hang(cache_dir):
    key, components, _ = _publish(cache_dir)
    alias = cache_dir / "v1" / "aliases" / spec_key(components)
    alias.unlink()
    os.mkfifo(alias, 0o600)
    result = _lookup_in_child(key, spec_key(components))
    assert result["hit"] is True and result["alias"] is False
    remove = f"from mlpjit.jit.store import CacheStore; CacheStore().remove({key!r})"
    proc = subprocess.run([sys.executable, "-c", remove], timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0 and not _paths(cache_dir, key)[0].exists()
