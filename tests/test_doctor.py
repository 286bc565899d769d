"""`mlpjit doctor`: each check's verdict on a good, a degraded and a broken setup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_server import PASSWORD, RedisServer, free_port, start_redis, write_key_file

from mlpjit import doctor
from mlpjit.cli.output import human_size
from mlpjit.jit.binary import KernelBinary, KernelParam
from mlpjit.jit.key import cache_key, key_components
from mlpjit.jit.locks import KeyLock
from mlpjit.jit.store import CacheStore
from mlpjit.testing.smoke import SPEC as SMOKE

REPO = Path(__file__).resolve().parent.parent


def _check(report: doctor.DoctorReport, name: str) -> doctor.Check:
    found = [c for c in report.checks if c.name == name]
    assert found, f"no check {name!r} in {[c.name for c in report.checks]}"
    return found[0]


def _publish(store: CacheStore, i: int = 0) -> str:
    """A fake but well-formed entry (no compile needed)."""
    components = key_components(SMOKE, {"n": 1024 + 32 * i, "scale": 2.0, "block": 128}, "sm_90a")
    key = cache_key(components)
    binary = KernelBinary(
        cubin=b"\x7fELF fake cubin %d" % i,
        symbol="smoke_kernel",
        grid=(8, 1, 1),
        block=(128, 1, 1),
        smem_bytes=0,
        pdl=False,
        params=(KernelParam("out", "ptr"),),
    )
    store.publish(key, components, binary, 0.1)
    return key


def test_fresh_machine_is_ok_apart_from_the_gpu(cache_dir: Path) -> None:
    report = doctor.run_doctor()
    assert _check(report, "cache dir").status == "ok"
    assert "created 0700" in _check(report, "cache dir").summary
    assert not cache_dir.exists()  # the doctor creates nothing
    assert _check(report, "torch").status == "ok"
    assert report.exit_status == 0
    names = [c.name for c in report.checks]
    assert names[:2] == ["torch", "compiler"] and "locks" in names


def test_populated_cache_counts_entries_and_locks(cache_dir: Path) -> None:
    store = CacheStore(cache_dir, read_only=())
    keys = [_publish(store, i) for i in range(3)]
    held = KeyLock(store.lock_path(keys[0]))
    assert held.try_acquire()
    stale = KeyLock(store.lock_path(keys[1]))  # leaves a free lock file, like a dead compile
    assert stale.try_acquire()
    stale.release()
    try:
        report = doctor.run_doctor(verify=True)
    finally:
        held.release()
    cache = _check(report, "cache dir")
    assert cache.status == "ok" and cache.details["entries"] == 3
    # sizes for people in the line, the byte count in the details (--json)
    assert cache.summary.endswith(f"3 entries, {human_size(cache.details['bytes'])}")
    assert "bytes" not in cache.summary
    locks = _check(report, "locks")
    assert locks.status == "ok"
    assert locks.details["files"] == 2 and locks.details["held"] == 1
    assert _check(report, "verify").details["ok"] == 3


def test_group_writable_cache_dir_fails(cache_dir: Path) -> None:
    _publish(CacheStore(cache_dir, read_only=()))
    os.chmod(cache_dir, 0o770)
    report = doctor.run_doctor()
    check = _check(report, "cache dir")
    assert check.status == "fail"
    assert "group or other" in check.summary
    assert "chmod" in check.hint
    assert report.exit_status == 1
    assert "[fail] cache dir" in doctor.format_report(report)


def test_group_writable_subdir_fails(cache_dir: Path) -> None:
    key = _publish(CacheStore(cache_dir, read_only=()))
    os.chmod(cache_dir / "v1" / "entries" / key[:2], 0o777)
    check = _check(doctor.run_doctor(), "cache dir")
    assert check.status == "fail"
    assert key[:2] in check.summary


def test_missing_compiler_is_a_warning(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "_compiler_versions", dict)
    report = doctor.run_doctor()
    check = _check(report, "compiler")
    assert check.status == "warn"
    assert "hits only" in check.summary
    assert any("hits only" in m for m in report.missing)
    assert report.exit_status == 0


def test_missing_cuda_python_fails_only_with_a_kernel_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "_dist_version", lambda *names: {})
    gpu = [{"index": 0, "name": "H200", "capability": "9.0", "kernel_arch": "sm_90a"}]
    monkeypatch.setattr(doctor, "_gpus", lambda: gpu)
    report = doctor.run_doctor()
    assert _check(report, "cuda-python").status == "fail"
    assert _check(report, "gpu").status == "ok"
    monkeypatch.setattr(doctor, "_gpus", list)
    assert _check(doctor.run_doctor(), "cuda-python").status == "warn"


def test_gpu_with_another_sm_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H20 (78 SMs) takes the kernels, planned for its SM count: doctor says so and how
    to warm a cache for it elsewhere."""
    gpu = [{"index": 0, "name": "H20", "capability": "9.0", "kernel_arch": "sm_90a", "sms": 78}]
    monkeypatch.setattr(doctor, "_gpus", lambda: gpu)
    check = _check(doctor.run_doctor(), "gpu")
    assert check.status == "ok" and "78 SMs" in check.summary
    assert "mlpjit warm --sms 78" in check.summary
    gpu[0].update(name="H200", sms=132)
    check = _check(doctor.run_doctor(), "gpu")
    assert check.status == "ok" and "132 SMs" in check.summary and "--sms" not in check.summary


