"""Cache archives (mlpjit.jit.archive): format, determinism, safe export, hostile archives."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from entries import child_env, limit_memory

from mlpjit.jit import archive as archive_module
from mlpjit.jit.archive import ARCHIVE_VERSION, INDEX_NAME, export_archive, import_archive
from mlpjit.jit.key import canonical_json
from mlpjit.jit.locks import KeyLock
from mlpjit.jit.manager import CompileManager
from mlpjit.jit.spec import KernelRequest
from mlpjit.jit.store import CacheStore


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> CacheStore:
    """A store holding two real smoke-kernel entries."""
    store = CacheStore(tmp_path_factory.mktemp("src") / "cache", read_only=())
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
    return CacheStore(tmp_path / "target", read_only=())


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

    copy = CacheStore(tmp_path / "copy", read_only=())
    shutil.copytree(source.root, copy.root)
    key = keys_in(copy)[0]
    cubin = copy.root / "v1" / "entries" / key[:2] / f"{key}.cubin"
    cubin.write_bytes(cubin.read_bytes()[:-4])
    report = export_archive(copy, tmp_path / "c.tar")
    assert report.entries == 1 and [s["key"] for s in report.skipped] == [key]


# ------------------------------------------------------------------ safe export


def test_export_never_writes_through_a_planted_symlink(source: CacheStore, tmp_path: Path) -> None:
    """A symlink planted at the old fixed temp name must not redirect the export."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    out = tmp_path / "out.tar"
    (tmp_path / ".out.tar.tmp").symlink_to(victim)
    old = os.umask(0)
    try:
        report = export_archive(source, out)
    finally:
        os.umask(old)
    assert victim.read_bytes() == b"precious"
    assert out.is_file() and not out.is_symlink()
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # explicit, not 0666 from umask 0
    assert report.bytes == out.stat().st_size and report.entries == 2
    assert (tmp_path / ".out.tar.tmp").readlink() == victim  # left alone
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.tar.tmp", "out.tar", "victim.txt"]


def test_export_refuses_a_symlink_at_the_destination(source: CacheStore, tmp_path: Path) -> None:
    """A link at the destination is neither followed nor replaced: the export is refused
    with one line naming the destination, and the link and its target stay as they were."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    out = tmp_path / "out.tar"
    out.symlink_to(victim)
    with pytest.raises(ValueError, match=r"^export destination .*out\.tar is a symbolic") as err:
        export_archive(source, out)
    assert "\n" not in str(err.value)
    assert victim.read_bytes() == b"precious" and out.readlink() == victim
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tar", "victim.txt"]


# ------------------------------------------------------------------ launch checksum


def _relisted(content: dict[str, bytes], key: str, manifest: bytes) -> dict[str, bytes]:
    """``content`` with ``key``'s manifest replaced and the index updated to match it."""
    index = json.loads(content[INDEX_NAME])
    for item in index["entries"]:
        if item["key"] == key:
            item["manifest_sha256"] = hashlib.sha256(manifest).hexdigest()
            item["manifest_bytes"] = len(manifest)
    out = {**content, f"entries/{key}.json": manifest}
    out[INDEX_NAME] = json.dumps(index).encode()
    return out


