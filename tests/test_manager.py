"""mlpjit.jit.manager with real CuTe DSL compiles of the smoke kernel (sm_90a, on the CPU)."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import threading

import pytest

from mlpjit.errors import CaptureError, CompilerUnavailableError
from mlpjit.jit import key as keymod
from mlpjit.jit import manager as managermod
from mlpjit.jit.key import cache_key, key_components
from mlpjit.jit.manager import CacheStats, CompileManager, KernelRequest, default_manager
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
    assert entry.key == cache_key(key_components(req.kernel, req.params, req.arch))
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
    other = CompileManager(CacheStore(root=tmp_path / "other-cache", layers=()))
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
    short = cache_key(key_components(req.kernel, req.params, req.arch))[:12]
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


def test_timed_out_waiter_compiles_but_does_not_publish(cache_dir, smoke_request, caplog):
    manager = CompileManager(lock_timeout=0.3)
    req = smoke_request(5)
    key = cache_key(key_components(req.kernel, req.params, req.arch))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_KEY_LOCK, str(manager.store.lock_path(key))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with caplog.at_level(logging.WARNING, logger="mlpjit"):
            entry = manager.get(req)
    finally:
        holder.kill()
        holder.wait()
    assert entry.persisted is False and entry.binary().symbol
    assert manager.store.lookup(key) is None  # nothing published next to the live holder
    s = manager.stats
    assert s.lock_waits == 1 and s.wait_seconds >= 0.25 and s.compiles == 1
    assert any("MLPJIT_LOCK_TIMEOUT" in r.getMessage() for r in caplog.records)
    # Once the holder is gone, the next process publishes normally.
    assert CompileManager().get(req).persisted


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
    from mlpjit.jit.manager import KernelRequest

    request = KernelRequest("smoke", {"n": 4096, "scale": 2.0, "block": 128}, "sm_90a")
    line = request.to_json_line()
    assert "\n" not in line and line == KernelRequest.from_json_line(line).to_json_line()
    assert KernelRequest.from_json_line(line) == request
    for bad in ("", "{}", '{"kernel": "smoke"}', "[1, 2]"):
        with pytest.raises(ValueError, match="not a kernel request line"):
            KernelRequest.from_json_line(bad)
