"""Fleets of real processes sharing one compile cache on a real redis-server.

A simulated node is one MLPJIT_CACHE_DIR; each worker (tests/remote_worker.py) is a process
that warms the same 16 smoke kernels (real CuTe DSL compiles for sm_90a) through mlpjit's
own default_manager(), configured by MLPJIT_REMOTE_CACHE and MLPJIT_REMOTE_KEY_FILE (one key
file the whole fleet shares, as docs/SERVER.md says to deploy it). A marker file per compile
counts the compiles of every process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_server import PASSWORD, RedisServer, free_port, start_redis, write_key_file

from mlpjit.jit.key import request_key
from mlpjit.jit.remote import FleetSigner
from mlpjit.jit.spec import KernelRequest
from mlpjit.jit.store import CacheStore

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
REMOTE_WORKER = REPO / "tests" / "remote_worker.py"
CHILD_TIMEOUT = 300
KERNELS = 16


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server without a password, killed at teardown."""
    server = start_redis(tmp_path / "redis")
    yield server
    server.kill()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    """The fleet's key file, shared by every node of a test (mode 0400)."""
    return write_key_file(tmp_path / "fleet.key")


def smoke_keys(count: int = KERNELS) -> dict[int, str]:
    """n -> cache key of the smoke kernels the workers warm (n = 1024 + 32 i)."""
    params = ({"n": 1024 + 32 * i, "scale": 2.0, "block": 128} for i in range(count))
    return {p["n"]: request_key(KernelRequest("smoke", p, "sm_90a")) for p in params}


def worker_env(cache_dir: Path, url: str | None, key_file: Path | None) -> dict[str, str]:
    """A worker's environment: its node's cache dir, the fleet cache and its key file, the
    repo on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLPJIT_")}
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["MLPJIT_CACHE_DIR"] = str(cache_dir)
    if url is not None:
        env["MLPJIT_REMOTE_CACHE"] = url
    if key_file is not None:
        env["MLPJIT_REMOTE_KEY_FILE"] = str(key_file)
    return env


def start_workers(
    tmp_path: Path,
    url: str | None,
    key_file: Path | None,
    nodes: range,
    procs: int,
    threads: int,
    pause: float = 0.0,
) -> tuple[list[tuple[int, subprocess.Popen]], Path]:
    """``procs`` worker processes on each node of ``nodes``; [(node, Popen)], marker dir."""
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    started = []
    for n in nodes:
        env = worker_env(tmp_path / f"node{n}", url, key_file)
        spec = {"node": n, "markers": str(markers), "count": KERNELS, "threads": threads}
        spec.update(arch="sm_90a", compile_pause=pause)
        for _ in range(procs):
            proc = subprocess.Popen(
                [sys.executable, str(REMOTE_WORKER), json.dumps(spec)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            started.append((n, proc))
    return started, markers


def finish(started: list[tuple[int, subprocess.Popen]]) -> list[tuple[int, dict, str]]:
    """[(node, result, stderr)] once every worker exited 0."""
    results = []
    for n, proc in started:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
        assert proc.returncode == 0, err[-3000:]
        results.append((n, json.loads(out.strip().splitlines()[-1]), err))
    return results


def compiles(markers: Path) -> Counter[tuple[int, int]]:
    """(node, n) -> how many processes compiled smoke kernel n on that node."""
    return Counter(
        (int(node), int(n)) for node, n, *_ in (p.name.split(".") for p in markers.iterdir())
    )


def verify_node(store: CacheStore, keys: set[str]) -> dict[str, bytes]:
    """Every key's entry from ``store`` (each verified by lookup); fails if one is missing."""
    found = {}
    for key in keys:
        entry = store.lookup(key)
        assert entry is not None, f"{key[:12]} missing or corrupt in {store.root}"
        found[key] = entry.cubin
    return found


def assert_signed(server: RedisServer, key_file: Path, keys: set[str]) -> None:
    """Every key's entry in Redis carries a signature that verifies with ``key_file``."""
    signer, raw = FleetSigner(key_file.read_bytes()), server.client()
    for key in keys:
        stored = raw.hgetall(f"mlpjit:entry:{key}")
        problem = signer.entry_problem(key, stored[b"manifest"], stored[b"cubin"], stored[b"sig"])
        assert problem is None, f"{key[:12]}: {problem}"


