"""mlpjit.jit.manager with real CuTe DSL compiles of the smoke kernel (sm_90a, on the CPU)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
import tempfile
import threading

import pytest
from entries import hostile_file, run_python

from mlpjit.errors import CaptureError, CompilerUnavailableError, MlpjitError
from mlpjit.jit import key as keymod
from mlpjit.jit import manager as managermod
from mlpjit.jit.key import request_key
from mlpjit.jit.manager import CacheStats, CompileManager, default_manager
from mlpjit.jit.spec import KernelRequest
from mlpjit.jit.store import CacheStore

HOLD_KEY_LOCK = (
    "import sys, time, filelock; "
    "lock = filelock.FileLock(sys.argv[1], thread_local=False, preserve_lock_file=True); "
    "lock.acquire(); print('held', flush=True); time.sleep(60)"
)


def test_miss_compiles_once_then_hits(cache_dir, smoke_request, caplog):
    manager = CompileManager()
    req = smoke_request(0)
    with caplog.at_level(logging.DEBUG, logger="mlpjit"):
        entry = manager.get(req)
        again = manager.get(req)
    assert entry.persisted and again.cubin == entry.cubin
    assert entry.key == request_key(req)
    assert entry.cubin[:4] == b"\x7fELF"
    binary = entry.binary()
    assert binary.symbol.encode() in entry.cubin
    assert binary.grid == (8, 1, 1) and binary.block == (128, 1, 1) and binary.pdl
    assert [p.name for p in binary.params] == ["out", "x"]
    s = manager.stats
    assert (s.hits, s.misses, s.compiles, s.lock_waits, s.quarantined) == (1, 1, 1, 0, 0)
    assert s.compile_seconds > 0
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "smoke" in infos[0] and entry.key[:12] in infos[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # A fresh manager (another process's view) hits the disk entry.
    fresh = CompileManager()
    assert fresh.get(req).cubin == entry.cubin
    assert fresh.stats == CacheStats(hits=1)


def test_compiles_are_deterministic(cache_dir, smoke_request, tmp_path):
    first = CompileManager().get(smoke_request(1)).cubin
    other = CompileManager(CacheStore(root=tmp_path / "other-cache", read_only=()))
    assert other.get(smoke_request(1)).cubin == first


def test_threads_share_one_compile(cache_dir, smoke_request):
    manager = CompileManager()
    barrier = threading.Barrier(6)
    results, errors = [], []

    def worker():
        barrier.wait()
        try:
            results.append(manager.get(smoke_request(2)).cubin)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 6 and len(set(results)) == 1
    assert manager.stats.compiles == 1


def test_warm_reports_progress_in_order(cache_dir, smoke_request):
    reqs = [smoke_request(i) for i in range(4)] + [smoke_request(0)]
    seen = []
    entries = CompileManager().warm(reqs, progress=lambda d, t, r: seen.append((d, t, r)))
    assert [e.key for e in entries][0] == entries[-1].key
    assert [d for d, _, _ in seen] == [1, 2, 3, 4, 5] and {t for _, t, _ in seen} == {5}
    assert sorted(id(r) for _, _, r in seen) == sorted(id(r) for r in reqs)
    hits = CompileManager().warm(reqs)
    assert [e.cubin for e in hits] == [e.cubin for e in entries]


def test_record_appends_each_needed_request_once(cache_dir, smoke_request, monkeypatch, tmp_path):
    record = tmp_path / "needed.jsonl"
    monkeypatch.setenv("MLPJIT_RECORD", str(record))
    manager = CompileManager()
    for i in (0, 1, 0, 1, 0):
        manager.get(smoke_request(i))
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert lines == [
        {"kernel": "smoke", "params": smoke_request(i).params, "arch": "sm_90a"} for i in (0, 1)
    ]


def test_capture_during_miss_is_an_error(cache_dir, smoke_request, monkeypatch):
    monkeypatch.setattr(managermod, "_capturing", lambda: True)
    manager = CompileManager()
    with pytest.raises(CaptureError, match=r"smoke .*prepare\(\) before capture"):
        manager.get(smoke_request(0))
    assert manager.stats.compiles == 0
    monkeypatch.setattr(managermod, "_capturing", lambda: False)
    entry = manager.get(smoke_request(0))
    monkeypatch.setattr(managermod, "_capturing", lambda: True)
    assert CompileManager().get(smoke_request(0)).cubin == entry.cubin  # hits are fine


def _no_toolchain(monkeypatch):
    monkeypatch.setattr(keymod, "toolchain", lambda: {})
    monkeypatch.setattr(managermod, "toolchain", lambda: {})


def test_missing_compiler_error_names_key_and_fix(cache_dir, smoke_request, monkeypatch):
    _no_toolchain(monkeypatch)
    req = smoke_request(3)
    short = request_key(req)[:12]
    with pytest.raises(CompilerUnavailableError) as info:
        CompileManager().get(req)
    text = str(info.value)
    assert short in text and "smoke" in text and "pip install nvidia-cutlass-dsl" in text
    assert "mlpjit warm" in text and '"n": 1120' in text


def test_compiler_less_hit_through_the_alias(cache_dir, smoke_request, monkeypatch):
    built = CompileManager().get(smoke_request(4))
    _no_toolchain(monkeypatch)
    manager = CompileManager()
    entry = manager.get(smoke_request(4))
    assert entry.key == built.key and entry.cubin == built.cubin
    assert manager.stats == CacheStats(hits=1)


def test_bad_request_is_a_value_error(cache_dir):
    with pytest.raises(ValueError, match="KernelRequest"):
        CompileManager().get(("smoke", {}, "sm_90a"))
    with pytest.raises(ValueError, match="kernel must be one of"):
        CompileManager().get(KernelRequest("nope", {}, "sm_90a"))
    with pytest.raises(ValueError, match="smoke param n"):
        CompileManager().get(KernelRequest("smoke", {"n": 0, "scale": 1.0, "block": 32}, "sm_90a"))


def test_timed_out_waiter_compiles_and_publishes(cache_dir, smoke_request, caplog):
    manager = CompileManager(lock_timeout=0.3)
    req = smoke_request(5)
    key = request_key(req)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_KEY_LOCK, str(manager.store.lock_path(key))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with caplog.at_level(logging.WARNING, logger="mlpjit"):
            entry = manager.get(req)
        # Published next to the live holder, so the next process need not wait again.
        assert entry.persisted is True and entry.binary().symbol
        assert manager.store.lookup(key).cubin == entry.cubin
        fresh = CompileManager(lock_timeout=0.3)
        assert fresh.get(req).cubin == entry.cubin
        assert fresh.stats == CacheStats(hits=1)
    finally:
        holder.kill()
        holder.wait()
    s = manager.stats
    assert s.lock_waits == 1 and s.wait_seconds >= 0.25 and s.compiles == 1
    assert any("MLPJIT_LOCK_TIMEOUT" in r.getMessage() for r in caplog.records)
    # Once the holder is gone, the next process hits what the waiter published.
    assert CompileManager().get(req).persisted


def test_hung_compiler_costs_one_timeout_not_one_per_process(cache_dir, run_worker):
    """A process holds the key lock and never finishes; a worker with MLPJIT_LOCK_TIMEOUT=1
    waits it out, compiles and publishes; the next fresh process hits without waiting."""
    req = KernelRequest("smoke", {"n": 1024 + 32 * 7, "scale": 2.0, "block": 128}, "sm_90a")
    key = request_key(req)
    hold = (
        "import sys, time; from pathlib import Path; from mlpjit.jit.locks import KeyLock; "
        "from mlpjit.jit.store import CacheStore; "
        "lock = KeyLock(CacheStore(Path(sys.argv[1]), read_only=()).lock_path(sys.argv[2])); "
        "assert lock.try_acquire(); print('held', flush=True); time.sleep(120)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(cache_dir), key], stdout=subprocess.PIPE, text=True
    )
    spec = json.dumps({"count": 1, "first": 7, "arch": "sm_90a", "mode": "get"})
    try:
        assert holder.stdout.readline().strip() == "held"
        first = run_worker(spec, env={"MLPJIT_LOCK_TIMEOUT": "1"})
        out, err = first.communicate(timeout=300)
        assert first.returncode == 0, err[-3000:]
        waited = json.loads(out)
        assert waited["stats"]["lock_waits"] == 1 and waited["stats"]["wait_seconds"] >= 0.9
        assert waited["stats"]["compiles"] == 1 and waited["persisted"] == {key: True}
        second = run_worker(spec, env={"MLPJIT_LOCK_TIMEOUT": "1"})
        out, err = second.communicate(timeout=300)
        assert second.returncode == 0, err[-3000:]
        hit = json.loads(out)
        assert holder.poll() is None  # the lock was held all along
    finally:
        holder.kill()
        holder.wait()
    assert hit["stats"]["hits"] == 1 and hit["stats"]["compiles"] == 0
    assert hit["stats"]["lock_waits"] == 0 and hit["stats"]["wait_seconds"] == 0
    assert hit["sha"] == waited["sha"]


@pytest.mark.parametrize("bad", ["abc", "-1", "0", "nan"])
def test_bad_lock_timeout_fails_every_get_and_warm_up_front(
    cache_dir, smoke_request, monkeypatch, bad
):
    """Not only under lock contention: a hit, a miss and a warm all refuse it at once."""
    cached = CompileManager().get(smoke_request(0))
    monkeypatch.setenv("MLPJIT_LOCK_TIMEOUT", bad)
    manager = CompileManager()
    with pytest.raises(ValueError, match="MLPJIT_LOCK_TIMEOUT"):
        manager.get(smoke_request(0))  # would be a hit
    with pytest.raises(ValueError, match="MLPJIT_LOCK_TIMEOUT"):
        manager.get(smoke_request(1))  # would be an uncontended miss
    with pytest.raises(ValueError, match="MLPJIT_LOCK_TIMEOUT"):
        manager.warm([smoke_request(2)])
    assert manager.stats == CacheStats()
    assert [k for k, _ in manager.store.iter_manifests()] == [cached.key]
    monkeypatch.setenv("MLPJIT_LOCK_TIMEOUT", "5")
    assert manager.get(smoke_request(0)).cubin == cached.cubin


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 1e308, 10**400, "5", True])
def test_bad_lock_timeout_argument_fails_at_construction(bad):
    with pytest.raises(ValueError, match="lock_timeout"):
        CompileManager(lock_timeout=bad)


def test_unsupported_arch_is_refused_before_compiling(cache_dir, smoke_request):
    from mlpjit.jit.manager import check_compile_arch
    from mlpjit.kernels.fp8_gemv import SPEC as FP8_GEMV

    assert check_compile_arch(FP8_GEMV, "sm_90a") == "sm_90a"
    manager = CompileManager()
    for arch in ("sm_80", "sm_999", "sm_110a"):
        with pytest.raises(ValueError, match=r"kernel smoke compiles for sm_90, sm_90a, .*"):
            manager.get(smoke_request(0, arch=arch))
    with pytest.raises(ValueError, match=r"fp8_gemv compiles for sm_90a, not 'sm_100a'"):
        check_compile_arch(FP8_GEMV, "sm_100a")
    assert manager.stats.compiles == 0


def test_smoke_compiles_for_every_listed_arch(cache_dir):
    """Specs name only targets this toolchain builds (and that CuTe DSL knows)."""
    from cutlass.base_dsl.enums import Arch

    from mlpjit.kernels.fp8_gemv import SPEC as FP8_GEMV
    from mlpjit.testing.smoke import SPEC as SMOKE

    assert {*FP8_GEMV.archs, *SMOKE.archs} <= {a.name for a in Arch}
    manager = CompileManager()
    params = {"n": 96, "scale": 1.0, "block": 32}
    for arch in SMOKE.archs:
        assert manager.get(KernelRequest("smoke", params, arch)).binary().symbol
    assert manager.stats.compiles == len(SMOKE.archs)


@pytest.mark.filterwarnings("ignore:(?s).*TYPE_FLOAT_LITERAL_OVERFLOW")
def test_compile_failure_is_one_line_with_a_log_file(cache_dir, monkeypatch, tmp_path):
    """A real compiler failure (scale 1e308 overflows float32 and NVVM rejects the IR):
    one line naming kernel, key and arch, the compiler's first line and the full log."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    req = KernelRequest("smoke", {"n": 64, "scale": 1e308, "block": 64}, "sm_90a")
    key = request_key(req)
    with pytest.raises(MlpjitError) as info:
        CompileManager().get(req)
    message = str(info.value)
    assert "\n" not in message and "\x1b" not in message
    assert message.startswith(f"compiling smoke {key[:12]} for sm_90a failed: ")
    assert "CompilerDiagnosticError: error: NVVM backend compilation failed" in message
    (log,) = tmp_path.glob(f"mlpjit-compile-{key[:12]}-*.log")
    assert f"(full log: {log})" in message
    text = log.read_text()
    assert key in text and "Invalid identifier name" in text and "Traceback" in text
    assert (log.stat().st_mode & 0o777) == 0o600