def _tar_bytes(content: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in content.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_every_bit_flip_of_an_archived_manifest_is_refused_or_harmless(
    source: CacheStore, archive: Path, tmp_path: Path
) -> None:
    """Even with an index that matches the flipped bytes, no flip changes the launch."""
    content = members(archive)
    key = json.loads(content[INDEX_NAME])["entries"][0]["key"]
    original = source.lookup(key).binary()
    manifest = content[f"entries/{key}.json"]
    target = target_store(tmp_path)
    path = tmp_path / "flipped.tar"
    accepted = 0
    for i in range(len(manifest)):
        for bit in range(8):
            flipped = bytearray(manifest)
            flipped[i] ^= 1 << bit
            path.write_bytes(_tar_bytes(_relisted(content, key, bytes(flipped))))
            report = import_archive(target, path)
            if key in report.imported:
                accepted += 1
                assert target.lookup(key).binary() == original, bytes(flipped)
                assert target.remove(key)
            else:
                assert [r["key"] for r in report.rejected] == [key]
    assert 0 < accepted < len(manifest)


def test_import_rejects_an_entry_without_launch_sha256(archive: Path, tmp_path: Path) -> None:
    """Archives exported before launch_sha256 existed: their entries are recompiled instead."""
    content = members(archive)
    key = json.loads(content[INDEX_NAME])["entries"][0]["key"]
    manifest = json.loads(content[f"entries/{key}.json"])
    del manifest["launch_sha256"]
    path = tmp_path / "old.tar"
    path.write_bytes(_tar_bytes(_relisted(content, key, canonical_json(manifest).encode())))
    report = import_archive(target_store(tmp_path), path)
    assert [r["key"] for r in report.rejected] == [key] and len(report.imported) == 1
    assert "launch_sha256" in report.rejected[0]["reason"]


@pytest.mark.parametrize("seconds", ["1e999", "9" * 400, "-1", "true", '"slow"'])
def test_unchecked_compile_seconds_cannot_crash_an_import(
    archive: Path, tmp_path: Path, seconds: str
) -> None:
    """compile_seconds decides nothing and no checksum covers it: inf, a 400-digit int or a
    non-number is imported as 0.0 instead of crashing the import partway."""
    content = members(archive)
    key = json.loads(content[INDEX_NAME])["entries"][0]["key"]
    text = content[f"entries/{key}.json"].decode()
    manifest = re.sub(r'"compile_seconds":[^,}]+', f'"compile_seconds":{seconds}', text)
    assert manifest != text
    path = tmp_path / "seconds.tar"
    path.write_bytes(_tar_bytes(_relisted(content, key, manifest.encode())))
    target = target_store(tmp_path)
    report = import_archive(target, path)
    assert key in report.imported and not report.rejected
    assert target.lookup(key).manifest["compile_seconds"] == 0.0


# ------------------------------------------------------------------ hostile input

DEEP = b"[" * 100_000


def test_deeply_nested_index_is_a_value_error(archive: Path, tmp_path: Path) -> None:
    content = {**members(archive), INDEX_NAME: DEEP}
    path = tmp_path / "deep.tar"
    path.write_bytes(_tar_bytes(content))
    with pytest.raises(ValueError, match="nested too deeply"):
        import_archive(target_store(tmp_path), path)


def test_deeply_nested_manifest_is_rejected_alone(archive: Path, tmp_path: Path) -> None:
    content = members(archive)
    key = json.loads(content[INDEX_NAME])["entries"][0]["key"]
    path = tmp_path / "deep.tar"
    path.write_bytes(_tar_bytes(_relisted(content, key, DEEP)))
    report = import_archive(target_store(tmp_path), path)
    assert [r["key"] for r in report.rejected] == [key] and len(report.imported) == 1
    assert "nested too deeply" in report.rejected[0]["reason"]


COMPRESSED = {".tar.gz": b"\x1f\x8b", ".tgz": b"\x1f\x8b", ".tar.xz": b"\xfd7zXZ\x00"}
COMPRESSED[".tar.bz2"] = b"BZh"


@pytest.mark.parametrize("suffix", sorted(COMPRESSED))
def test_a_compressed_name_exports_compressed_and_imports(
    source: CacheStore, archive: Path, tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"a{suffix}"
    report = export_archive(source, path)
    assert report.entries == 2 and report.bytes == path.stat().st_size
    assert path.read_bytes().startswith(COMPRESSED[suffix])
    assert path.stat().st_size < archive.stat().st_size
    export_archive(source, tmp_path / f"b{suffix}")
    assert (tmp_path / f"b{suffix}").read_bytes() == path.read_bytes()  # deterministic
    target = target_store(tmp_path)
    assert len(import_archive(target, path).imported) == 2
    assert keys_in(target) == keys_in(source)


def test_import_goes_by_content_not_by_name(source: CacheStore, tmp_path: Path) -> None:
    export_archive(source, tmp_path / "a.tar.xz")
    renamed = tmp_path / "looks-plain.tar"
    os.rename(tmp_path / "a.tar.xz", renamed)
    assert len(import_archive(target_store(tmp_path), renamed).imported) == 2


@pytest.mark.parametrize("name", ["a.tar.zst", "a.zip", "a.tar.lz4"])
def test_a_compression_export_does_not_write_is_refused(
    source: CacheStore, tmp_path: Path, name: str
) -> None:
    with pytest.raises(ValueError, match="does not write") as err:
        export_archive(source, tmp_path / name)
    assert "\n" not in str(err.value) and not (tmp_path / name).exists()
    assert os.listdir(tmp_path) == []


def test_a_zstd_archive_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "a.tar.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(64))
    with pytest.raises(ValueError, match="zstd-compressed") as err:
        import_archive(target_store(tmp_path), path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def _damaged(data: bytes, how: str) -> bytes:
    if how == "truncated":
        return data[: len(data) // 2]
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0x55 for b in data[middle : middle + 16]) + data[middle + 16 :]


@pytest.mark.parametrize("how", ["truncated", "corrupt"])
@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz", ".tar.bz2"])
def test_a_damaged_compressed_archive_is_one_line_and_writes_nothing(
    source: CacheStore, tmp_path: Path, suffix: str, how: str
) -> None:
    good = tmp_path / f"good{suffix}"
    export_archive(source, good)
    bad = tmp_path / f"bad{suffix}"
    bad.write_bytes(_damaged(good.read_bytes(), how))
    target = target_store(tmp_path)
    with pytest.raises(ValueError) as err:
        import_archive(target, bad)
    message = str(err.value)
    assert "\n" not in message and str(bad) in message, message
    assert keys_in(target) == []


def _gzip_of_zeros(path: Path, size: int) -> Path:
    import gzip

    with gzip.open(path, "wb") as out:
        for _ in range(size >> 20):
            out.write(bytes(1 << 20))
    return path


def test_the_cap_applies_to_decompressed_bytes(tmp_path: Path, monkeypatch) -> None:
    """A small file that inflates past MAX_ARCHIVE_BYTES is refused once the cap is reached:
    32 MiB of zeros are a 32 KiB gzip, and with a 4 MiB cap no more than that is written."""
    bomb = _gzip_of_zeros(tmp_path / "bomb.tar.gz", 32 << 20)
    assert bomb.stat().st_size < 64 << 10
    monkeypatch.setattr(archive_module, "MAX_ARCHIVE_BYTES", 4 << 20)
    written: list[int] = []
    real = archive_module.decompress_capped

    def spy(src, compression, cap):
        out = real(src, compression, cap)
        written.append(os.fstat(out.fileno()).st_size)
        return out

    monkeypatch.setattr(archive_module, "decompress_capped", spy)
    with pytest.raises(ValueError, match="decompresses to more than 4194304 bytes") as err:
        import_archive(target_store(tmp_path), bomb)
    assert "\n" not in str(err.value) and written == []


def test_decompress_capped_stops_at_the_cap(tmp_path: Path) -> None:
    from mlpjit.jit.compression import decompress_capped

    bomb = _gzip_of_zeros(tmp_path / "bomb.gz", 8 << 20)
    with open(bomb, "rb") as src:
        out = decompress_capped(src, "gz", 8 << 20)
    with out:
        assert os.fstat(out.fileno()).st_size == 8 << 20 and out.read(4) == bytes(4)
    with open(bomb, "rb") as src, pytest.raises(ValueError, match="more than 1048575 bytes"):
        decompress_capped(src, "gz", (1 << 20) - 1)


@pytest.mark.parametrize(
    "data", [b"", os.urandom(4096), b"\x00" * 100], ids=["empty", "random", "short"]
)
def test_garbage_file_is_a_one_line_value_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "garbage.tar"
    path.write_bytes(data)
    with pytest.raises(ValueError) as err:
        import_archive(target_store(tmp_path), path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_archive_over_the_size_cap_is_refused(
    archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive_module, "MAX_ARCHIVE_BYTES", archive.stat().st_size - 1)
    with pytest.raises(ValueError, match="byte limit"):
        import_archive(target_store(tmp_path), archive)


def test_reads_past_the_cap_fail(tmp_path: Path) -> None:
    """The reader import uses counts every byte, so a file that grows after its size was
    checked still cannot be read past MAX_ARCHIVE_BYTES."""
    path = tmp_path / "big"
    path.write_bytes(b"x" * 100)
    with archive_module._CappedReader(io.FileIO(path), 60, path) as reader:
        assert reader.read(50) == b"x" * 50
        reader.seek(0)
        with pytest.raises(ValueError, match="more than 60 bytes read"):
            reader.read(50)


def _import_in_child(path: Path, target: Path) -> subprocess.CompletedProcess:
    """import_archive in a child with a timeout and 1 GiB of address space; prints the
    one-line ValueError, if any."""
    code = (
        "import sys\n"
        "from mlpjit.jit.archive import import_archive\n"
        "from mlpjit.jit.store import CacheStore\n"
        "try:\n"
        "    import_archive(CacheStore(sys.argv[2], read_only=()), sys.argv[1])\n"
        "except ValueError as err:\n"
        "    print(err)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(path), str(target)],
        capture_output=True,
        text=True,
        timeout=20,
        preexec_fn=lambda: limit_memory(1 << 30),
        env=child_env(),
    )


def test_fifo_archive_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "a.tar"
    os.mkfifo(fifo, 0o600)
    proc = _import_in_child(fifo, tmp_path / "target")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not a regular file" in proc.stdout and proc.stdout.count("\n") == 1


@pytest.mark.parametrize("kind", ["fifo", "chardev", "directory"])
def test_export_refuses_a_destination_that_is_not_a_regular_file(
    source: CacheStore, tmp_path: Path, kind: str
) -> None:
    """`export /dev/null` as root must not replace the device: only a regular file may be
    overwritten."""
    dest = tmp_path / "dest"
    if kind == "fifo":
        os.mkfifo(dest)
    elif kind == "chardev":
        os.mknod(dest, 0o666 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)
    else:
        dest.mkdir()
    before = os.lstat(dest)
    with pytest.raises(ValueError, match="not a regular file") as err:
        export_archive(source, dest)
    assert "\n" not in str(err.value) and str(dest) in str(err.value)
    after = os.lstat(dest)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["dest"]  # no temp file left


def _raw_header(name: str, size: int, kind: bytes) -> bytes:
    """One 512-byte tar header claiming ``size`` bytes of content."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = kind
    return info.tobuf(format=tarfile.GNU_FORMAT)


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME])
def test_a_huge_extended_header_is_refused_before_it_is_read(tmp_path: Path, kind: bytes) -> None:
    """A 1 GiB PAX or long-name header is refused from its size field, in constant memory."""
    path = tmp_path / "a.tar"
    size = 1 << 30
    with open(path, "wb") as out:
        out.write(_raw_header("././@hdr", size, kind))
        out.truncate(512 + size + 1024)  # sparse: no disk used
    proc = _import_in_child(path, tmp_path / "target")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "header" in proc.stdout and "byte limit" in proc.stdout, proc.stdout
    assert not (tmp_path / "target").exists()


def test_too_many_members_are_refused_before_they_are_parsed(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    with open(path, "wb") as out:
        for i in range(archive_module.MAX_MEMBERS + 1):
            out.write(_raw_header(f"entries/{i:064x}.json", 0, tarfile.REGTYPE))
        out.write(b"\0" * 1024)
    proc = _import_in_child(path, tmp_path / "target")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"more than {archive_module.MAX_MEMBERS} members" in proc.stdout, proc.stdout


def test_a_member_over_its_cap_is_refused_from_its_header(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    with open(path, "wb") as out:
        out.write(_raw_header("entries/" + "a" * 64 + ".json", 1 << 30, tarfile.REGTYPE))
        out.truncate(512 + (1 << 30) + 1024)
    proc = _import_in_child(path, tmp_path / "target")
    assert "byte limit" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
