"""The remote compile cache (mlpjit.jit.remote) against a real redis-server.

Every test starts Debian's redis-server on 127.0.0.1 with a random free port and a temp dir
(no persistence) and kills it at teardown; nothing is mocked and nothing on the wire is
hand-made. Fleet tests run real processes (tests/remote_worker.py); two simulated nodes are
two cache dirs. TLS uses the test-only certificate in tests/data/redis-tls. Without
redis-server on PATH the tests fail with the command that installs it (.ci/run runs it):
they never skip.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from remote_worker import components, fake_binary

from mlpjit.jit.archive import _portable_manifest
from mlpjit.jit.binary import KernelBinary, launch_sha256
from mlpjit.jit.key import cache_key, canonical_json
from mlpjit.jit.remote import (
    DEFAULT_PREFIX,
    Flight,
    RemoteCache,
    RemoteLayer,
    get_with_remote,
    pull,
    push,
    redact_url,
    remote_from_env,
    remote_report,
)
from mlpjit.jit.store import MAX_MANIFEST_BYTES, CacheStore, Entry

try:
    import redis
except ImportError:  # a collection error that says what to install, not a skip
    pytest.fail("redis-py is not installed: pip install -e '.[test]'", pytrace=False)

REPO = Path(__file__).resolve().parent.parent
REMOTE_WORKER = REPO / "tests" / "remote_worker.py"
TLS_DIR = REPO / "tests" / "data" / "redis-tls"
PASSWORD = "s3cret-test-pass"
START_TIMEOUT = 10.0
CHILD_TIMEOUT = 120
# Generous bound on everything an unusable remote may cost one test (2 s socket timeout).
FAIL_OPEN_BOUND = 10.0


# ------------------------------------------------------------------ a real redis-server


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RedisServer:
    """One redis-server process started by a test."""

    port: int
    proc: subprocess.Popen
    password: str | None = None
    tls: bool = False
    paused: bool = False

    def url(self, db: int = 0, password: str | None = None, trust: bool = True) -> str:
        """A URL for this server; ``password`` defaults to the server's own."""
        password = self.password if password is None else password
        auth = f":{password}@" if password else ""
        scheme = "rediss" if self.tls else "redis"
        query = f"?ssl_ca_certs={TLS_DIR / 'cert.pem'}" if self.tls and trust else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/{db}{query}"

    def client(self) -> redis.Redis:
        """A plain redis-py client, to set up and inspect what the tests expect."""
        return redis.Redis.from_url(self.url(), socket_timeout=5)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): it accepts connections and never answers."""
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL the server (a crash) and reap it."""
        if self.paused:
            self.resume()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def _server_args(workdir: Path, port: int, password: str | None, tls: bool) -> list[str]:
    args = ["--bind", "127.0.0.1", "--dir", str(workdir), "--save", "", "--appendonly", "no"]
    args += ["--logfile", str(workdir / "redis.log")]
    if tls:
        cert, key = TLS_DIR / "cert.pem", TLS_DIR / "key.pem"
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert)]
        args += ["--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)]
        args += ["--tls-auth-clients", "no"]
    else:
        args += ["--port", str(port)]
    if password:
        args += ["--requirepass", password]
    return args


def _ready(server: RedisServer) -> bool:
    """Wait until the server answers PING (False if it exited, e.g. its port was taken)."""
    deadline = time.monotonic() + START_TIMEOUT
    client = server.client()
    try:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                return False
            try:
                return bool(client.ping())
            except redis.RedisError:
                time.sleep(0.05)
        return False
    finally:
        client.close()


def start_redis(workdir: Path, password: str | None = None, tls: bool = False) -> RedisServer:
    """Start redis-server on a random free port of 127.0.0.1, data in ``workdir``."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not on PATH; the remote cache tests need a real one. Install it: "
            "apt-get update && apt-get install -y redis-server (.ci/run does)",
            pytrace=False,
        )
    workdir.mkdir(parents=True, exist_ok=True)
    for _ in range(5):  # another process may take the free port before redis binds it
        port = _free_port()
        proc = subprocess.Popen(
            [binary, *_server_args(workdir, port, password, tls)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        server = RedisServer(port, proc, password, tls)
        if _ready(server):
            return server
        server.kill()
    pytest.fail(f"redis-server did not start; see {workdir / 'redis.log'}", pytrace=False)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server without a password, killed at teardown."""
    server = start_redis(tmp_path / "redis")
    yield server
    server.kill()


@pytest.fixture
def redis_auth_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server started with --requirepass PASSWORD."""
    server = start_redis(tmp_path / "redis-auth", password=PASSWORD)
    yield server
    server.kill()


@pytest.fixture
def redis_tls_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server speaking TLS only (test certificate, no client certificates)."""
    server = start_redis(tmp_path / "redis-tls", tls=True)
    yield server
    server.kill()


# ------------------------------------------------------------------ entries and nodes


def child_env() -> dict[str, str]:
    """The environment of a child process: this one's, with the repo first on PYTHONPATH."""
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def node(tmp_path: Path, name: str) -> CacheStore:
    """The local cache of one simulated node."""
    return CacheStore(root=tmp_path / name, layers=())


def publish(store: CacheStore, i: int, arch: str = "sm_90a") -> Entry:
    """Publish hand-made kernel ``i`` (no compile) and return its entry."""
    comps = components(i, arch)
    entry = store.publish(cache_key(comps), comps, fake_binary(i), 0.25)
    assert entry.persisted
    return entry


def counting_compile(i: int, calls: list[int]):
    """A fake compile of kernel ``i`` that records itself in ``calls``."""

    def run() -> tuple[KernelBinary, float]:
        calls.append(i)
        return fake_binary(i), 0.01

    return run


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def local_files(store: CacheStore) -> list[Path]:
    entries = store.root / "v1" / "entries"
    return sorted(p for p in entries.rglob("*") if p.is_file()) if entries.exists() else []


# ------------------------------------------------------------------ entries: round trip


def test_upload_then_fetch_publishes_a_verified_entry(redis_server, tmp_path):
    a, b = node(tmp_path, "a"), node(tmp_path, "b")
    remote = RemoteCache(redis_server.url())
    entry = publish(a, 0)
    assert RemoteLayer(a, remote).after_compile(entry)
    got = RemoteLayer(b, RemoteCache(redis_server.url())).lookup(entry.key)
    assert got is not None and got.persisted and got.origin == b.root
    assert got.binary() == entry.binary()
    local = b.lookup(entry.key)  # now a local hit on node b, verified from disk
    assert local is not None and local.cubin == entry.cubin
    raw = redis_server.client()
    assert raw.type(remote.entry_name(entry.key)) == b"hash"
    assert raw.pttl(remote.entry_name(entry.key)) == -1  # no TTL asked for
    assert remote.stats.uploads == 1


def test_fetch_of_an_absent_key_is_a_miss(redis_server, tmp_path):
    remote = RemoteCache(redis_server.url())
    key = cache_key(components(0))
    assert remote.fetch(key) is None and remote.fetch_verified(key) is None
    assert RemoteLayer(node(tmp_path, "b"), remote).lookup(key) is None
    stats = remote.stats
    assert (stats.misses, stats.hits, stats.rejected, stats.errors) == (3, 0, 0, 0)


def test_upload_sets_the_ttl_and_the_prefix(redis_server, tmp_path):
    remote = RemoteCache(redis_server.url(), prefix="fleet-a:", ttl=60)
    entry = publish(node(tmp_path, "a"), 0)
    assert remote.upload(entry.key, _portable_manifest(entry), entry.cubin)
    raw = redis_server.client()
    assert raw.keys("*") == [f"fleet-a:entry:{entry.key}".encode()]
    assert 0 < raw.pttl(f"fleet-a:entry:{entry.key}") <= 60_000
    assert RemoteCache(redis_server.url()).fetch(entry.key) is None  # another prefix
    assert remote.fetch_verified(entry.key) is not None


def test_upload_refuses_an_entry_that_does_not_verify(redis_server, tmp_path, caplog):
    remote = RemoteCache(redis_server.url())
    entry = publish(node(tmp_path, "a"), 0)
    assert not remote.upload(entry.key, _portable_manifest(entry), entry.cubin + b"x")
    assert redis_server.client().dbsize() == 0
    assert remote.stats.uploads == 0
    assert any("not uploading" in w for w in warnings_of(caplog))


# ------------------------------------------------------------------ poisoned entries


def _poison(how: str, entry: Entry, other: Entry) -> dict[str, bytes] | bytes:
    """The bad value to store under ``entry``'s remote key (a hash's fields, or a string)."""
    manifest = json.loads(_portable_manifest(entry))
    cubin = entry.cubin
    if how == "flipped-cubin-byte":
        cubin = cubin[:10] + bytes([cubin[10] ^ 0x01]) + cubin[11:]
    elif how == "altered-grid":
        manifest["grid"] = [16, 2, 1]  # launch_sha256 left as it is
    elif how == "other-arch":
        # A self-consistent entry of another arch, relabelled with this key.
        manifest = json.loads(_portable_manifest(other))
        manifest["key"] = entry.key
        manifest["launch_sha256"] = launch_sha256(entry.key, other.binary())
        cubin = other.cubin
    elif how == "oversized-manifest":
        return {"manifest": b" " * (MAX_MANIFEST_BYTES + 1), "cubin": cubin}
    elif how == "missing-cubin":
        return {"manifest": canonical_json(manifest).encode()}
    elif how == "not-a-hash":
        return b"just a string"
    return {"manifest": canonical_json(manifest).encode(), "cubin": cubin}


POISONS = {  # how -> (a word of the reason, whether the bytes are read and so discarded)
    "flipped-cubin-byte": ("sha256", True),
    "altered-grid": ("launch_sha256", True),
    "other-arch": ("sm_100a", True),
    "oversized-manifest": ("size cap", False),
    "missing-cubin": ("missing", False),
    "not-a-hash": ("not a hash", False),
}


@pytest.mark.parametrize("how", sorted(POISONS))
def test_poisoned_remote_entry_is_rejected_then_recompiled_and_replaced(
    redis_server, tmp_path, caplog, how
):
    a, b = node(tmp_path, "a"), node(tmp_path, "b")
    good, other = publish(a, 0), publish(a, 0, arch="sm_100a")
    raw = redis_server.client()
    remote_b = RemoteCache(redis_server.url())
    name = remote_b.entry_name(good.key)
    bad = _poison(how, good, other)
    if isinstance(bad, bytes):
        raw.set(name, bad)
    else:
        raw.hset(name, mapping=bad)
    layer_b = RemoteLayer(b, remote_b)
    with caplog.at_level(logging.WARNING):
        assert layer_b.lookup(good.key) is None
    word, discarded = POISONS[how]
    assert remote_b.stats.rejected == 1 and remote_b.stats.hits == 0
    rejections = [w for w in warnings_of(caplog) if "rejected remote cache entry" in w]
    assert len(rejections) == 1 and word in rejections[0], warnings_of(caplog)
    assert b.lookup(good.key) is None and local_files(b) == []  # never published
    assert bool(raw.exists(name)) is not discarded  # deleted only if its bytes were read
    # Node b recompiles (the fleet's single flight) and its upload replaces the bad entry.
    calls: list[int] = []
    entry = get_with_remote(b, layer_b, good.key, components(0), counting_compile(0, calls))
    assert calls == [0] and entry is not None and entry.persisted
    fresh = RemoteCache(redis_server.url()).fetch_verified(good.key)
    assert fresh is not None and fresh[1] == entry.cubin


@pytest.mark.parametrize("seconds", ["1e999", "9" * 400, "-1", "null"])
def test_unchecked_manifest_fields_cannot_crash_a_pull_or_lookup(redis_server, tmp_path, seconds):
    """compile_seconds is outside every checksum: hostile values must not reach publish."""
    entry = publish(node(tmp_path, "a"), 0)
    text = canonical_json(json.loads(_portable_manifest(entry)))
    hostile = text.replace('"compile_seconds":0.25', f'"compile_seconds":{seconds}')
    assert hostile != text
    remote = RemoteCache(redis_server.url())
    redis_server.client().hset(
        remote.entry_name(entry.key), mapping={"manifest": hostile, "cubin": entry.cubin}
    )
    got = RemoteLayer(node(tmp_path, "b"), remote).lookup(entry.key)
    assert got is not None and got.manifest["compile_seconds"] == 0.0
    assert pull(node(tmp_path, "c"), remote)["pulled"] == [entry.key]
    assert remote.stats.rejected == 0


def test_discard_keeps_an_entry_replaced_since_it_was_read(redis_server, tmp_path):
    remote = RemoteCache(redis_server.url())
    entry = publish(node(tmp_path, "a"), 0)
    manifest = _portable_manifest(entry)
    assert remote.upload(entry.key, manifest, entry.cubin)
    assert not remote.discard(entry.key, manifest, entry.cubin + b"stale")  # other bytes
    assert remote.fetch_verified(entry.key) is not None
    assert remote.discard(entry.key, manifest, entry.cubin)  # the very bytes: deleted
    assert remote.fetch(entry.key) is None


# ------------------------------------------------------------------ locks

_LOCK_CHILD = """
import json, os, sys, time
from mlpjit.jit.remote import RemoteCache
url, key, ttl, hold, go = sys.argv[1:6]
lock = RemoteCache(url, lock_ttl=float(ttl)).lock(key)
print(json.dumps({"ready": True}), flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
got = lock.try_acquire()
print(json.dumps({"got": got, "t": time.time()}), flush=True)
if got:
    time.sleep(float(hold))
    lock.release()
print(json.dumps({"released": time.time()}), flush=True)
"""


def _lock_child(url: str, key: str, ttl: float, hold: float, go: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _LOCK_CHILD, url, key, str(ttl), str(hold), str(go)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def _line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()[-3000:]
    return json.loads(line)


def test_two_processes_contend_and_exactly_one_holds_the_lock(redis_server, tmp_path):
    key, go = cache_key(components(0)), tmp_path / "go"
    procs = [_lock_child(redis_server.url(), key, 30, 1.0, go) for _ in range(2)]
    for proc in procs:
        assert _line(proc) == {"ready": True}
    go.touch()
    results = [_line(proc) for proc in procs]
    assert sorted(r["got"] for r in results) == [False, True]
    for proc in procs:
        _line(proc)
        assert proc.wait(timeout=CHILD_TIMEOUT) == 0
    assert redis_server.client().dbsize() == 0  # released by its owner


def test_renewal_keeps_the_lock_past_its_ttl_while_held(redis_server, tmp_path):
    key, go = cache_key(components(0)), tmp_path / "go"
    go.touch()
    holder = _lock_child(redis_server.url(), key, 1.0, 4.0, go)
    _line(holder)
    assert _line(holder)["got"]
    remote = RemoteCache(redis_server.url(), lock_ttl=1.0)
    raw, contender = redis_server.client(), remote.lock(key)
    deadline = time.monotonic() + 3.0  # three lock TTLs
    while time.monotonic() < deadline:
        assert not contender.try_acquire()
        assert raw.pttl(remote.lock_name(key)) > 0
        time.sleep(0.1)
    assert contender.acquire(timeout=10)  # once the holder releases it
    _line(holder)
    assert holder.wait(timeout=CHILD_TIMEOUT) == 0
    contender.release()


def test_a_killed_holders_lock_expires(redis_server, tmp_path):
    key, go = cache_key(components(0)), tmp_path / "go"
    go.touch()
    holder = _lock_child(redis_server.url(), key, 1.0, 600, go)
    _line(holder)
    assert _line(holder)["got"]
    contender = RemoteCache(redis_server.url()).lock(key)
    assert not contender.try_acquire()
    holder.kill()
    holder.wait(timeout=CHILD_TIMEOUT)
    t0 = time.monotonic()
    assert contender.acquire(timeout=10)
    assert time.monotonic() - t0 < 5  # within about one lock TTL
    contender.release()


def test_only_the_owner_releases_and_a_lost_lock_is_noticed(redis_server, caplog):
    key = cache_key(components(0))
    remote = RemoteCache(redis_server.url(), lock_ttl=1.5)
    raw, name = redis_server.client(), remote.lock_name(key)
    first = remote.lock(key)
    assert first.try_acquire() and raw.get(name) == first.token.encode()
    raw.delete(name)  # as if it expired while its holder was cut off from Redis
    second = remote.lock(key)
    assert second.try_acquire()
    with caplog.at_level(logging.WARNING):
        time.sleep(0.8)  # past a renewal of the first lock: it finds another's token
    assert first.lost and not second.lost
    assert any("lost the remote compile lock" in w for w in warnings_of(caplog))
    first.release()  # believes it holds the lock: must not delete second's
    assert raw.get(name) == second.token.encode()
    assert raw.pttl(name) > 0  # still renewed by its owner
    second.release()
    assert raw.get(name) is None


def test_single_flight_waits_for_another_nodes_upload(redis_server, tmp_path):
    a, b = node(tmp_path, "a"), node(tmp_path, "b")
    entry = publish(a, 0)
    remote_a, remote_b = RemoteCache(redis_server.url()), RemoteCache(redis_server.url())
    holder = remote_a.lock(entry.key)
    assert holder.try_acquire()
    layer_b = RemoteLayer(b, remote_b)
    with layer_b.single_flight(entry.key, wait=0) as flight:
        assert flight == Flight(busy=True)

    def finish() -> None:
        time.sleep(0.5)
        RemoteLayer(a, remote_a).after_compile(entry)
        holder.release()

    thread = threading.Thread(target=finish)
    thread.start()
    t0 = time.monotonic()
    with layer_b.single_flight(entry.key, wait=30) as flight:
        assert flight.entry is not None and flight.entry.cubin == entry.cubin
    thread.join()
    assert time.monotonic() - t0 < 10
    assert remote_b.stats.lock_waits == 1 and remote_b.stats.hits == 1


def test_single_flight_waiter_compiles_after_its_timeout(redis_server, tmp_path, caplog):
    key = cache_key(components(0))
    holder = RemoteCache(redis_server.url()).lock(key)
    assert holder.try_acquire()  # a holder that never uploads
    layer = RemoteLayer(node(tmp_path, "b"), RemoteCache(redis_server.url()))
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING), layer.single_flight(key, wait=0.5) as flight:
        assert flight == Flight()  # neither an entry nor busy: compile here
    assert 0.5 <= time.monotonic() - t0 < 5
    assert any("compiling it here" in w for w in warnings_of(caplog))
    holder.release()


# ------------------------------------------------------------------ fleets of processes


def _start_workers(
    server: RedisServer, tmp_path: Path, nodes: int, procs: int, threads: int, seconds: float
) -> tuple[list[tuple[int, subprocess.Popen]], Path]:
    """``nodes`` x ``procs`` worker processes; returns [(node, Popen)] and the marker dir."""
    markers = tmp_path / "markers"
    markers.mkdir()
    env = child_env()
    started = []
    for n in range(nodes):
        for p in range(procs):
            spec = {
                "url": server.url(),
                "prefix": DEFAULT_PREFIX,
                "cache_dir": str(tmp_path / f"node{n}"),
                "markers": str(markers),
                "count": 16,
                "threads": threads,
                "offset": 2 * (n * procs + p),
                "compile_seconds": seconds,
            }
            proc = subprocess.Popen(
                [sys.executable, str(REMOTE_WORKER), json.dumps(spec)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            started.append((n, proc))
    return started, markers


def _finish(started: list[tuple[int, subprocess.Popen]]) -> list[tuple[int, dict, str]]:
    """[(node, result, stderr)] once every worker exited 0."""
    results = []
    for n, proc in started:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
        assert proc.returncode == 0, err[-3000:]
        results.append((n, json.loads(out.strip().splitlines()[-1]), err))
    return results


def _verify_node(store: CacheStore, keys: set[str]) -> dict[str, bytes]:
    """Every key's entry from ``store`` (each verified by lookup); fails if one is missing."""
    found = {}
    for key in keys:
        entry = store.lookup(key)
        assert entry is not None, f"{key[:12]} missing or corrupt in {store.root}"
        found[key] = entry.cubin
    return found


def test_two_nodes_of_four_processes_compile_each_key_once(redis_server, tmp_path):
    started, markers = _start_workers(redis_server, tmp_path, 2, 4, 2, 0.05)
    results = _finish(started)
    compiled = [p.name.split(".")[0] for p in markers.iterdir()]
    keys = {cache_key(components(i)) for i in range(16)}
    assert sorted(compiled) == sorted(keys)  # 16 compiles in all, one per key
    for _, result, err in results:
        assert set(result["sha"]) == keys
        assert "WARNING" not in err, err[-3000:]
    for key in keys:  # every process got byte-identical cubins
        assert len({result["sha"][key] for _, result, _ in results}) == 1
    cubins = [_verify_node(CacheStore(root=tmp_path / f"node{n}", layers=()), keys) for n in (0, 1)]
    assert cubins[0] == cubins[1]
    assert sum(result["stats"]["uploads"] for _, result, _ in results) == 16
    assert sum(result["stats"]["rejected"] for _, result, _ in results) == 0


def test_redis_killed_in_the_middle_every_process_finishes(redis_server, tmp_path):
    started, markers = _start_workers(redis_server, tmp_path, 2, 4, 1, 0.2)
    deadline = time.monotonic() + CHILD_TIMEOUT
    while len(list(markers.iterdir())) < 3:
        assert time.monotonic() < deadline, "the workers never started compiling"
        time.sleep(0.01)
    redis_server.kill()
    results = _finish(started)
    keys = {cache_key(components(i)) for i in range(16)}
    for n in (0, 1):
        _verify_node(CacheStore(root=tmp_path / f"node{n}", layers=()), keys)
        shas = [result["sha"] for m, result, _ in results if m == n]
        for key in keys:  # the local file lock still gave each node one compile per key
            assert len({sha[key] for sha in shas}) == 1
    warned = [err.count("remote compile cache") for _, _, err in results]
    assert max(warned) <= 1 and sum(warned) >= 1, warned  # at most one warning a process


# ------------------------------------------------------------------ an unusable remote

UNUSABLE = {  # case -> a word its one warning must hold
    "auth-not-given": "check the user and password",
    "wrong-password": "check the user and password",
    "unreachable": "refused",
    "wrong-db": "DB index is out of range",
    "tls-to-a-plain-server": "Timeout",
    "untrusted-certificate": "ssl_ca_certs",
    "hung-server": "Timeout",
}


def _unusable_url(case: str, tmp_path: Path) -> tuple[str, RedisServer | None]:
    """A URL that cannot be used, and the server behind it (killed by the caller)."""
    if case == "unreachable":
        return f"redis://127.0.0.1:{_free_port()}/0", None
    if case in ("auth-not-given", "wrong-password"):
        server = start_redis(tmp_path / "redis", password=PASSWORD)
        return server.url(password="" if case == "auth-not-given" else "wrong-pass"), server
    if case == "untrusted-certificate":
        server = start_redis(tmp_path / "redis", tls=True)
        return server.url(trust=False), server
    server = start_redis(tmp_path / "redis")
    if case == "wrong-db":
        return server.url(db=99), server
    if case == "tls-to-a-plain-server":
        return server.url().replace("redis://", "rediss://"), server
    server.pause()
    return server.url(), server


def _everything(store: CacheStore, remote: RemoteCache, calls: list[int]) -> None:
    """Every public call of the remote layer; each must degrade to local behaviour."""
    comps = components(0)
    key = cache_key(comps)
    layer = RemoteLayer(store, remote)
    entry = get_with_remote(store, layer, key, comps, counting_compile(0, calls))
    assert entry is not None and entry.persisted  # compiled and published locally
    assert remote.fetch(key) is None and remote.fetch_verified(key) is None
    assert not remote.exists(key)
    assert not remote.upload(key, _portable_manifest(entry), entry.cubin)
    assert not layer.after_compile(entry)
    lock = remote.lock(key)
    assert lock.acquire(timeout=5) and not lock.shared  # excludes nobody
    lock.release()
    with layer.single_flight(key, wait=5) as flight:
        assert flight == Flight()
    assert remote.entry_keys() is None
    assert push(store, remote)["failed"] == [key]
    assert pull(store, remote)["error"]


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_unusable_remote_warns_once_and_the_local_cache_carries_on(case, tmp_path, caplog):
    url, server = _unusable_url(case, tmp_path)
    try:
        store = node(tmp_path, "a")
        remote = RemoteCache(url)  # the default 2 s timeout
        calls: list[int] = []
        t0 = time.monotonic()
        with caplog.at_level(logging.DEBUG, logger="mlpjit"):
            _everything(store, remote, calls)
            first = time.monotonic() - t0
            _everything(store, remote, calls)  # the remote is skipped now: no waiting at all
            second = time.monotonic() - t0 - first
        assert first < FAIL_OPEN_BOUND and second < 1.0, (first, second)
        assert calls == [0]  # then a local hit
        warned = warnings_of(caplog)
        assert len(warned) == 1, warned
        assert redact_url(url) in warned[0] and "continuing with the local cache" in warned[0]
        assert UNUSABLE[case] in warned[0], warned[0]
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert PASSWORD not in messages and "wrong-pass" not in messages
        assert remote.stats.errors == 1
        assert store.lookup(cache_key(components(0))) is not None  # nothing local was lost
    finally:
        if server is not None:
            server.kill()


def test_the_remote_is_retried_after_its_backoff(redis_server, tmp_path, caplog):
    remote = RemoteCache(redis_server.url(), timeout=0.3, retry_after=2.0)
    entry = publish(node(tmp_path, "a"), 0)
    redis_server.pause()
    with caplog.at_level(logging.INFO, logger="mlpjit"):
        assert remote.fetch(entry.key) is None  # times out
        redis_server.resume()
        assert not remote.available and remote.fetch(entry.key) is None  # skipped
        time.sleep(2.1)
        assert remote.available
        assert remote.upload(entry.key, _portable_manifest(entry), entry.cubin)
        assert remote.fetch_verified(entry.key) is not None
    assert len(warnings_of(caplog)) == 1
    assert sum("reachable again" in r.getMessage() for r in caplog.records) == 1
    assert remote.stats.errors == 1


# ------------------------------------------------------------------ TLS


def test_tls_round_trip(redis_tls_server, tmp_path):
    a, b = node(tmp_path, "a"), node(tmp_path, "b")
    url = redis_tls_server.url()
    assert url.startswith("rediss://")
    entry = publish(a, 0)
    assert RemoteLayer(a, RemoteCache(url)).after_compile(entry)
    got = RemoteLayer(b, RemoteCache(url)).lookup(entry.key)
    assert got is not None and got.cubin == entry.cubin
    assert remote_report(RemoteCache(url))["entries"] == 1


# ------------------------------------------------------------------ push, pull, doctor


def test_push_then_pull_moves_verified_entries(redis_server, tmp_path):
    a, b = node(tmp_path, "a"), node(tmp_path, "b")
    entries = [publish(a, i) for i in range(3)]
    keys = sorted(e.key for e in entries)
    remote = RemoteCache(redis_server.url())
    assert push(a, remote)["pushed"] == keys
    again = push(a, remote)
    assert again["present"] == keys and again["pushed"] == []
    absent = cache_key(components(9))
    assert push(a, remote, keys=[absent])["missing"] == [absent]
    # Poison one remote entry: pull rejects it and publishes the others.
    raw = redis_server.client()
    raw.hset(remote.entry_name(keys[0]), "cubin", b"\x7fELF poisoned")
    report = pull(b, remote)
    assert report["pulled"] == keys[1:]
    assert [r["key"] for r in report["rejected"]] == [keys[0]]
    assert "sha256" in report["rejected"][0]["reason"] or "bytes" in report["rejected"][0]["reason"]
    assert b.lookup(keys[0]) is None
    for key in keys[1:]:
        assert b.lookup(key) is not None
    assert pull(b, remote, keys=keys[1:])["skipped"] == [
        {"key": k, "reason": "already in the cache"} for k in keys[1:]
    ]
    assert pull(b, remote, keys=[absent])["missing"] == [absent]
    json.dumps(report)  # plain data for the CLI


def test_remote_report_for_doctor(redis_server, redis_auth_server, tmp_path):
    remote = RemoteCache(redis_server.url())
    for i in range(2):
        entry = publish(node(tmp_path, "a"), i)
        remote.upload(entry.key, _portable_manifest(entry), entry.cubin)
    report = remote_report(remote)
    assert report["reachable"] and report["auth_ok"] and report["entries"] == 2
    assert report["server_version"][0].isdigit() and report["error"] is None
    authed = remote_report(RemoteCache(redis_auth_server.url()))
    assert authed["reachable"] and authed["auth_ok"] and authed["entries"] == 0
    refused = remote_report(RemoteCache(redis_auth_server.url(password="wrong-pass")))
    assert refused["reachable"] and refused["auth_ok"] is False and refused["error"]
    assert "wrong-pass" not in json.dumps(refused)
    down = remote_report(RemoteCache(f"redis://127.0.0.1:{_free_port()}/0"))
    assert not down["reachable"] and down["auth_ok"] is None and down["error"]
    json.dumps(report)


# ------------------------------------------------------------------ settings


def test_remote_from_env_reads_the_four_variables():
    assert remote_from_env({}) is None
    assert remote_from_env({"MLPJIT_REMOTE_CACHE": "  "}) is None
    remote = remote_from_env(
        {
            "MLPJIT_REMOTE_CACHE": "rediss://user:pw@cache.internal:6380/2",
            "MLPJIT_REMOTE_PREFIX": "fleet:",
            "MLPJIT_REMOTE_TTL": "86400",
            "MLPJIT_REMOTE_TIMEOUT": "0.5",
        }
    )
    assert remote is not None
    assert (remote.prefix, remote.ttl_ms, remote.timeout) == ("fleet:", 86_400_000, 0.5)
    assert remote.url == "rediss://user:***@cache.internal:6380/2"
    default = remote_from_env({"MLPJIT_REMOTE_CACHE": "redis://127.0.0.1:1/0"})
    assert (default.prefix, default.ttl_ms, default.timeout) == (DEFAULT_PREFIX, None, 2.0)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MLPJIT_REMOTE_CACHE", "http://cache:6379/0"),
        ("MLPJIT_REMOTE_CACHE", "redis://cache:6379/notadb"),
        ("MLPJIT_REMOTE_CACHE", "redis://cache:port/0"),
        ("MLPJIT_REMOTE_CACHE", "redis:///0"),
        ("MLPJIT_REMOTE_CACHE", "redis://cache:6379/0?db=x"),
        ("MLPJIT_REMOTE_TTL", "0"),
        ("MLPJIT_REMOTE_TTL", "a day"),
        ("MLPJIT_REMOTE_TIMEOUT", "-1"),
        ("MLPJIT_REMOTE_TIMEOUT", "inf"),
    ],
)
def test_remote_from_env_names_a_bad_variable(name, value):
    env = {"MLPJIT_REMOTE_CACHE": "redis://127.0.0.1:6379/0", name: value}
    with pytest.raises(ValueError, match=name):
        remote_from_env(env)


def test_redact_url_hides_passwords():
    assert redact_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact_url("rediss://u:pw@h:1/0") == "rediss://u:***@h:1/0"
    assert redact_url("redis://u@h:1/0") == "redis://u@h:1/0"
    assert "pw" not in redact_url("redis://h:1/0?password=pw&db=1")
