"""`mlpjit cache clear|prune` remove what killed processes leave, and nothing still in use.

Real processes, real files: publishers and compiles are killed with SIGKILL, live ones are
real processes holding real temp files, key locks and scratch dirs. Only the CuTe DSL compile
call is held open (a test double that sleeps inside it) so a kill lands mid-compile.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from entries import paths, publish, run_cli, sentinel, sentinel_intact

from mlpjit.jit import scratch
from mlpjit.jit.key import spec_key
from mlpjit.jit.maintenance import prune_cache
from mlpjit.jit.manager import CompileManager
from mlpjit.jit.store import CacheStore

REPO = Path(__file__).resolve().parent.parent
HOUR = 3600.0

# Writes temp files through the store's own publish step (what a publish leaves between its
# write and its rename), prints their paths, then waits to be killed.
PUBLISHER = """
import sys, time
from pathlib import Path
from mlpjit.jit.store import CacheStore
store = CacheStore(Path(sys.argv[1]), read_only=())
store.writable.make_dirs(store.root / "v1" / "tmp")
for _ in range(int(sys.argv[2])):
    print(store.writable._write_temp(b"half a publish"), flush=True)
time.sleep(120)
"""

HOLD_KEY_LOCK = """
import sys, time
from pathlib import Path
from mlpjit.jit.locks import KeyLock
from mlpjit.jit.store import CacheStore
lock = KeyLock(CacheStore(Path(sys.argv[1]), read_only=()).lock_path(sys.argv[2]))
assert lock.try_acquire()
print("held", flush=True)
time.sleep(120)
"""

# A real smoke compile whose CuTe DSL compile call sleeps before returning, inside the
# compile's scratch dir: a kill now is a kill mid-compile.
SLOW_COMPILE = """
import sys, time
import cutlass.cute as cute
from mlpjit.testing import smoke
real = cute.compile
def held(*args, options="", **kw):
    compiled = real(*args, options=options, **kw)
    print(options.split("--dump-dir ")[1], flush=True)
    time.sleep(120)
    return compiled
