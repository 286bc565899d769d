"""Fault tests of the compile cache with real processes and real CuTe DSL compiles.

No mocks of the store or the lock: workers are separate Python processes (tests/cache_worker.py)
sharing one cache dir. Only ENOSPC is simulated, by a test double for the file write.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from mlpjit.errors import CacheDirError
from mlpjit.jit import writable_tier
from mlpjit.jit.manager import CompileManager
from mlpjit.jit.spec import KernelRequest
from mlpjit.jit.store import CacheStore


def _finish(proc, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _spec(**kw) -> str:
    return json.dumps({"count": 1, "arch": "sm_90a", "mode": "get", **kw})


def _assert_consistent(root: Path) -> int:
    """Every committed entry verifies, no cubin lacks its manifest; returns the entry count."""
    entries = root / "v1" / "entries"
    manifests = {p.stem for p in entries.rglob("*.json")}
    cubins = {p.stem for p in entries.rglob("*.cubin")}
    assert cubins <= manifests, f"cubins without a manifest: {cubins - manifests}"
    store = CacheStore(root=root, read_only=())
    for key in manifests:
        assert store.lookup(key) is not None, key
    assert store.quarantined == 0
    return len(manifests)


def test_8_processes_16_keys_compile_each_key_once(cache_dir, run_worker):
    t0 = time.monotonic()
    procs = [run_worker(_spec(count=16, mode="warm")) for _ in range(8)]
    results = [_finish(p) for p in procs]
    elapsed = time.monotonic() - t0
    assert sum(r["stats"]["compiles"] for r in results) == 16
    assert all(r["sha"] == results[0]["sha"] for r in results)  # identical bytes everywhere
    assert len(results[0]["sha"]) == 16
    assert all(all(r["persisted"].values()) for r in results)
    assert _assert_consistent(cache_dir) == 16
    print(
        f"8 processes x 16 keys: {elapsed:.1f} s wall, "
        f"compiles per process {[r['stats']['compiles'] for r in results]}"
    )


def test_kill_9_mid_compile_another_process_completes(cache_dir, run_worker, tmp_path):
    hold = tmp_path / "holding"
    victim = run_worker(_spec(hold_file=str(hold), hold_seconds=120))
    deadline = time.monotonic() + 120
    while not hold.exists():
        assert victim.poll() is None, victim.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "victim never reached its compile"
        time.sleep(0.05)
    survivor = run_worker(_spec(lock_timeout=120))
    time.sleep(1.0)  # let the survivor block on the key lock
    os.kill(victim.pid, signal.SIGKILL)
    victim.communicate()
    result = _finish(survivor)
    assert result["stats"]["compiles"] == 1 and result["stats"]["lock_waits"] == 1
    assert all(result["persisted"].values())
    assert _assert_consistent(cache_dir) == 1
    assert list((cache_dir / "v1" / "tmp").iterdir()) == []


def _corrupt(root: Path, key: str, how: str, other_manifest: bytes) -> None:
    shard = root / "v1" / "entries" / key[:2]
    cubin, manifest = shard / f"{key}.cubin", shard / f"{key}.json"
    if how == "truncated cubin":
        cubin.write_bytes(cubin.read_bytes()[:100])
    elif how == "flipped byte":
        data = bytearray(cubin.read_bytes())
        data[len(data) // 2] ^= 0x01
        cubin.write_bytes(bytes(data))
    elif how == "garbage manifest":
        manifest.write_bytes(b'{"format": 1, "key": "' + key.encode() + b'", "compo')
    elif how == "manifest of another arch":
        manifest.write_bytes(other_manifest)
    else:  # pragma: no cover
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["truncated cubin", "flipped byte", "garbage manifest", "manifest of another arch"]
)
def test_corrupt_entry_is_quarantined_and_recompiled(cache_dir, run_worker, smoke_request, how):
    good = CompileManager().get(smoke_request(0))
    other = CompileManager().get(smoke_request(0, arch="sm_100a"))
    other_manifest = cache_dir / "v1" / "entries" / other.key[:2] / f"{other.key}.json"
    _corrupt(cache_dir, good.key, how, other_manifest.read_bytes())
    proc = run_worker(_spec())
    result = _finish(proc)
    assert result["stats"]["quarantined"] == 1 and result["stats"]["compiles"] == 1
    assert result["sha"] == {good.key: hashlib.sha256(good.cubin).hexdigest()}
    (qdir,) = (cache_dir / "v1" / "quarantine").iterdir()
    assert qdir.name.startswith(good.key)
    assert (qdir / "reason.txt").read_text().strip()
    assert _assert_consistent(cache_dir) == 2


def _readonly_prefix() -> tuple[str, ...]:
    """Run a child without the root capabilities that ignore file permissions."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot make a dir read-only for the child")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner")


