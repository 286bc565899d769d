"""mlpjit.jit.locks: exclusive across processes, non-blocking try, bounded wait, crash-safe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mlpjit.jit.locks import KeyLock

HOLD = (
    "import sys, time, filelock; "
    "lock = filelock.FileLock(sys.argv[1], thread_local=False, preserve_lock_file=True); "
    "lock.acquire(); print('held', flush=True); time.sleep(float(sys.argv[2]))"
)


def _holder(path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_try_acquire_and_release(tmp_path):
    path = tmp_path / "k.lock"
    a, b = KeyLock(path), KeyLock(path)
    assert a.try_acquire() and a.held and a.shared
    assert not b.try_acquire()  # a second holder (even in-process) is excluded
    a.release()
    assert not a.held and b.try_acquire()
    b.release()
    assert path.exists()  # lock files are kept (no unlink races)


def test_other_process_excludes_and_wait_is_bounded(tmp_path):
    path = tmp_path / "k.lock"
    proc = _holder(path, 30)
    try:
        lock = KeyLock(path)
        assert not lock.try_acquire()
        t0 = time.monotonic()
        assert lock.acquire(0.3) is False
        assert 0.25 <= time.monotonic() - t0 < 3
    finally:
        proc.kill()
        proc.wait()


def test_kill_9_frees_the_lock(tmp_path):
    path = tmp_path / "k.lock"
    proc = _holder(path, 60)
    lock = KeyLock(path)
    assert not lock.try_acquire()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert lock.acquire(5.0)
    lock.release()


def test_waiter_gets_lock_when_holder_exits(tmp_path):
    path = tmp_path / "k.lock"
    proc = _holder(path, 0.5)
    lock = KeyLock(path)
    t0 = time.monotonic()
    assert lock.acquire(10.0)
    assert time.monotonic() - t0 < 5
    lock.release()
    proc.wait()


def test_unusable_lock_dir_degrades_to_no_op(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    lock = KeyLock(blocker / "locks" / "k.lock")  # parent is a regular file
    assert lock.try_acquire() and lock.held and not lock.shared
    lock.release()
    with KeyLock(None) as none:
        assert none.acquire(1.0) and not none.shared


def test_bad_timeout(tmp_path):
    with pytest.raises(ValueError, match="timeout"):
        KeyLock(tmp_path / "k.lock").acquire(0)


def test_a_lock_on_a_removed_file_is_taken_again(tmp_path):
    """A process that locks a lock file just after its holder removed it (prune, clear) and
    a newcomer made and locked a new one must not count as holding the key: it takes the
    lock again, on the file now at the path."""
    path = tmp_path / "k.lock"
    waiter = KeyLock(path)
    newcomer = KeyLock(path)
    real = waiter._lock.acquire
    raced: list[bool] = []

    def acquire_on_the_removed_file(*args, **kw):
        real(*args, **kw)  # locked the old file ...
        if not raced:  # ... which the remover had unlinked, and a newcomer locked a new one
            raced.append(True)
            path.unlink()
            assert newcomer.try_acquire()

    waiter._lock.acquire = acquire_on_the_removed_file
    assert not waiter.try_acquire()  # the file at the path is the newcomer's, held
    assert not waiter.held
    newcomer.release()
    assert waiter.try_acquire() and path.exists()
    waiter.release()


def test_remove_lock_file_needs_the_lock_and_a_regular_file(tmp_path):
    from mlpjit.jit.locks import remove_lock_file

    path = tmp_path / "k.lock"
    lock = KeyLock(path)
    assert not remove_lock_file(lock)  # not held
    assert lock.try_acquire()
    assert remove_lock_file(lock) and not path.exists()
    lock.release()