def test_default_manager_is_process_wide():
    assert default_manager() is default_manager()


def test_hit_in_fresh_process_imports_no_cutlass(cache_dir, smoke_request, run_worker):
    entry = CompileManager().get(smoke_request(0))
    proc = run_worker(json.dumps({"count": 1, "arch": "sm_90a", "mode": "get"}))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert result["cutlass_loaded"] is False
    assert result["sha"] == {entry.key: hashlib.sha256(entry.cubin).hexdigest()}
    assert result["stats"]["hits"] == 1 and result["stats"]["compiles"] == 0


def test_request_json_line_round_trip() -> None:
    from mlpjit.jit.spec import KernelRequest

    request = KernelRequest("smoke", {"n": 4096, "scale": 2.0, "block": 128}, "sm_90a")
    line = request.to_json_line()
    assert "\n" not in line and line == KernelRequest.from_json_line(line).to_json_line()
    assert KernelRequest.from_json_line(line) == request
    for bad in ("", "{}", '{"kernel": "smoke"}', "[1, 2]"):
        with pytest.raises(ValueError, match="not a kernel request line"):
            KernelRequest.from_json_line(bad)


# ------------------------------------------------------------------ the fleet cache's wiring


def test_default_manager_builds_the_redis_tier_from_env(monkeypatch, caplog):
    """Nothing connects until a miss, so no Redis is needed to check the wiring."""
    for name in ("MLPJIT_REMOTE_PREFIX", "MLPJIT_REMOTE_TTL", "MLPJIT_REMOTE_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("MLPJIT_REMOTE_CACHE", raising=False)
    local = default_manager()
    assert local.remote is None
    monkeypatch.setenv("MLPJIT_REMOTE_CACHE", "redis://:pw@127.0.0.1:1/3")
    fleet = default_manager()
    assert fleet is not local and fleet is default_manager()
    assert fleet.remote is not None and fleet.remote.store is fleet.store
    assert fleet.remote.remote.url == "redis://:***@127.0.0.1:1/3"
    monkeypatch.setenv("MLPJIT_REMOTE_CACHE", "redis://:pw@127.0.0.1:1/4")  # another URL
    other = default_manager()
    assert other is not fleet and other.remote.remote.url.endswith("/4")
    monkeypatch.setenv("MLPJIT_REMOTE_PREFIX", "fleet-b:")  # another setting
    assert default_manager() is not other and default_manager().remote.remote.prefix == "fleet-b:"
    monkeypatch.setenv("MLPJIT_REMOTE_TTL", "soon")  # the fleet is optional: local only
    with caplog.at_level(logging.WARNING):
        assert default_manager().remote is None
    assert any("MLPJIT_REMOTE_TTL" in r.getMessage() for r in caplog.records)
    monkeypatch.delenv("MLPJIT_REMOTE_TTL")
    monkeypatch.delenv("MLPJIT_REMOTE_CACHE")
    assert default_manager().remote is None


def test_without_a_remote_neither_the_remote_package_nor_redis_is_imported():
    code = (
        "import sys; from mlpjit.jit.manager import default_manager; "
        "m = default_manager(); assert m.remote is None; "
        "print(sorted(n for n in sys.modules if n == 'redis' or n.startswith('mlpjit.jit.remote')))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLPJIT_REMOTE")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"


def test_a_redis_tier_must_be_over_the_managers_store(tmp_path):
    from mlpjit.jit.remote import RemoteCache, RemoteTier

    store = CacheStore(root=tmp_path / "a", read_only=())
    tier = RemoteTier(store, RemoteCache("redis://127.0.0.1:1/0"))
    assert CompileManager(remote=tier).store is store
    assert CompileManager(store, remote=tier).remote is tier
    with pytest.raises(ValueError, match="same store"):
        CompileManager(CacheStore(root=tmp_path / "b", read_only=()), remote=tier)
    stats = CompileManager(remote=tier).stats
    assert (stats.remote_hits, stats.remote_rejects, stats.uploads) == (0, 0, 0)


_GET_SMOKE = """
import mlpjit.testing.smoke
from mlpjit.jit.manager import CompileManager
from mlpjit.jit.spec import KernelRequest
CompileManager().get(KernelRequest("smoke", {"n": 1024, "scale": 2.0, "block": 128}, "sm_90a"))
"""


@pytest.mark.parametrize("how", ["symlink", "other-owner", "fifo", "group-writable"])
def test_record_file_is_never_followed_or_shared(cache_dir, tmp_path, how):
    """MLPJIT_RECORD is appended to only if it is our own regular file (or made by us): never
    through another user's symlink, never to a FIFO (no hang)."""
    record = tmp_path / "needed.jsonl"
    victim = tmp_path / "root-only"
    victim.write_text("secret\n")
    os.chmod(victim, 0o600)
    hostile_file(record, how, victim)  # a symlink: another user's link to a file only we write
    run = run_python(
        _GET_SMOKE, timeout=120, MLPJIT_CACHE_DIR=str(cache_dir), MLPJIT_RECORD=str(record)
    )
    assert run.returncode == 0, run.stderr
    assert "MLPJIT_RECORD" in run.stderr and "Traceback" not in run.stderr
    assert victim.read_text() == "secret\n"
    if how in ("other-owner", "group-writable"):
        assert record.read_text() == ""


def test_record_file_is_created_private(cache_dir, smoke_request, monkeypatch, tmp_path):
    record = tmp_path / "needed.jsonl"
    monkeypatch.setenv("MLPJIT_RECORD", str(record))
    old = os.umask(0)
    try:
        CompileManager().get(smoke_request(0))
    finally:
        os.umask(old)
    assert stat.S_IMODE(record.stat().st_mode) == 0o600 and record.read_text().count("\n") == 1


def test_obtain_says_how_the_flow_ended(cache_dir, smoke_request):
    from mlpjit.jit.manager import How

    manager, req = CompileManager(), smoke_request(7)
    lock = manager.store.writable.lock(request_key(req))
    assert lock.try_acquire()  # as if another process were compiling the key
    try:
        assert manager.obtain(req, wait=0) == managermod.BUSY
    finally:
        lock.release()
    compiled = manager.obtain(req, wait=0)
    assert compiled.how is How.COMPILED and compiled.entry is not None
    hit = CompileManager().obtain(req)
    assert hit.how is How.HIT and hit.entry.cubin == compiled.entry.cubin


@pytest.mark.parametrize("bad", [-1, float("nan"), 1e308, "0", True])
def test_obtain_refuses_a_bad_wait(cache_dir, smoke_request, bad):
    with pytest.raises(ValueError, match="wait"):
        CompileManager().obtain(smoke_request(0), wait=bad)