def test_two_nodes_of_four_processes_compile_each_kernel_once(redis_server, tmp_path, key_file):
    keys = smoke_keys()
    started, markers = start_workers(tmp_path, redis_server.url(), key_file, range(2), 4, 2)
    results = finish(started)
    per_kernel = Counter(n for _, n in compiles(markers).elements())
    assert per_kernel == Counter(dict.fromkeys(keys, 1))  # 16 compiles in all, one per kernel
    assert sum(r["stats"]["compiles"] for _, r, _ in results) == KERNELS
    assert sum(r["stats"]["uploads"] for _, r, _ in results) == KERNELS
    assert sum(r["stats"]["remote_rejects"] for _, r, _ in results) == 0
    # Every kernel a node did not compile itself came from Redis, once per node.
    node_compiles = Counter(node for node, _ in compiles(markers).elements())
    for node in (0, 1):
        fetched = sum(r["stats"]["remote_hits"] for m, r, _ in results if m == node)
        assert fetched == KERNELS - node_compiles[node]
    for _, result, err in results:
        assert set(result["sha"]) == set(keys.values())
        assert "WARNING" not in err, err[-3000:]
    for key in keys.values():  # every process got byte-identical cubins
        assert len({result["sha"][key] for _, result, _ in results}) == 1
    wanted = set(keys.values())
    nodes = [verify_node(CacheStore(tmp_path / f"node{n}", read_only=()), wanted) for n in (0, 1)]
    assert nodes[0] == nodes[1]
    assert_signed(redis_server, key_file, wanted)
    # A fresh node warms from Redis alone: no compile, CuTe DSL never imported.
    fresh_node = start_workers(tmp_path, redis_server.url(), key_file, range(2, 3), 1, 1)
    (fresh,) = finish(fresh_node[0])
    assert fresh[1]["stats"]["compiles"] == 0 and fresh[1]["stats"]["remote_hits"] == KERNELS
    assert fresh[1]["cutlass_loaded"] is False
    assert fresh[1]["sha"] == results[0][1]["sha"]


def test_redis_killed_in_the_middle_of_a_warm_every_process_finishes(
    redis_server, tmp_path, key_file
):
    """Killed once Redis holds half the kernels: the fleet has shared some, the rest each
    node compiles for itself."""
    keys = smoke_keys()
    url = redis_server.url()
    started, markers = start_workers(tmp_path, url, key_file, range(2), 4, 1, pause=0.3)
    raw, deadline = redis_server.client(), time.monotonic() + CHILD_TIMEOUT
    while len(raw.keys("mlpjit:entry:*")) < KERNELS // 2:
        assert time.monotonic() < deadline, "the workers never uploaded"
        time.sleep(0.01)
    redis_server.kill()
    results = finish(started)
    for n in (0, 1):
        verify_node(CacheStore(tmp_path / f"node{n}", read_only=()), set(keys.values()))
    # The local file lock still gave each node at most one compile per kernel.
    assert max(compiles(markers).values()) == 1, compiles(markers)
    assert sum(r["stats"]["uploads"] for _, r, _ in results) >= KERNELS // 2
    warned = [err.count("remote compile cache") for _, _, err in results]
    assert max(warned) <= 1 and sum(warned) >= 1, warned  # at most one warning a process


@pytest.mark.parametrize("case", ["auth-not-given", "wrong-password", "unreachable"])
def test_a_process_with_an_unusable_remote_warns_once_and_compiles_locally(
    tmp_path, key_file, case
):
    server = None
    if case == "unreachable":
        url = f"redis://127.0.0.1:{free_port()}/0"
    else:
        server = start_redis(tmp_path / "redis", password=PASSWORD)
        url = server.url(password="" if case == "auth-not-given" else "wrong-pass")
    try:
        (result,) = finish(start_workers(tmp_path, url, key_file, range(1), 1, 1)[0])
    finally:
        if server is not None:
            server.kill()
    _, out, err = result
    assert out["stats"]["compiles"] == KERNELS and out["remote"]["errors"] == 1
    lines = [line for line in err.splitlines() if "WARNING" in line]
    assert len(lines) == 1 and "continuing with the local cache only" in lines[0], err
    assert PASSWORD not in err and "wrong-pass" not in err
    verify_node(CacheStore(tmp_path / "node0", read_only=()), set(smoke_keys().values()))


def test_push_uploads_nothing_from_an_untrusted_read_only_dir(redis_server, tmp_path):
    """A read-only layer another user owns is not trusted, so push never spreads its
    entries to the fleet; our own entries still go."""
    from entries import OTHER_UID, publish

    from mlpjit.jit.remote import RemoteCache, push

    layer = tmp_path / "layer"
    planted = publish(layer, 1)[0]
    for path in [layer, *layer.rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID)
    ours = publish(tmp_path / "root", 2)[0]
    store = CacheStore(root=tmp_path / "root", read_only=[layer])
    report = push(store, RemoteCache(redis_server.url()))
    assert report["pushed"] == [ours] and planted not in report["missing"]
