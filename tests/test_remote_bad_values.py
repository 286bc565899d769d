"""Hostile Redis contents against every entry point of the fleet cache (mlpjit.jit.remote).

Anyone who can write the Redis keys can plant anything under the prefix: locks nobody
holds, values of the wrong type, huge or binary values, counters that are no numbers. For
each such state, one child process (with a timeout and an address-space limit) runs every
remote entry point: the compile manager's lookup, push, pull, `cache stats` and doctor's
remote check. None may hang, print a traceback, load a planted byte, or make the server
send a big value; the run goes on with the local cache. A property test then throws
arbitrary bytes at the single-value readers (alias, counters, lock) in this process.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_server import RedisServer, start_redis

from mlpjit.jit.key import key_components, request_key, spec_key
from mlpjit.jit.remote import COUNTERS, RemoteCache
from mlpjit.jit.remote import tier as tiermod
from mlpjit.jit.spec import KernelRequest

REPO = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 120  # seconds for one child to run every entry point
ADDRESS_SPACE = 6 << 30  # bytes: CuTe DSL's import needs some, a 300 MiB value read whole
# several times over does not fit beside it
SENT_CAP = 1 << 20  # bytes the server may send while every entry point runs once
PLANTED = b"\x7fELF planted bytes"
REQUEST = KernelRequest("smoke", {"n": 1024, "scale": 2.0, "block": 128}, "sm_90a")
KEY = request_key(REQUEST)  # the kernel every child compiles
SPEC_KEY = spec_key(key_components(REQUEST.spec, REQUEST.params, REQUEST.arch))
BIG = 48 << 20  # over every cap of a single remote value


def _big(marker: bytes = PLANTED) -> bytes:
    return marker + b"\0" * (BIG - len(marker))


# state -> what it plants, as (Redis key under the prefix, how) pairs
STATES: dict[str, Callable[[redis.Redis], None]] = {
    "lock-without-expiry": lambda r: r.set(f"mlpjit:lock:{KEY}", "ab" * 16),
    "lock-of-another-format": lambda r: r.set(f"mlpjit:lock:{KEY}", PLANTED, px=600_000),
    "lock-that-is-a-hash": lambda r: r.hset(f"mlpjit:lock:{KEY}", "token", "ab" * 16),
    "huge-lock": lambda r: r.set(f"mlpjit:lock:{KEY}", _big()),
    "entry-that-is-a-string": lambda r: r.set(f"mlpjit:entry:{KEY}", PLANTED),
    "entry-of-binary-junk": lambda r: r.hset(
        f"mlpjit:entry:{KEY}", mapping={"manifest": b"\xff\x00{" * 99, "cubin": PLANTED}
    ),
    "huge-cubin": lambda r: r.hset(
        f"mlpjit:entry:{KEY}", mapping={"manifest": b"{}", "cubin": _big()}
    ),
    "huge-alias": lambda r: r.set(f"mlpjit:alias:{SPEC_KEY}", KEY.encode() + _big(b":")),
    "alias-that-is-a-hash": lambda r: r.hset(f"mlpjit:alias:{SPEC_KEY}", "key", KEY),
    "alias-of-binary-junk": lambda r: r.set(f"mlpjit:alias:{SPEC_KEY}", b"\xff\x00" + PLANTED),
    "huge-entry-name": lambda r: r.set(f"mlpjit:entry:{KEY}".encode() + _big(b"-"), PLANTED),
    "entry-names-no-entry-can-have": lambda r: r.mset(
        {f"mlpjit:entry:{'f' * n}": PLANTED for n in range(200) if n != 64}
        | {f"mlpjit:entry:{KEY.upper()}": PLANTED, f"mlpjit:entry:{KEY[:-1]}\n": PLANTED}
    ),
    "counter-of-5000-digits": lambda r: r.set("mlpjit:stats:hits", "9" * 5000),
    "huge-counter": lambda r: r.set("mlpjit:stats:rejected", _big()),
    "counter-that-is-a-hash": lambda r: r.hset("mlpjit:stats:uploads", "n", "1"),
}

# Runs every entry point against the planted state; prints one JSON line of what each did.
_CHILD = """
import contextlib, io, json, logging, sys, time
logging.disable(logging.CRITICAL)  # warnings are expected; tracebacks go to stderr
import mlpjit.testing.smoke
from mlpjit import cli, doctor
from mlpjit.jit.manager import CompileManager
from mlpjit.jit.remote import RemoteCache, RemoteTier, pull, push, remote_report
from mlpjit.jit.spec import KernelRequest
from mlpjit.jit.store import CacheStore
url, root, spec_key = sys.argv[1:4]
out = {}
remote = RemoteCache(url)
store = CacheStore(root=root, read_only=())
t0 = time.monotonic()
entry = CompileManager(store, remote=RemoteTier(store, remote), lock_timeout=30).get(
    KernelRequest("smoke", {"n": 1024, "scale": 2.0, "block": 128}, "sm_90a")
)
out["manager"] = [entry.key, time.monotonic() - t0]
other = CacheStore(root=root + "-other", read_only=())
out["alias"] = RemoteTier(other, remote).get_alias(spec_key).entry is not None
out["push"] = sorted(push(store, remote)["pushed"])
out["pull"] = sorted(pull(other, remote)["pulled"])
out["report"] = remote_report(remote)["fleet"]
stdout = io.StringIO()
with contextlib.redirect_stdout(stdout):
    out["stats_exit"] = cli.main(["cache", "stats", "--json"])
