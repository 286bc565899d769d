"""Cache archives (mlpjit.jit.archive) in process: format, determinism, hostile archives."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from mlpjit.jit.archive import ARCHIVE_VERSION, INDEX_NAME, export_archive, import_archive
from mlpjit.jit.key import canonical_json
from mlpjit.jit.locks import KeyLock
from mlpjit.jit.manager import CompileManager, KernelRequest
from mlpjit.jit.store import CacheStore


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> CacheStore:
    """A store holding two real smoke-kernel entries."""
    store = CacheStore(tmp_path_factory.mktemp("src") / "cache", layers=())
    manager = CompileManager(store)
    for n in (256, 512):
        manager.get(KernelRequest("smoke", {"n": n, "scale": 3.0, "block": 64}, "sm_90a"))
    return store


@pytest.fixture
def archive(source: CacheStore, tmp_path: Path) -> Path:
    path = tmp_path / "a.tar"
    export_archive(source, path)
    return path


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def write_tar(path: Path, items: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in items:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def target_store(tmp_path: Path) -> CacheStore:
    return CacheStore(tmp_path / "target", layers=())


def keys_in(store: CacheStore) -> list[str]:
    return sorted(k for k, _ in store.iter_manifests())


def test_export_format_is_deterministic_and_complete(
    source: CacheStore, archive: Path, tmp_path: Path
) -> None:
    report = export_archive(source, tmp_path / "b.tar")
    assert report.entries == 2 and report.skipped == []
    assert (tmp_path / "b.tar").read_bytes() == archive.read_bytes()
    with tarfile.open(archive) as tar:
        infos = tar.getmembers()
    assert infos[0].name == INDEX_NAME
    assert all(m.isreg() and m.mtime == 0 and m.uid == 0 and m.mode == 0o644 for m in infos)
    content = members(archive)
    index = json.loads(content[INDEX_NAME])
    assert index["format"] == "mlpjit-archive" and index["version"] == ARCHIVE_VERSION
    assert [e["key"] for e in index["entries"]] == keys_in(source)
    for item in index["entries"]:
        cubin = content[f"entries/{item['key']}.cubin"]
        manifest = content[f"entries/{item['key']}.json"]
        assert hashlib.sha256(cubin).hexdigest() == item["cubin_sha256"]
        assert hashlib.sha256(manifest).hexdigest() == item["manifest_sha256"]
        assert "last_used" not in json.loads(manifest) and "origin" not in json.loads(manifest)
        assert item["kernel"] == "smoke"


def test_export_subset_and_unknown_key(source: CacheStore, tmp_path: Path) -> None:
    key = keys_in(source)[0]
    assert export_archive(source, tmp_path / "one.tar", keys=[key]).entries == 1
    assert len(json.loads(members(tmp_path / "one.tar")[INDEX_NAME])["entries"]) == 1
    with pytest.raises(ValueError, match="not in the cache"):
        export_archive(source, tmp_path / "none.tar", keys=["f" * 64])
    assert not (tmp_path / "none.tar").exists()


def test_import_round_trip_byte_identical(
    source: CacheStore, archive: Path, tmp_path: Path
) -> None:
    target = target_store(tmp_path)
    report = import_archive(target, archive)
    assert sorted(report.imported) == keys_in(source)
    assert report.skipped == [] and report.rejected == []
    for key in keys_in(source):
        assert target.lookup(key).cubin == source.lookup(key).cubin
        assert target.lookup(key).origin == target.root
    again = import_archive(target, archive)
    assert again.imported == [] and len(again.skipped) == 2


def test_import_skips_a_key_being_compiled(archive: Path, tmp_path: Path) -> None:
    target = target_store(tmp_path)
    key = json.loads(members(archive)[INDEX_NAME])["entries"][0]["key"]
    lock = KeyLock(target.lock_path(key))
    assert lock.try_acquire()
    try:
        report = import_archive(target, archive)
    finally:
        lock.release()
    assert [s["key"] for s in report.skipped] == [key] and len(report.imported) == 1


def _hostile(archive: Path, tmp_path: Path, kind: str) -> Path:
    """``archive`` plus (or with) one hostile change."""
    content = members(archive)
    key = json.loads(content[INDEX_NAME])["entries"][0]["key"]
    items = [regular(name, data) for name, data in content.items()]
    if kind == "hardlink":
        info = tarfile.TarInfo("entries/" + "1" * 64 + ".json")
        info.type, info.linkname = tarfile.LNKTYPE, INDEX_NAME
        items.append((info, None))
    elif kind == "device":
        info = tarfile.TarInfo("entries/" + "2" * 64 + ".cubin")
        info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
        items.append((info, None))
    elif kind == "directory":
        info = tarfile.TarInfo("entries")
        info.type = tarfile.DIRTYPE
        items.append((info, None))
    elif kind == "unknown":
        items.append(regular("README.txt", b"hi"))
    elif kind == "unlisted":
        items.append(regular("entries/" + "3" * 64 + ".cubin", b"\x7fELF"))
    elif kind == "duplicate":
        items.append(regular(f"entries/{key}.cubin", b"other"))
    elif kind == "missing":
        items = [i for i in items if i[0].name != f"entries/{key}.json"]
    elif kind == "no-index":
        items = [i for i in items if i[0].name != INDEX_NAME]
    elif kind == "bad-index":
        items = [regular(INDEX_NAME, b"{not json")] + items[1:]
    elif kind == "future-version":
        index = json.loads(content[INDEX_NAME])
        index["version"] = ARCHIVE_VERSION + 1
        items = [regular(INDEX_NAME, json.dumps(index).encode())] + items[1:]
    elif kind == "backslash":
        items.append(regular("entries\\..\\x", b"x"))
    return write_tar(tmp_path / f"{kind}.tar", items)


@pytest.mark.parametrize(
    "kind",
    [
        "hardlink",
        "device",
        "directory",
        "unknown",
        "unlisted",
        "duplicate",
        "missing",
        "no-index",
        "bad-index",
        "future-version",
        "backslash",
    ],
)
def test_import_rejects_hostile_archive_whole(archive: Path, tmp_path: Path, kind: str) -> None:
    target = target_store(tmp_path)
    with pytest.raises(ValueError):
        import_archive(target, _hostile(archive, tmp_path, kind))
    assert keys_in(target) == []


def test_import_rejects_entry_whose_components_do_not_hash_to_its_key(
    archive: Path, tmp_path: Path
) -> None:
    content = members(archive)
    index = json.loads(content[INDEX_NAME])
    victim = index["entries"][0]
    name = f"entries/{victim['key']}.json"
    manifest = json.loads(content[name])
    manifest["components"]["params"]["n"] = 999  # a consistent but lying archive
    content[name] = canonical_json(manifest).encode()
    victim["manifest_sha256"] = hashlib.sha256(content[name]).hexdigest()
    victim["manifest_bytes"] = len(content[name])
    content[INDEX_NAME] = json.dumps(index).encode()
    path = write_tar(tmp_path / "liar.tar", [regular(n, d) for n, d in content.items()])

    target = target_store(tmp_path)
    report = import_archive(target, path)
    assert [r["key"] for r in report.rejected] == [victim["key"]]
    assert "hash" in report.rejected[0]["reason"]
    assert victim["key"] not in keys_in(target) and len(report.imported) == 1


def test_not_a_tar_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "x.tar"
    path.write_bytes(b"definitely not a tar archive" * 40)
    with pytest.raises(ValueError, match="not a readable tar"):
        import_archive(target_store(tmp_path), path)


def test_export_skips_a_corrupt_entry(source: CacheStore, tmp_path: Path) -> None:
    import shutil

    copy = CacheStore(tmp_path / "copy", layers=())
    shutil.copytree(source.root, copy.root)
    key = keys_in(copy)[0]
    cubin = copy.root / "v1" / "entries" / key[:2] / f"{key}.cubin"
    cubin.write_bytes(cubin.read_bytes()[:-4])
    report = export_archive(copy, tmp_path / "c.tar")
    assert report.entries == 1 and [s["key"] for s in report.skipped] == [key]