cute.compile = held
smoke.compile_cubin(smoke.SmokeParams(n=int(sys.argv[1]), scale=1.0, block=64), "sm_90a")
"""


def _env(tmpdir: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return env


def _start(code: str, *args: str, tmpdir: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=_env(tmpdir)
    )


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL and reap (a zombie's pid would still count as alive)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _cli(cache: Path, tmpdir: Path, *args: str) -> dict:
    """`mlpjit ARGS --json` against ``cache``, with ``tmpdir`` as the temp dir."""
    env = _env(tmpdir)
    env["MLPJIT_CACHE_DIR"] = str(cache)
    run = subprocess.run(
        [sys.executable, "-m", "mlpjit", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def _age(path: Path, seconds: float) -> None:
    stamp = time.time() - seconds
    os.utime(path, (stamp, stamp), follow_symlinks=False)


@pytest.fixture
def tmpdir_(tmp_path: Path) -> Path:
    """A private temp dir for the processes of one test (TMPDIR)."""
    path = tmp_path / "tmpdir"
    path.mkdir()
    return path


def test_temp_files_of_dead_or_stale_publishes_go_live_ones_stay(cache_dir, tmpdir_):
    dead = _start(PUBLISHER, str(cache_dir), "1")
    live = _start(PUBLISHER, str(cache_dir), "2")
    dead_tmp = Path(dead.stdout.readline().strip())
    live_tmp, stale_tmp = (Path(live.stdout.readline().strip()) for _ in range(2))
    try:
        _kill(dead)
        _age(stale_tmp, 2 * HOUR)  # a live pid, but no publish takes that long: abandoned
        foreign_new = cache_dir / "v1" / "tmp" / "mystery.tmp"  # no pid in the name
        foreign_old = cache_dir / "v1" / "tmp" / "older.tmp"
        foreign_new.write_bytes(b"?")
        foreign_old.write_bytes(b"?")
        _age(foreign_old, 2 * HOUR)

        report = _cli(cache_dir, tmpdir_, "cache", "clear")
        assert report["leftovers"]["temp_files"] == {"removed": 3, "kept": 2}
        assert not dead_tmp.exists() and not stale_tmp.exists() and not foreign_old.exists()
        assert live_tmp.read_bytes() == b"half a publish" and foreign_new.exists()
    finally:
        _kill(live)
    # Its publisher is gone now: prune takes it (and still spares the young unknown one).
    report = _cli(cache_dir, tmpdir_, "cache", "prune", "--older-than", "1000d")
    assert report["leftovers"]["temp_files"] == {"removed": 1, "kept": 1}
    assert sorted(p.name for p in (cache_dir / "v1" / "tmp").iterdir()) == ["mystery.tmp"]


def _entry(root: Path, key: str, ext: str) -> Path:
    return root / "v1" / "entries" / key[:2] / f"{key}.{ext}"


def _alias(root: Path, entry) -> Path:
    return root / "v1" / "aliases" / entry.manifest["spec_key"]


def test_orphan_cubins_and_stale_aliases_go_unless_in_use(cache_dir, tmpdir_, smoke_request):
    manager = CompileManager()
    old, locked, young, quarantined, intact = (manager.get(smoke_request(i)) for i in range(5))
    for entry in (old, locked, young):  # killed between the cubin's rename and the manifest's
        _entry(cache_dir, entry.key, "json").unlink()
    for entry in (old, locked):
        _age(_entry(cache_dir, entry.key, "cubin"), HOUR)
    CacheStore(cache_dir, read_only=()).quarantine(quarantined.key, "test")  # keeps the alias
    garbage = cache_dir / "v1" / "aliases" / ("f" * 64)
    garbage.write_text("not a key\n")
    holder = _start(HOLD_KEY_LOCK, str(cache_dir), locked.key)
    try:
        assert holder.stdout.readline().strip() == "held"
        report = _cli(cache_dir, tmpdir_, "cache", "prune", "--older-than", "1000d")
    finally:
        _kill(holder)
    assert report["removed"] == [] and report["remaining_entries"] == 1
    # Old and unlocked goes; locked (being published) and young (maybe mid-publish) stay.
    assert report["leftovers"]["orphan_cubins"] == {"removed": 1, "kept": 2}
    assert not _entry(cache_dir, old.key, "cubin").exists()
    assert _entry(cache_dir, locked.key, "cubin").exists()
    assert _entry(cache_dir, young.key, "cubin").exists()
    # Aliases naming no entry go (old, young, quarantined, garbage); the locked key's stays.
    assert report["leftovers"]["stale_aliases"] == {"removed": 4, "kept": 1}
    aliases = {p.name for p in (cache_dir / "v1" / "aliases").iterdir()}
    assert aliases == {_alias(cache_dir, e).name for e in (locked, intact)}
    store = CacheStore(cache_dir, read_only=())
    assert store.lookup_alias(intact.manifest["spec_key"]).cubin == intact.cubin
    assert store.lookup(intact.key).cubin == intact.cubin

    # The lock is free now: clear takes that orphan and its alias too, never the young one.
    report = _cli(cache_dir, tmpdir_, "cache", "clear")
    assert report["removed"] == [intact.key] and report["quarantine_removed"] == 1
    assert report["leftovers"]["orphan_cubins"] == {"removed": 1, "kept": 1}
    assert report["leftovers"]["stale_aliases"] == {"removed": 1, "kept": 0}
    left = [p.name for p in (cache_dir / "v1" / "entries").rglob("*") if p.is_file()]
    assert left == [f"{young.key}.cubin"]
    assert list((cache_dir / "v1" / "aliases").iterdir()) == []


def _wait_for_dump_dir(proc: subprocess.Popen) -> Path:
    line = proc.stdout.readline().strip()
    assert line, "the compile never reached its CuTe DSL call"
    return Path(line)


def test_scratch_dirs_of_killed_compiles_go(cache_dir, tmpdir_, tmp_path):
    killed = _start(SLOW_COMPILE, "256", tmpdir=tmpdir_)
    running = _start(SLOW_COMPILE, "512", tmpdir=tmpdir_)
    try:
        killed_dir, running_dir = _wait_for_dump_dir(killed), _wait_for_dump_dir(running)
        assert killed_dir.parent == tmpdir_ == running_dir.parent
        assert killed_dir.name.startswith(f"mlpjit-cute-{killed.pid}-")
        _kill(killed)
        assert any(killed_dir.iterdir())  # the dump a kill -9 leaves behind
        legacy_old = tmpdir_ / "mlpjit-cute-abc12345"  # named before the pid was in it
        legacy_new = tmpdir_ / "mlpjit-cute-def67890"
        for path in (legacy_old, legacy_new):
            path.mkdir()
        _age(legacy_old, 2 * HOUR)
        others = tmpdir_ / f"mlpjit-cute-{killed.pid}-zzzz9999"
        others.mkdir()
        if os.geteuid() == 0:
            os.chown(others, 65534, 65534)  # another user's: never ours to remove
        else:
            others.rmdir()
            others.symlink_to(tmp_path)  # the owner check cannot be staged without root
        link = tmpdir_ / f"mlpjit-cubin-{killed.pid}-link0000"
        link.symlink_to(tmp_path, target_is_directory=True)

        report = _cli(cache_dir, tmpdir_, "cache", "clear")
        assert report["leftovers"]["scratch_dirs"] == {"removed": 2, "kept": 2}
        assert not killed_dir.exists() and not legacy_old.exists()
        assert any(running_dir.iterdir()) and legacy_new.is_dir()
        assert others.exists() and link.is_symlink() and tmp_path.is_dir()
    finally:
        _kill(running)
    report = _cli(cache_dir, tmpdir_, "cache", "prune", "--max-size", "1G")
    assert report["leftovers"]["scratch_dirs"] == {"removed": 1, "kept": 1}
    assert not running_dir.exists()


def test_clear_text_reports_leftovers(cache_dir, tmpdir_):
    dead = _start(PUBLISHER, str(cache_dir), "2")
    for _ in range(2):
        dead.stdout.readline()
    _kill(dead)
    (tmpdir_ / "mlpjit-cute-99999999-abcd1234").mkdir()  # a pid no process has
    env = _env(tmpdir_)
    env["MLPJIT_CACHE_DIR"] = str(cache_dir)
    run = subprocess.run(
        [sys.executable, "-m", "mlpjit", "cache", "clear"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert run.stdout.strip() == (
        "removed 0 entries and 0 quarantined; leftovers: 2 temp files, 1 compile scratch dirs "
        "removed"
    )


def test_compile_scratch_dirs_carry_the_pid(monkeypatch, tmp_path):
    """Both kernels compile in a scratch dir named by scratch_prefix (what cleanup parses)."""
    import cutlass.cute as cute

    from mlpjit.kernels.fp8_gemv import SPEC
    from mlpjit.kernels.fp8_gemv.kernel import compile_cubin as gemv_compile
    from mlpjit.kernels.fp8_gemv.plan import gemv_request
    from mlpjit.testing import smoke

    seen = []

    class Stop(Exception):
        pass

    def record(*args, options="", **kw):
        dump = Path(options.split("--dump-dir ")[1].split()[0])
        seen.append((dump.name, dump.is_dir()))
        raise Stop

    monkeypatch.setattr(cute, "compile", record)
    params = gemv_request(3072, 6144, 1, swiglu=True, limit=None, ue8m0=True, arch="sm_90a")
    for compile_cubin, args in (
        (gemv_compile, (SPEC.make_params(params.params), "sm_90a")),
        (smoke.compile_cubin, (smoke.SmokeParams(n=64, scale=1.0, block=64), "sm_90a")),
    ):
        with pytest.raises(Stop):
            compile_cubin(*args)
    (cute_name, cute_made), (cubin_name, cubin_made) = seen
    assert cute_made and cubin_made
    assert cute_name.startswith(scratch.scratch_prefix("cute"))
    assert cubin_name.startswith(scratch.scratch_prefix("cute"))
    (tmp_path / cute_name).mkdir()  # as a kill would leave it: kept while this pid lives
    assert scratch.remove_dead_scratch(tmp_path) == {"removed": 0, "kept": 1}


def test_pid_alive():
    assert scratch.pid_alive(os.getpid())
    assert not scratch.pid_alive(0) and not scratch.pid_alive(-1)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not scratch.pid_alive(proc.pid)
    with pytest.raises(ValueError, match="scratch kind"):
        scratch.scratch_prefix("nope")


# --------------------------------------------------------------------- hostile cache states


@pytest.mark.parametrize("area", ["quarantine", "aliases", "tmp", "locks", "entries", "shard"])
def test_clear_never_follows_a_symlinked_area_and_repairs_it(cache_dir, tmp_path, area):
    key, _, _ = publish(cache_dir)
    outside = sentinel(tmp_path)
    CacheStore().quarantine(key, "test")  # something in quarantine
    publish(cache_dir, 1)
    path = cache_dir / "v1" / area if area != "shard" else cache_dir / "v1" / "entries" / "ab"
    if path.exists():
        shutil.rmtree(path)
    path.symlink_to(outside)
    run = run_cli(cache_dir, "cache", "clear")
    assert run.returncode == 0, run.stderr
    assert sentinel_intact(outside) and not path.is_symlink()
    assert run_cli(cache_dir, "cache", "verify").returncode == 0


def test_prune_sizes_come_from_the_files(cache_dir):
    """A manifest's unchecked cubin_bytes never decides what prune deletes."""
    keys = [publish(cache_dir, i)[0] for i in range(4)]
    bad = publish(cache_dir, 9)[0]
    mpath = paths(cache_dir, bad)[0]
    manifest = json.loads(mpath.read_text())
    manifest["cubin_bytes"] = 10**400
    mpath.write_text(json.dumps(manifest))
    report = prune_cache(CacheStore(), max_bytes=1 << 40)
    assert report["removed"] == [] and report["remaining_entries"] == 5
    assert report["remaining_bytes"] == sum(
        paths(cache_dir, k)[1].stat().st_size for k in [*keys, bad]
    )
    assert all(CacheStore().lookup(k) is not None for k in keys)