out["stats"] = json.loads(stdout.getvalue())["remote"]["fleet"]
out["doctor"] = [(c.status, c.summary) for c in doctor._check_remote()]
print(json.dumps(out))
"""


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = start_redis(tmp_path / "redis")
    yield server
    server.kill()


def _sent(server: RedisServer) -> int:
    return int(server.client().info("stats")["total_net_output_bytes"])


def _planted_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and PLANTED in p.read_bytes()]


@pytest.mark.parametrize("state", sorted(STATES))
def test_hostile_redis_contents_cost_every_entry_point_nothing(redis_server, tmp_path, state):
    raw = redis_server.client()
    STATES[state](raw)
    root = tmp_path / "node"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.update(
        MLPJIT_CACHE_DIR=str(root),
        MLPJIT_REMOTE_CACHE=redis_server.url(),
        MLPJIT_KERNEL_MODULES="mlpjit.testing.smoke",
        MLPJIT_LOCK_TIMEOUT="30",
    )
    for name in ("MLPJIT_CACHE_PATH", "MLPJIT_REMOTE_KEY_FILE", "MLPJIT_REMOTE_PREFIX"):
        env.pop(name, None)
    before = _sent(redis_server)
    t0 = time.monotonic()
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, redis_server.url(), str(root), SPEC_KEY],
        capture_output=True,
        text=True,
        env=env,
        timeout=CHILD_TIMEOUT,
        preexec_fn=_limit_address_space,
        check=False,
    )
    elapsed = time.monotonic() - t0
    assert child.returncode == 0, child.stderr[-3000:]
    assert "Traceback" not in child.stderr, child.stderr[-3000:]
    out = json.loads(child.stdout.splitlines()[-1])
    assert out["manager"][0] == KEY and out["manager"][1] < 20, out  # compiled, no long wait
    assert out["push"] in ([KEY], []) and out["stats_exit"] == 0, out
    assert all(isinstance(v, int) and v >= 0 for v in out["report"].values()), out
    assert out["stats"] == out["report"] or set(out["stats"]) == set(COUNTERS), out
    assert [status for status, _ in out["doctor"]] == ["warn"], out  # unsigned, no crash
    assert _sent(redis_server) - before < SENT_CAP  # no planted value crossed the network
    assert not _planted_files(tmp_path / "node") and not _planted_files(tmp_path / "node-other")
    assert elapsed < CHILD_TIMEOUT


# ------------------------------------------------------------------ any bytes, in process


@pytest.fixture(scope="module")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.kill()


values = st.one_of(
    st.binary(max_size=300),
    st.integers().map(lambda n: str(n).encode()),
    st.text(alphabet="0123456789abcdef:", max_size=200).map(str.encode),
    st.builds(lambda n: b"9" * n, st.integers(0, 6000)),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(alias=values, counter=values, lock=values, ttl=st.sampled_from([None, 5000, 10**9]))
def test_any_bytes_in_an_alias_counter_or_lock_is_read_safely(
    shared_redis, monkeypatch, alias, counter, lock, ttl
):
    """Whatever bytes sit under an alias, a counter or a lock: the alias names a key or
    nothing, the counters are counts, and the lock is taken at once or held by a live-looking
    holder, never an error that turns the remote off."""
    monkeypatch.setattr(tiermod, "_WAIT_BUDGET", tiermod.WaitBudget())
    raw = shared_redis.client()
    raw.flushdb()
    remote = RemoteCache(shared_redis.url())
    raw.set(remote.alias_name(SPEC_KEY), alias)
    raw.set(remote.counter_name("hits"), counter)
    raw.set(remote.lock_name(KEY), lock, px=ttl)
    target = remote.alias_target(SPEC_KEY)
    assert target is None or (len(target) == 64 and alias.startswith(target.encode()))
    counters = remote.fleet_counters()
    assert counters is not None and 0 <= counters["hits"] < 2**63
    if counter.isdigit() and len(counter) <= 18:
        assert counters["hits"] == int(counter)
    lock_ = remote.lock(KEY)
    t0 = time.monotonic()
    taken = lock_.try_acquire()
    assert time.monotonic() - t0 < 1.0
    live = len(lock) == 32 and all(c in b"0123456789abcdef" for c in lock) and ttl == 5000
    assert taken != live, (lock, ttl)
    lock_.release()
    assert remote.available and remote.stats.errors == 0


def test_entry_listing_sends_only_names_an_entry_can_have(shared_redis):
    """SCAN filters names on the server: entry_keys and report() see the one real name, and
    a planted 48 MiB name (and names of every other length) never cross the network."""
    raw = shared_redis.client()
    raw.flushdb()
    STATES["huge-entry-name"](raw)
    STATES["entry-names-no-entry-can-have"](raw)
    raw.hset(f"mlpjit:entry:{KEY}", "manifest", b"{}")
    remote = RemoteCache(shared_redis.url())
    before = _sent(shared_redis)
    assert remote.entry_keys() == [KEY]
    assert remote.report(10)["entries"] == 1
    assert _sent(shared_redis) - before < 64 << 10


def _documented_acl() -> list[str]:
    """The rules of the `ACL SETUSER mlpjit ...` line docs/SERVER.md gives, password left out."""
    text = " ".join((REPO / "docs" / "SERVER.md").read_text().split())
    start = text.index("`ACL SETUSER mlpjit ")
    rules = text[start + 1 : text.index("`", start + 1)].split()[3:]
    return [r for r in rules if not r.startswith(">")]


def test_the_documented_acl_allows_every_remote_operation(shared_redis, tmp_path):
    """A node whose Redis user has exactly the ACL docs/SERVER.md gives (for the prefix
    glm5-prod:) uploads, fetches, follows aliases, lists, counts, takes over a planted lock,
    renews and releases, and reports, without one permission error."""
    from entries import made

    from mlpjit.jit.archive import portable_manifest
    from mlpjit.jit.store import CacheStore

    rules = _documented_acl()
    assert "~glm5-prod:*" in rules and "+pttl" in rules and "+strlen" in rules, rules
    raw = shared_redis.client()
    raw.flushdb()
    raw.execute_command("ACL", "SETUSER", "mlpjit", "reset", ">acl-pass", *rules)
    store = CacheStore(root=tmp_path / "cache", read_only=())
    key, components, binary = made(0)
    entry = store.publish(key, components, binary, 0.1)
    url = f"redis://mlpjit:acl-pass@127.0.0.1:{shared_redis.port}/0"
    remote = RemoteCache(url, prefix="glm5-prod:", ttl=60, secret=b"k" * 32)
    try:
        raw.set(f"glm5-prod:lock:{key}", "ab" * 16)  # planted, no expiry: taken over
        assert remote.upload(key, portable_manifest(entry), entry.cubin)
        assert remote.exists(key) and remote.verified(key).found is not None
        assert remote.alias_target(entry.manifest["spec_key"]) == key
        assert remote.entry_keys() == [key]
        assert remote.fleet_counters() is not None
        lock = remote.lock(key)
        assert lock.try_acquire() and lock.shared
        assert remote.renew_lock(lock.name, lock.token) == (True, True)
        lock.release()
        report = remote.report(10)
        assert report["error"] is None and report["entries"] == 1, report
        assert remote.problem() is None and remote.stats.errors == 0, remote.stats
    finally:
        raw.execute_command("ACL", "DELUSER", "mlpjit")