def test_read_only_cache_dir_serves_with_one_warning(cache_dir, run_worker, smoke_request):
    warm = CompileManager().get(smoke_request(0))
    dirs = [cache_dir, *(p for p in cache_dir.rglob("*") if p.is_dir())]
    for path in dirs:
        os.chmod(path, 0o500)
    try:
        proc = run_worker(_spec(count=3), prefix=_readonly_prefix())
        out, err = proc.communicate(timeout=300)
    finally:
        for path in dirs:
            os.chmod(path, 0o700)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out)
    assert result["stats"]["hits"] == 1 and result["stats"]["compiles"] == 2
    assert result["persisted"][warm.key] is True and sum(result["persisted"].values()) == 1
    warnings = [line for line in err.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "cannot write the compile cache" in warnings[0], err
    assert _assert_consistent(cache_dir) == 1


def test_missing_parent_dir_is_created(tmp_path, monkeypatch, smoke_request):
    root = tmp_path / "a" / "b" / "cache"
    monkeypatch.setenv("MLPJIT_CACHE_DIR", str(root))
    entry = CompileManager().get(smoke_request(0))
    assert entry.persisted and (root.stat().st_mode & 0o777) == 0o700
    assert _assert_consistent(root) == 1


def test_uncreatable_cache_dir_serves_with_one_warning(
    tmp_path, monkeypatch, smoke_request, caplog
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a dir")
    monkeypatch.setenv("MLPJIT_CACHE_DIR", str(blocker / "cache"))
    manager = CompileManager()
    with caplog.at_level(logging.WARNING, logger="mlpjit"):
        entries = [manager.get(smoke_request(i)) for i in range(2)]
    assert [e.persisted for e in entries] == [False, False]
    assert all(e.binary().symbol for e in entries) and manager.stats.compiles == 2
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    assert blocker.read_text() == "not a dir"


def test_enospc_serves_with_one_warning(cache_dir, monkeypatch, smoke_request, caplog):
    def no_space(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writable_tier, "_write_all", no_space)
    manager = CompileManager()
    with caplog.at_level(logging.WARNING, logger="mlpjit"):
        entries = [manager.get(smoke_request(i)) for i in range(2)]
    assert [e.persisted for e in entries] == [False, False]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "ENOSPC" in warnings[0]
    assert _assert_consistent(cache_dir) == 0
    assert list((cache_dir / "v1" / "tmp").iterdir()) == []


def test_removals_while_workers_warm(cache_dir, run_worker):
    procs = [run_worker(_spec(count=16, mode="warm", rounds=2)) for _ in range(3)]
    store = CacheStore(root=cache_dir, read_only=())
    removed = 0
    while any(p.poll() is None for p in procs):
        for key, _ in list(store.iter_manifests()):
            removed += store.remove(key)
        time.sleep(0.02)
    results = [_finish(p) for p in procs]
    assert removed > 0
    for r in results:
        assert r["stats"]["quarantined"] == 0
        for key, sha in r["sha"].items():
            assert sha == results[0]["sha"][key]
    assert store.quarantined == 0
    _assert_consistent(cache_dir)


def test_group_writable_cache_dir_is_refused(cache_dir, smoke_request):
    CompileManager().get(smoke_request(0))
    os.chmod(cache_dir, 0o770)
    with pytest.raises(CacheDirError, match=f"chmod go-w {cache_dir}"):
        CompileManager().get(smoke_request(0))
    with pytest.raises(CacheDirError):
        CompileManager().get(KernelRequest("smoke", {"n": 64, "scale": 1.0, "block": 64}, "sm_90a"))