@pytest.mark.parametrize("where", ["aliases", "quarantine", "tmp", "shard"])
@pytest.mark.parametrize("command", ["clear", "prune"])
def test_a_fifo_in_the_cache_hangs_nothing(cache_dir, where, command):
    key, components, _ = publish(cache_dir)
    if where == "aliases":
        fifo = cache_dir / "v1" / "aliases" / spec_key(components)
        fifo.unlink()
    elif where == "shard":
        fifo = paths(cache_dir, key)[1].with_name("f" * 64 + ".json")
    else:
        (cache_dir / "v1" / where).mkdir(exist_ok=True)
        fifo = cache_dir / "v1" / where / "fifo"
    os.mkfifo(fifo)
    args = ["cache", command] + (["--max-size", "1T"] if command == "prune" else [])
    run = run_cli(cache_dir, *args)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    if command == "clear" and where in ("aliases", "quarantine"):
        assert not os.path.lexists(fifo)


def test_huge_manifest_numbers_break_no_command(cache_dir):
    """created/last_used/cubin_bytes are outside the checksum: ls, stats, prune and info read
    them clamped (sizes from the files), whatever a manifest holds."""
    key = publish(cache_dir)[0]
    mpath = paths(cache_dir, key)[0]
    manifest = json.loads(mpath.read_text())
    manifest.update(created=1e300, last_used=1e300, cubin_bytes=10**400)
    mpath.write_text(json.dumps(manifest))
    for args in (
        ["ls"],
        ["ls", "--json"],
        ["stats"],
        ["info", key[:8]],
        ["prune", "--max-size", "1T"],
    ):
        run = run_cli(cache_dir, "cache", *args)
        assert run.returncode == 0 and "Traceback" not in run.stderr, (args, run.stderr)