def test_gpu_without_kernels_and_arch_override(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = [{"index": 0, "name": "A100", "capability": "8.0", "kernel_arch": None}]
    monkeypatch.setattr(doctor, "_gpus", lambda: gpu)
    report = doctor.run_doctor()
    assert _check(report, "gpu").status == "warn"
    assert any("stock path" in m for m in report.missing)
    monkeypatch.setattr(doctor, "_gpus", list)
    monkeypatch.setenv("MLPJIT_ARCH", "sm_90a")
    assert _check(doctor.run_doctor(), "gpu").status == "ok"
    monkeypatch.setenv("MLPJIT_ARCH", "hopper")
    assert _check(doctor.run_doctor(), "gpu").status == "fail"


def test_bad_setting_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLPJIT_LOCK_TIMEOUT", "soon")
    check = _check(doctor.run_doctor(), "settings")
    assert check.status == "fail" and "MLPJIT_LOCK_TIMEOUT" in check.summary


def test_read_only_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "good"
    _publish(CacheStore(good, read_only=()))
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    missing = tmp_path / "missing"
    monkeypatch.setenv(
        "MLPJIT_CACHE_PATH", os.pathsep.join(map(str, (good, empty, shared, missing)))
    )
    report = doctor.run_doctor()
    status = {c.name: c.status for c in report.checks if c.name.startswith("read-only dir ")}
    assert status == {
        f"read-only dir {good}": "ok",
        f"read-only dir {empty}": "warn",
        f"read-only dir {shared}": "warn",
        f"read-only dir {missing}": "warn",
    }
    assert _check(report, f"read-only dir {good}").details["entries"] == 1


def test_quarantine_is_reported(cache_dir: Path) -> None:
    store = CacheStore(cache_dir, read_only=())
    key = _publish(store)
    (cache_dir / "v1" / "entries" / key[:2] / f"{key}.cubin").write_bytes(b"tampered")
    report = doctor.run_doctor(verify=True)
    assert _check(report, "verify").status == "fail"
    assert _check(report, "leftovers").status == "warn"  # verify moved it to quarantine
    assert report.exit_status == 1


def test_a_crashing_check_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> dict:
        raise RuntimeError("broken install")

    monkeypatch.setattr(doctor, "_compiler_versions", boom)
    check = _check(doctor.run_doctor(), "compiler")
    assert check.status == "fail" and "broken install" in check.summary


def test_json_output_and_exit_status(cache_dir: Path) -> None:
    cache_dir.mkdir(mode=0o700)
    os.chmod(cache_dir, 0o757)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "mlpjit.doctor", "--json"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert data["status"] == "fail"
    assert {c["name"]: c["status"] for c in data["checks"]}["cache dir"] == "fail"
    os.chmod(cache_dir, 0o700)
    done = subprocess.run(
        [sys.executable, "-m", "mlpjit.doctor"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("doctor: ")


# ------------------------------------------------------------------ the fleet cache


@pytest.fixture
def no_remote(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No MLPJIT_REMOTE_* from the caller's shell: each test sets what it checks."""
    for name in ("CACHE", "PREFIX", "TTL", "TIMEOUT", "KEY_FILE"):
        monkeypatch.delenv(f"MLPJIT_REMOTE_{name}", raising=False)
    return monkeypatch


@pytest.fixture
def redis_auth_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server (tests/redis_server.py) that wants PASSWORD."""
    server = start_redis(tmp_path / "redis", password=PASSWORD)
    yield server
    server.kill()


def test_no_remote_check_when_the_fleet_cache_is_unset(no_remote) -> None:
    assert "remote" not in [c.name for c in doctor.run_doctor().checks]


def test_remote_check_reports_the_server_entries_and_fleet_counters(
    no_remote, redis_auth_server: RedisServer, tmp_path: Path
) -> None:
    from mlpjit.jit.archive import portable_manifest
    from mlpjit.jit.remote import RemoteCache

    store = CacheStore(tmp_path / "node", read_only=())
    key_file = write_key_file(tmp_path / "fleet.key")
    remote = RemoteCache(redis_auth_server.url(), secret=key_file.read_bytes())
    for i in range(2):
        entry = store.lookup(_publish(store, i))
        assert remote.upload(entry.key, portable_manifest(entry), entry.cubin)
    no_remote.setenv("MLPJIT_REMOTE_CACHE", redis_auth_server.url())
    no_remote.setenv("MLPJIT_REMOTE_KEY_FILE", str(key_file))
    report = doctor.run_doctor()
    check = _check(report, "remote")
    assert check.status == "ok" and report.exit_status == 0
    assert "2 entries" in check.summary and "2 uploads" in check.summary
    assert ", signed)" in check.summary and check.details["signed"] is True
    assert check.details["auth_ok"] and check.details["server_version"] in check.summary
    assert PASSWORD not in json.dumps(report.to_dict())


@pytest.mark.parametrize("case", ["wrong-password", "unreachable"])
def test_an_unusable_remote_is_a_warning(
    no_remote, redis_auth_server: RedisServer, case: str
) -> None:
    if case == "unreachable":
        url = f"redis://127.0.0.1:{free_port()}/0"
    else:
        url = redis_auth_server.url(password="wrong-pass")
    no_remote.setenv("MLPJIT_REMOTE_CACHE", url)
    report = doctor.run_doctor()
    check = _check(report, "remote")
    assert check.status == "warn" and report.exit_status == 0  # processes carry on locally
    assert ("refused the login" if case == "wrong-password" else "unreachable") in check.summary
    assert "local cache only" in check.summary and "wrong-pass" not in check.summary


def test_an_unsigned_remote_is_a_warning(no_remote, redis_auth_server: RedisServer) -> None:
    no_remote.setenv("MLPJIT_REMOTE_CACHE", redis_auth_server.url())
    report = doctor.run_doctor()
    check = _check(report, "remote")
    assert check.status == "warn" and report.exit_status == 0
    assert ", unsigned)" in check.summary and "integrity-checked only" in check.summary
    assert "MLPJIT_REMOTE_KEY_FILE" in check.hint


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MLPJIT_REMOTE_CACHE", "http://x:1/0"),
        ("MLPJIT_REMOTE_TTL", "0"),
        ("MLPJIT_REMOTE_KEY_FILE", "/nonexistent/fleet.key"),
    ],
)
def test_a_malformed_remote_setting_fails(no_remote, name: str, value: str) -> None:
    no_remote.setenv("MLPJIT_REMOTE_CACHE", "redis://127.0.0.1:1/0")
    no_remote.setenv(name, value)
    report = doctor.run_doctor()
    check = _check(report, "remote")
    assert check.status == "fail" and name in check.summary and report.exit_status == 1
