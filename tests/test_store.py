"""mlpjit.jit.store: layout, atomic publish, verification, layers, aliases, safety checks."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import time
from dataclasses import replace

import pytest

from mlpjit.errors import CacheDirError
from mlpjit.jit import cache_layout, writable_tier
from mlpjit.jit.binary import KernelBinary, KernelParam, launch_sha256
from mlpjit.jit.entry import Entry
from mlpjit.jit.key import FORMAT_VERSION, cache_key, key_components, spec_key
from mlpjit.jit.locks import KeyLock
from mlpjit.jit.store import CacheStore
from mlpjit.testing.smoke import SPEC as SMOKE


def _made(i: int = 0, arch: str = "sm_90a") -> tuple[str, dict, KernelBinary]:
    components = key_components(SMOKE, {"n": 1024 + i, "scale": 2.0, "block": 128}, arch)
    binary = KernelBinary(
        cubin=bytes([i % 256]) * 100 + b"\x7fELF" + os.urandom(8),
        symbol=f"kernel_{i}",
        grid=(8 + i, 1, 1),
        block=(128, 1, 1),
        smem_bytes=0,
        pdl=True,
        params=(KernelParam("out", "ptr"), KernelParam("x", "ptr")),
    )
    return cache_key(components), components, binary


def _paths(root, key):
    shard = root / "v1" / "entries" / key[:2]
    return shard / f"{key}.json", shard / f"{key}.cubin"


def test_publish_then_lookup_round_trip(cache_dir):
    store = CacheStore()
    assert store.root == cache_dir
    key, components, binary = _made()
    assert store.lookup(key) is None  # no root yet: a miss, not an error
    published = store.publish(key, components, binary, 1.25)
    assert published.persisted
    entry = CacheStore().lookup(key)
    assert isinstance(entry, Entry) and entry.origin == cache_dir
    assert entry.cubin == binary.cubin and entry.binary() == binary
    m = entry.manifest
    assert m["components"] == components and m["key"] == key
    assert m["cubin_sha256"] == hashlib.sha256(binary.cubin).hexdigest()
    assert m["cubin_bytes"] == len(binary.cubin) and m["compile_seconds"] == 1.25
    assert m["created"] <= m["last_used"] and m["spec_key"] == spec_key(components)
    for field in ("symbol", "grid", "block", "smem_bytes", "pdl", "params"):
        assert field in m
    mpath, cpath = _paths(cache_dir, key)
    assert mpath.is_file() and cpath.is_file()
    assert (cache_dir / "v1" / "aliases" / spec_key(components)).read_text().strip() == key
    assert not any((cache_dir / "v1" / "tmp").iterdir())  # no temp files left behind


def test_root_and_subdirs_are_private(cache_dir):
    key, components, binary = _made()
    CacheStore().publish(key, components, binary, 0.1)
    for path in (cache_dir, cache_dir / "v1", cache_dir / "v1" / "entries" / key[:2]):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    assert stat.S_IMODE(_paths(cache_dir, key)[1].stat().st_mode) == 0o600


@pytest.mark.parametrize("where", ["root", "v1", "entries"])
@pytest.mark.parametrize("bits", [0o020, 0o002])
def test_group_or_other_writable_dir_is_refused(cache_dir, where, bits):
    key, components, binary = _made()
    CacheStore().publish(key, components, binary, 0.1)
    target = {"root": cache_dir, "v1": cache_dir / "v1", "entries": cache_dir / "v1" / "entries"}
    path = target[where]
    os.chmod(path, 0o700 | bits)
    with pytest.raises(CacheDirError, match=f"chmod go-w {path}"):
        CacheStore().lookup(key)
    with pytest.raises(CacheDirError):
        CacheStore().publish(key, components, binary, 0.1)


def test_existing_unsafe_root_refused_before_first_write(tmp_path, monkeypatch):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("MLPJIT_CACHE_DIR", str(root))
    key, components, binary = _made()
    with pytest.raises(CacheDirError, match=str(root)):
        CacheStore().publish(key, components, binary, 0.1)
    assert list(root.iterdir()) == []


def test_publish_rejects_mismatched_key(cache_dir):
    key, components, binary = _made(0)
    other_key, _, _ = _made(1)
    with pytest.raises(ValueError, match="cache_key"):
        CacheStore().publish(other_key, components, binary, 0.1)


@pytest.mark.parametrize("bad", ["", "abc", "../" + "a" * 61, "A" * 64])
def test_keys_are_validated(bad):
    with pytest.raises(ValueError, match="64 lowercase hex"):
        CacheStore().lookup(bad)


def test_read_only_dirs_are_searched_after_the_root_and_never_modified(tmp_path, cache_dir):
    layer = tmp_path / "layer"
    key, components, binary = _made(0)
    key2, components2, binary2 = _made(1)
    CacheStore(root=layer, read_only=()).publish(key, components, binary, 0.1)
    CacheStore(root=layer, read_only=()).publish(key2, components2, binary2, 0.1)
    store = CacheStore(read_only=[layer])
    entry = store.lookup(key)
    assert entry is not None and entry.origin == layer and entry.cubin == binary.cubin
    # The root wins over a layer.
    root_bin = KernelBinary(**{**vars(binary), "cubin": b"root-copy"})
    store.publish(key, components, root_bin, 0.1)
    assert store.lookup(key).origin == cache_dir
    # A bad entry in a layer is skipped, not moved (layers are read-only).
    _, cpath = _paths(layer, key2)
    cpath.write_bytes(b"tampered")
    assert CacheStore(read_only=[layer]).lookup(key2) is None
    assert cpath.read_bytes() == b"tampered"
    # A layer writable by others is ignored with a warning.
    os.chmod(layer, 0o777)
    assert CacheStore(read_only=[layer]).lookup(key2) is None


def test_read_only_dirs_come_from_env(tmp_path, monkeypatch):
    layer = tmp_path / "layer"
    key, components, binary = _made()
    CacheStore(root=layer, read_only=()).publish(key, components, binary, 0.1)
    monkeypatch.setenv("MLPJIT_CACHE_PATH", os.pathsep.join([str(tmp_path / "nope"), str(layer)]))
    assert CacheStore().lookup(key).origin == layer


def test_alias_finds_an_entry_for_another_toolchain(cache_dir):
    key, components, binary = _made()
    store = CacheStore()
    store.publish(key, components, binary, 0.1)
    no_tc = {**components, "toolchain": {}}
    assert spec_key(no_tc) == spec_key(components)
    entry = store.lookup_alias(spec_key(no_tc))
    assert entry is not None and entry.key == key
    assert store.lookup_alias(spec_key({**components, "arch": "sm_100a"})) is None


def test_bad_root_entry_is_quarantined(cache_dir, caplog):
    key, components, binary = _made()
    store = CacheStore()
    store.publish(key, components, binary, 0.1)
    mpath, cpath = _paths(cache_dir, key)
    cpath.write_bytes(cpath.read_bytes()[:-1] + b"\x00")
    with caplog.at_level(logging.WARNING, logger="mlpjit"):
        assert store.lookup(key) is None
    assert store.quarantined == 1
    assert not mpath.exists() and not cpath.exists()
    (qdir,) = (cache_dir / "v1" / "quarantine").iterdir()
    assert "sha256" in (qdir / "reason.txt").read_text()
    assert (qdir / mpath.name).exists() and (qdir / cpath.name).exists()
    assert any("quarantined" in r.message and r.levelno == logging.WARNING for r in caplog.records)


def test_iter_manifests_and_remove(cache_dir):
    store = CacheStore()
    made = [_made(i) for i in range(3)]
    for key, components, binary in made:
        store.publish(key, components, binary, 0.1)
    garbage_key = "f" * 64
    mpath, _ = _paths(cache_dir, garbage_key)
    mpath.parent.mkdir(mode=0o700)
    mpath.write_text("{not json")
    listed = dict(store.iter_manifests())
    assert set(listed) == {k for k, _, _ in made} | {garbage_key}
    assert "error" in listed[garbage_key]
    assert listed[made[0][0]]["origin"] == str(cache_dir)
    key0, components0, _ = made[0]
    assert store.remove(key0) is True
    assert store.lookup(key0) is None and store.remove(key0) is False
    assert not (cache_dir / "v1" / "aliases" / spec_key(components0)).exists()
    # An entry whose lock is held (being compiled) is not removed.
    key1 = made[1][0]
    holder = KeyLock(store.lock_path(key1))
    assert holder.try_acquire()
    try:
        assert store.remove(key1) is False
    finally:
        holder.release()
    assert store.lookup(key1) is not None


def test_last_used_is_touched_once_per_process_and_never_rewritten(cache_dir):
    key, components, binary = _made()
    CacheStore().publish(key, components, binary, 0.1)
    mpath, _ = _paths(cache_dir, key)
    content = mpath.read_bytes()
    old = time.time() - 3600
    os.utime(mpath, (old, old))
    store = CacheStore()
    store.lookup(key)
    assert mpath.stat().st_mtime == pytest.approx(old)  # a plain read is not a use
    entry = store.lookup(key, use=True)  # a load for a launch is
    assert mpath.stat().st_mtime > old + 3000
    assert entry.manifest["last_used"] >= mpath.stat().st_mtime - 1
    os.utime(mpath, (old, old))
    store.lookup(key, use=True)
    assert mpath.stat().st_mtime == pytest.approx(old)  # once per process
    assert mpath.read_bytes() == content


def test_enospc_serves_in_memory_with_one_warning(cache_dir, monkeypatch, caplog):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writable_tier, "_write_all", full)
    store = CacheStore()
    with caplog.at_level(logging.WARNING, logger="mlpjit"):
        for i in range(3):
            key, components, binary = _made(i)
            entry = store.publish(key, components, binary, 0.1)
            assert entry.persisted is False and entry.cubin == binary.cubin
            assert entry.binary() == binary
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "ENOSPC" in warnings[0].getMessage()
    assert list((cache_dir / "v1" / "entries").rglob("*")) == [] or all(
        p.is_dir() for p in (cache_dir / "v1" / "entries").rglob("*")
    )
    assert list((cache_dir / "v1" / "tmp").iterdir()) == []


def test_manifest_failure_after_cubin_leaves_nothing(cache_dir, monkeypatch):
    calls = []
    real = writable_tier._write_all

    def second_write_fails(fd, data):
        calls.append(len(data))
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(writable_tier, "_write_all", second_write_fails)
    key, components, binary = _made()
    assert CacheStore().publish(key, components, binary, 0.1).persisted is False
    mpath, cpath = _paths(cache_dir, key)
    assert not mpath.exists() and not cpath.exists()
    assert list((cache_dir / "v1" / "tmp").iterdir()) == []


@pytest.mark.parametrize("cluster", [(1, 1, 1), (2, 1, 1)])
def test_manifest_on_disk_describes_its_entry(cache_dir, cluster):
    """The manifest file, read back as plain JSON, is the entry: format and key, components
    hashing to the key, the cubin's sha256 and size, the binary's launch fields, and a
    launch_sha256 recomputed here from those fields and the cubin file."""
    key, components, binary = _made(3)
    binary = replace(binary, cluster=cluster)
    CacheStore().publish(key, components, binary, 0.25)
    mpath, cpath = _paths(cache_dir, key)
    manifest = json.loads(mpath.read_text())
    cubin = cpath.read_bytes()
    launch = {
        "symbol": binary.symbol,
        "grid": list(binary.grid),
        "block": list(binary.block),
        "smem_bytes": binary.smem_bytes,
        "pdl": binary.pdl,
        "params": [{"name": p.name, "kind": p.kind} for p in binary.params],
    }
    if cluster != (1, 1, 1):
        launch["cluster"] = list(cluster)  # written only for cluster launches
    assert set(manifest) == {
        "format", "key", "spec_key", "components", *launch, "cubin_sha256", "cubin_bytes",
        "launch_sha256", "compile_seconds", "created", "last_used",
    }  # fmt: skip
    assert manifest["format"] == FORMAT_VERSION and manifest["key"] == key
    assert manifest["components"] == components and cache_key(manifest["components"]) == key
    assert manifest["spec_key"] == spec_key(components)
    assert cubin == binary.cubin
    assert manifest["cubin_sha256"] == hashlib.sha256(cubin).hexdigest()
    assert manifest["cubin_bytes"] == len(cubin)
    assert {name: manifest[name] for name in launch} == launch
    payload = {"key": key, "cubin_sha256": hashlib.sha256(cubin).hexdigest(), "launch": launch}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    assert manifest["launch_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert manifest["launch_sha256"] == launch_sha256(key, binary)
    assert manifest["compile_seconds"] == 0.25
    assert manifest["created"] == manifest["last_used"] <= time.time()


@pytest.mark.parametrize("bad", ["a" * 64 + "\n", "A" * 64, "a" * 63, "a" * 65, None])
def test_check_key_takes_exactly_64_lowercase_hex(bad) -> None:
    """Keys become file names: a trailing newline ("$" would allow it) is refused too."""
    assert cache_layout.is_key("a" * 64) and cache_layout.check_key("0" * 64) == "0" * 64
    assert not cache_layout.is_key(bad)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        cache_layout.check_key(bad)