def test_verify_sees_a_symlinked_shard_and_clear_repairs_it(cache_dir, tmp_path):
    key = publish(cache_dir)[0]
    shard = paths(cache_dir, key)[0].parent
    elsewhere = tmp_path / "elsewhere"
    shard.rename(elsewhere)
    shard.symlink_to(elsewhere)
    run = run_cli(cache_dir, "cache", "verify", "--json")
    assert run.returncode != 0, run.stdout
    assert str(shard) in run.stdout and "symlink" in run.stdout
    assert run_cli(cache_dir, "cache", "clear").returncode == 0
    assert not shard.is_symlink() and (elsewhere / f"{key}.json").exists()
    assert run_cli(cache_dir, "cache", "verify").returncode == 0
    publish(cache_dir)  # and the cache works again


# ---- last_used: only a load for a launch is a use ---------------------------------------------


def _set_used(root: Path, key: str, hours_ago: float) -> None:
    """Make ``key`` look last used ``hours_ago`` hours ago (manifest field and mtime)."""
    mpath = paths(root, key)[0]
    manifest = json.loads(mpath.read_text())
    stamp = time.time() - hours_ago * HOUR
    manifest["created"] = manifest["last_used"] = stamp
    mpath.write_text(json.dumps(manifest, sort_keys=True, separators=(",", ":")))
    os.utime(mpath, (stamp, stamp))


@pytest.mark.parametrize("command", [("cache", "verify"), ("cache", "export", "ARCHIVE")])
def test_verify_and_export_leave_last_used_alone(cache_dir, tmpdir_, tmp_path, command):
    """After verify or export, prune --max-size still removes the least recently used
    entries (verify and export read every entry; a read is not a use)."""
    keys = [publish(cache_dir, i)[0] for i in range(4)]
    for key, hours in zip(keys, (1, 4, 2, 3), strict=True):  # LRU order: 1, 3, 2, 0
        _set_used(cache_dir, key, hours)
    args = [str(tmp_path / "out.tar") if a == "ARCHIVE" else a for a in command]
    _cli(cache_dir, tmpdir_, *args)
    one = paths(cache_dir, keys[0])[1].stat().st_size
    report = _cli(cache_dir, tmpdir_, "cache", "prune", "--max-size", str(2 * one))
    assert report["removed"] == [keys[1], keys[3]]


def test_a_load_for_a_launch_is_a_use(cache_dir):
    """The compile manager's loads (prepare, warm) set last_used; a plain lookup does not."""
    key = publish(cache_dir, 0)[0]
    _set_used(cache_dir, key, 5)
    store = CacheStore()
    assert store.lookup(key) is not None
    assert time.time() - paths(cache_dir, key)[0].stat().st_mtime > 4 * HOUR
    assert CacheStore().lookup(key, use=True) is not None
    assert time.time() - paths(cache_dir, key)[0].stat().st_mtime < 60


# ---- lock files go with their entries ---------------------------------------------------------


def _locks(root: Path) -> set[str]:
    return {p.name for p in (root / "v1" / "locks").glob("*.lock")}


def test_prune_and_clear_remove_lock_files_but_never_a_held_one(cache_dir, tmpdir_):
    """Each removed entry's lock file goes, and so do lock files of keys without an entry
    (a failed compile's); a lock file another process holds stays, with its entry."""
    keys = [publish(cache_dir, i)[0] for i in range(4)]
    store = CacheStore()
    for key in keys:
        with store.try_lock(key) as held:  # what a compile leaves behind
            assert held
    stale = "ab" * 32  # a key with a lock file and no entry
    with store.try_lock(stale):
        pass
    assert _locks(cache_dir) == {f"{k}.lock" for k in [*keys, stale]}
    for key, hours in zip(keys, (1, 4, 2, 3), strict=True):
        _set_used(cache_dir, key, hours)
    report = _cli(cache_dir, tmpdir_, "cache", "prune", "--older-than", "150m")
    assert sorted(report["removed"]) == sorted([keys[1], keys[3]])
    assert report["leftovers"]["stale_locks"] == {"removed": 1, "kept": 0}
    assert _locks(cache_dir) == {f"{keys[0]}.lock", f"{keys[2]}.lock"}

    holder = _start(HOLD_KEY_LOCK, str(cache_dir), keys[0])
    try:
        assert holder.stdout.readline().strip() == "held"
        report = _cli(cache_dir, tmpdir_, "cache", "clear")
        assert report["removed"] == [keys[2]] and report["busy"] == [keys[0]]
        assert _locks(cache_dir) == {f"{keys[0]}.lock"}  # held: never removed
    finally:
        _kill(holder)
    report = _cli(cache_dir, tmpdir_, "cache", "clear")
    assert report["removed"] == [keys[0]] and _locks(cache_dir) == set()
