"""The remote compile cache (mlpjit.jit.remote) against a real redis-server, in process.

Every test starts Debian's redis-server (tests/redis_server.py: 127.0.0.1, a random free
port, a temp dir) and kills it at teardown; nothing is mocked and nothing on the wire is
hand-made. Entries are hand-made (no compile) where only the tier is under test; where the
compile manager recompiles, the kernels are real smoke kernels (mlpjit.testing.smoke). Fleets
of processes are in test_remote_fleet.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_server import PASSWORD, RedisServer, free_port, start_redis, write_key_file
from remote_worker import components, fake_binary

from mlpjit.jit import key as keymod
from mlpjit.jit import manager as managermod
from mlpjit.jit.archive import portable_manifest
from mlpjit.jit.binary import binary_from_fields, launch_sha256
from mlpjit.jit.cache_layout import MAX_MANIFEST_BYTES
from mlpjit.jit.entry import Entry
from mlpjit.jit.key import cache_key, canonical_json, request_key
from mlpjit.jit.manager import CacheStats, CompileManager
from mlpjit.jit.remote import (
    DEFAULT_PREFIX,
    FleetSigner,
    Flight,
    RemoteCache,
    RemoteTier,
    check_prefixes,
    pull,
    push,
    redact_url,
    remote_from_env,
    remote_report,
)
from mlpjit.jit.remote import client as clientmod
from mlpjit.jit.remote import tier as tiermod
from mlpjit.jit.spec import KernelRequest
from mlpjit.jit.store import CacheStore

REPO = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 120
# Generous bound on everything an unusable remote may cost one test (2 s socket timeout).
FAIL_OPEN_BOUND = 10.0
REMOTE_VARS = ("MLPJIT_REMOTE_CACHE", "MLPJIT_REMOTE_PREFIX", "MLPJIT_REMOTE_TTL")
REMOTE_VARS += ("MLPJIT_REMOTE_KEY_FILE",)
FORGED = b"\x7fELF any code at all"


@pytest.fixture(autouse=True)
def no_remote_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The remote is what each test builds, never one the caller's shell configured. The
    once-per-process "not authenticated" warning counts as given (most tiers here are
    unsigned): the tests that count warnings see only their own."""
    for name in (*REMOTE_VARS, "MLPJIT_REMOTE_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tiermod, "_UNSIGNED_WARNED", True)
    monkeypatch.setattr(tiermod, "_WAIT_BUDGET", tiermod.WaitBudget())
    monkeypatch.setattr(clientmod, "_TAKEOVER_WARNED", False)


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


def smoke(i: int = 0, arch: str = "sm_90a") -> KernelRequest:
    """Smoke kernel number ``i`` (the parameters of conftest's smoke_request)."""
    return KernelRequest("smoke", {"n": 1024 + 32 * i, "scale": 2.0, "block": 128}, arch)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Entry]:
    """Smoke kernel 0 compiled once per module for sm_90a and for sm_100a (real compiles)."""
    store = CacheStore(root=tmp_path_factory.mktemp("compiled") / "cache", read_only=())
    manager = CompileManager(store)
    return {arch: manager.get(smoke(0, arch)) for arch in ("sm_90a", "sm_100a")}


# ------------------------------------------------------------------ entries and nodes


def child_env() -> dict[str, str]:
    """The environment of a child process: this one's, with the repo first on PYTHONPATH."""
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def node(tmp_path: Path, name: str) -> CacheStore:
    """The local cache of one simulated node."""
    return CacheStore(root=tmp_path / name, read_only=())


def publish(store: CacheStore, i: int, arch: str = "sm_90a") -> Entry:
    """Publish hand-made kernel ``i`` (no compile) and return its entry."""
    comps = components(i, arch)
    entry = store.publish(cache_key(comps), comps, fake_binary(i), 0.25)
    assert entry.persisted
    return entry


def fleet_manager(store: CacheStore, url: str, **remote_args: object) -> CompileManager:
    """The compile manager of one node with the fleet cache at ``url``."""
    return CompileManager(store, remote=RemoteTier(store, RemoteCache(url, **remote_args)))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def secret() -> bytes:
    """A fresh fleet secret (what `head -c 32 /dev/urandom` makes)."""
    return os.urandom(32)


def forge(entry: Entry, cubin: bytes) -> bytes:
    """A self-consistent manifest for ``entry``'s key holding ``cubin`` (size, sha256 and
    launch_sha256 recomputed): what anyone can make from the public inputs, no secret."""
    manifest = json.loads(portable_manifest(entry))
    manifest["cubin_sha256"] = hashlib.sha256(cubin).hexdigest()
    manifest["cubin_bytes"] = len(cubin)
    manifest["launch_sha256"] = launch_sha256(entry.key, binary_from_fields(manifest, cubin))
    return canonical_json(manifest).encode()


def rejections(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [w for w in warnings_of(caplog) if "rejected remote cache" in w]


def local_files(store: CacheStore) -> list[Path]:
    entries = store.root / "v1" / "entries"
    return sorted(p for p in entries.rglob("*") if p.is_file()) if entries.exists() else []


# ------------------------------------------------------------------ entries: round trip


def test_upload_then_fetch_publishes_a_verified_entry(redis_server, tmp_path):
    a, b = node(tmp_path, "a"), node(tmp_path, "b")
    remote = RemoteCache(redis_server.url())
    entry = publish(a, 0)
    assert RemoteTier(a, remote).put(entry)
    got = RemoteTier(b, RemoteCache(redis_server.url())).get(entry.key).entry
    assert got is not None and got.persisted and got.origin == b.root
    assert got.binary() == entry.binary()
    local = b.lookup(entry.key)  # now a local hit on node b, verified from disk
    assert local is not None and local.cubin == entry.cubin
    raw = redis_server.client()
    assert raw.type(remote.entry_name(entry.key)) == b"hash"
    assert raw.pttl(remote.entry_name(entry.key)) == -1  # no TTL asked for
    assert remote.stats.uploads == 1
    spec = entry.manifest["spec_key"]
    assert raw.get(remote.alias_name(spec)) == entry.key.encode()  # for compiler-less nodes
    assert remote.alias_target(spec) == entry.key


def test_fetch_of_an_absent_key_is_a_miss(redis_server, tmp_path):
    remote = RemoteCache(redis_server.url())
    key = cache_key(components(0))
    assert remote.fetch(key) is None and remote.fetch_verified(key) is None
    assert RemoteTier(node(tmp_path, "b"), remote).get(key).entry is None
    stats = remote.stats
    assert (stats.misses, stats.hits, stats.rejected, stats.errors) == (3, 0, 0, 0)


def test_upload_sets_the_ttl_and_the_prefix(redis_server, tmp_path):
    remote = RemoteCache(redis_server.url(), prefix="fleet-a:", ttl=60)
    entry = publish(node(tmp_path, "a"), 0)
    assert remote.upload(entry.key, portable_manifest(entry), entry.cubin)
    raw = redis_server.client()
    alias = f"fleet-a:alias:{entry.manifest['spec_key']}"
    assert set(raw.keys("*")) == {
        f"fleet-a:entry:{entry.key}".encode(),
        alias.encode(),
        b"fleet-a:stats:uploads",
    }
    assert 0 < raw.pttl(f"fleet-a:entry:{entry.key}") <= 60_000
    assert 0 < raw.pttl(alias) <= 60_000  # an alias never outlives its entry by much
    assert raw.pttl("fleet-a:stats:uploads") == -1  # counters do not expire
    assert RemoteCache(redis_server.url()).fetch(entry.key) is None  # another prefix
    assert remote.fetch_verified(entry.key) is not None


def test_upload_refuses_an_entry_that_does_not_verify(redis_server, tmp_path, caplog):
    remote = RemoteCache(redis_server.url())
    entry = publish(node(tmp_path, "a"), 0)
    assert not remote.upload(entry.key, portable_manifest(entry), entry.cubin + b"x")
    assert redis_server.client().dbsize() == 0
    assert remote.stats.uploads == 0
    assert any("not uploading" in w for w in warnings_of(caplog))


# ------------------------------------------------------------------ poisoned entries


def _poison(how: str, entry: Entry, other: Entry) -> dict[str, bytes] | bytes:
    """The bad value to store under ``entry``'s remote key (a hash's fields, or a string)."""
    manifest = json.loads(portable_manifest(entry))
    cubin = entry.cubin
    if how == "flipped-cubin-byte":
        cubin = cubin[:10] + bytes([cubin[10] ^ 0x01]) + cubin[11:]
    elif how == "altered-grid":
        manifest["grid"] = [16, 2, 1]  # launch_sha256 left as it is
    elif how == "other-arch":
        # A self-consistent entry of another arch, relabelled with this key.
        manifest = json.loads(portable_manifest(other))
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
    redis_server, tmp_path, caplog, compiled, how
):
    """Through the compile manager: the bad entry is refused, the kernel is compiled here
    (a real smoke compile) and its upload replaces what was in Redis."""
    b = node(tmp_path, "b")
    good, other = compiled["sm_90a"], compiled["sm_100a"]
    raw = redis_server.client()
    remote_b = RemoteCache(redis_server.url())
    name = remote_b.entry_name(good.key)
    bad = _poison(how, good, other)
    if isinstance(bad, bytes):
        raw.set(name, bad)
    else:
        raw.hset(name, mapping=bad)
    tier_b = RemoteTier(b, remote_b)
    with caplog.at_level(logging.WARNING):
        assert tier_b.get(good.key).entry is None
    word, discarded = POISONS[how]
    assert remote_b.stats.rejected == 1 and remote_b.stats.hits == 0
    rejections = [w for w in warnings_of(caplog) if "rejected remote cache entry" in w]
    assert len(rejections) == 1 and word in rejections[0], warnings_of(caplog)
    assert b.lookup(good.key) is None and local_files(b) == []  # never published
    assert bool(raw.exists(name)) is not discarded  # deleted only if its bytes were read
    # Node b's manager recompiles (the fleet's single flight); its upload replaces the entry.
    manager = fleet_manager(b, redis_server.url())
    entry = manager.get(smoke(0))
    assert entry.key == good.key and entry.persisted and entry.cubin == good.cubin
    stats = manager.stats
    assert (stats.compiles, stats.remote_hits, stats.uploads) == (1, 0, 1)
    assert stats.remote_rejects == (0 if discarded else 1)  # what was left is refused again
    fresh = RemoteCache(redis_server.url()).fetch_verified(good.key)
    assert fresh is not None and fresh.cubin == entry.cubin
    assert int(raw.get(f"{DEFAULT_PREFIX}stats:rejected")) == (1 if discarded else 2)
    # The next node gets the replacement: a remote hit, no compile.
    other_node = fleet_manager(node(tmp_path, "c"), redis_server.url())
    assert other_node.get(smoke(0)).cubin == entry.cubin
    assert other_node.stats == CacheStats(misses=1, remote_hits=1)


def test_an_unsigned_fleet_accepts_a_forgery(redis_server, tmp_path):
    """The limit docs/SERVER.md states for a fleet without MLPJIT_REMOTE_KEY_FILE: keys hash
    public inputs, so whoever can write the Redis keys can store a self-consistent entry with
    any cubin, and nodes accept it. Integrity, not authenticity."""
    entry = publish(node(tmp_path, "a"), 0)
    remote = RemoteCache(redis_server.url())
    assert not remote.signed
    redis_server.client().hset(
        remote.entry_name(entry.key), mapping={"manifest": forge(entry, FORGED), "cubin": FORGED}
    )
    got = RemoteTier(node(tmp_path, "b"), remote).get(entry.key).entry
    assert got is not None and got.cubin == FORGED and remote.stats.rejected == 0


FORGERIES = {  # how the forged entry is signed -> a word of its rejection
    "unsigned": "not signed",
    "random-signature": "does not verify",
    "replayed-signature": "does not verify",  # another entry's valid signature
    "other-fleet-key": "does not verify",
}


@pytest.mark.parametrize("how", sorted(FORGERIES))
def test_a_signed_fleet_rejects_a_forgery_then_recompiles_and_replaces_it(
    redis_server, tmp_path, caplog, compiled, how
):
    """With a fleet secret the same forgery is rejected like a corrupt entry: counted,
    discarded, never published; the kernel is compiled here and the signed upload replaces
    it, which the next node takes."""
    key, good, other = secret(), compiled["sm_90a"], compiled["sm_100a"]
    url, raw = redis_server.url(), redis_server.client()
    signed = RemoteCache(url, secret=key)
    name, manifest = signed.entry_name(good.key), forge(good, FORGED)
    fields = {"manifest": manifest, "cubin": FORGED}
    if how == "random-signature":
        fields["sig"] = os.urandom(32).hex().encode()
    elif how == "replayed-signature":
        assert signed.upload(other.key, portable_manifest(other), other.cubin)
        fields["sig"] = raw.hget(signed.entry_name(other.key), "sig")
    elif how == "other-fleet-key":
        fields["sig"] = FleetSigner(secret()).sign_entry(good.key, manifest, FORGED)
    raw.hset(name, mapping=fields)
    b = node(tmp_path, "b")
    manager = fleet_manager(b, url, secret=key)
    with caplog.at_level(logging.WARNING):
        entry = manager.get(smoke(0))
    assert entry.key == good.key and entry.cubin == good.cubin and entry.persisted
    stats = manager.stats
    assert (stats.compiles, stats.remote_hits, stats.remote_rejects, stats.uploads) == (1, 0, 1, 1)
    (rejected,) = rejections(caplog)
    assert FORGERIES[how] in rejected and "MLPJIT_REMOTE_KEY_FILE" in rejected, rejected
    assert b.lookup(good.key).cubin == good.cubin  # the forgery was never published
    assert int(raw.get(f"{DEFAULT_PREFIX}stats:rejected")) == 1
    stored = raw.hgetall(name)  # the forgery was discarded; the signed upload is there
    assert stored[b"cubin"] == good.cubin
    assert stored[b"sig"] == FleetSigner(key).sign_entry(good.key, stored[b"manifest"], good.cubin)
    other_node = fleet_manager(node(tmp_path, "c"), url, secret=key)
    assert other_node.get(smoke(0)).cubin == good.cubin
    assert other_node.stats == CacheStats(misses=1, remote_hits=1)


def test_a_node_with_another_key_rejects_the_other_fleets_entries(redis_server, tmp_path, caplog):
    url = redis_server.url()
    fleet_a, fleet_b = RemoteCache(url, secret=secret()), RemoteCache(url, secret=secret())
    entry = publish(node(tmp_path, "a"), 0)
    assert fleet_a.upload(entry.key, portable_manifest(entry), entry.cubin)
    # A node without a key file (one not given it yet, in a roll-out) still takes it.
    assert RemoteTier(node(tmp_path, "u"), RemoteCache(url)).get(entry.key).entry is not None
    b = node(tmp_path, "b")
    with caplog.at_level(logging.WARNING):
        assert RemoteTier(b, fleet_b).get(entry.key).entry is None
    assert fleet_b.stats.rejected == 1 and fleet_b.stats.hits == 0 and local_files(b) == []
    (rejected,) = rejections(caplog)
    assert "does not verify" in rejected
    # Its bytes were read: discarded, so fleet A's next miss compiles and uploads it again.
    assert fleet_a.fetch(entry.key) is None


def test_a_signature_covers_the_key_manifest_and_cubin(redis_server, tmp_path):
    """Each of the three inputs changes the signature; a valid signature moved to another
    key, or kept over an edited manifest, does not verify."""
    signer, entry = FleetSigner(secret()), publish(node(tmp_path, "a"), 0)
    manifest, other = portable_manifest(entry), publish(node(tmp_path, "a"), 1)
    sig = signer.sign_entry(entry.key, manifest, entry.cubin)
    assert len(sig) == 64 and signer.entry_problem(entry.key, manifest, entry.cubin, sig) is None
    assert signer.entry_problem(other.key, manifest, entry.cubin, sig) is not None
    assert signer.entry_problem(entry.key, manifest + b" ", entry.cubin, sig) is not None
    assert signer.entry_problem(entry.key, manifest, entry.cubin + b"x", sig) is not None
    # Length prefixes: moving bytes from the manifest to the cubin is another message.
    assert signer.sign_entry(entry.key, b"ab", b"c") != signer.sign_entry(entry.key, b"a", b"bc")
    assert signer.sign_alias(entry.key, other.key) != signer.sign_entry(entry.key, b"", b"")
    assert repr(signer) == "FleetSigner(<secret>)"
    with pytest.raises(ValueError, match="at least 32 bytes"):
        FleetSigner(b"short")
    with pytest.raises(ValueError, match="at least 32 bytes"):
        RemoteCache(redis_server.url(), secret=b"short")


@pytest.mark.parametrize("seconds", ["1e999", "9" * 400, "-1", "null"])
def test_unchecked_manifest_fields_cannot_crash_a_pull_or_lookup(redis_server, tmp_path, seconds):
    """compile_seconds is outside every checksum: hostile values must not reach publish."""
    entry = publish(node(tmp_path, "a"), 0)
    text = canonical_json(json.loads(portable_manifest(entry)))
    hostile = text.replace('"compile_seconds":0.25', f'"compile_seconds":{seconds}')
    assert hostile != text
    remote = RemoteCache(redis_server.url())
    redis_server.client().hset(
        remote.entry_name(entry.key), mapping={"manifest": hostile, "cubin": entry.cubin}
    )
    got = RemoteTier(node(tmp_path, "b"), remote).get(entry.key).entry
    assert got is not None and got.manifest["compile_seconds"] == 0.0
    assert pull(node(tmp_path, "c"), remote)["pulled"] == [entry.key]
    assert remote.stats.rejected == 0


def test_discard_keeps_an_entry_replaced_since_it_was_read(redis_server, tmp_path):
    remote = RemoteCache(redis_server.url())
    entry = publish(node(tmp_path, "a"), 0)
    manifest = portable_manifest(entry)
    assert remote.upload(entry.key, manifest, entry.cubin)
    assert not remote.discard(entry.key, manifest, entry.cubin + b"stale")  # other bytes
    assert remote.fetch_verified(entry.key) is not None
    assert remote.discard(entry.key, manifest, entry.cubin)  # the very bytes: deleted
    assert remote.fetch(entry.key) is None
    # The signature is one of those bytes: the same manifest and cubin, signed since the
    # unsigned copy was read (or signed otherwise), are not the bytes that were rejected.
    signed = RemoteCache(redis_server.url(), secret=secret())
    assert signed.upload(entry.key, manifest, entry.cubin)
    sig = redis_server.client().hget(signed.entry_name(entry.key), "sig")
    assert not signed.discard(entry.key, manifest, entry.cubin)
    assert not signed.discard(entry.key, manifest, entry.cubin, b"0" * 64)
    assert signed.fetch_verified(entry.key) is not None
    assert signed.discard(entry.key, manifest, entry.cubin, sig)
    assert signed.fetch(entry.key) is None


# ------------------------------------------------------------------ aliases: no compiler


def _no_toolchain(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a serving node without nvidia-cutlass-dsl (test_manager.py does the same)."""
    monkeypatch.setattr(keymod, "toolchain", lambda: {})
    monkeypatch.setattr(managermod, "toolchain", lambda: {})


@pytest.mark.parametrize("signed", [False, True])
def test_a_node_without_the_compiler_gets_remote_hits_through_the_alias(
    redis_server, tmp_path, monkeypatch, compiled, signed
):
    built, key = compiled["sm_90a"], secret() if signed else None
    uploader = RemoteCache(redis_server.url(), secret=key)
    assert RemoteTier(node(tmp_path, "a"), uploader).put(built)
    _no_toolchain(monkeypatch)
    b = node(tmp_path, "b")
    manager = fleet_manager(b, redis_server.url(), secret=key)
    entry = manager.get(smoke(0))  # its own key has no toolchain: only the alias finds it
    assert entry.key == built.key and entry.cubin == built.cubin and entry.persisted
    assert manager.stats == CacheStats(misses=1, remote_hits=1)
    again = fleet_manager(b, redis_server.url())  # now a local hit, through the local alias
    assert again.get(smoke(0)).cubin == built.cubin
    assert again.stats == CacheStats(hits=1)


def test_an_alias_naming_another_kernels_entry_is_rejected(redis_server, tmp_path, caplog):
    a = node(tmp_path, "a")
    remote = RemoteCache(redis_server.url())
    wanted, other = publish(a, 0), publish(a, 1)
    for entry in (wanted, other):
        assert remote.upload(entry.key, portable_manifest(entry), entry.cubin)
    raw, spec = redis_server.client(), wanted.manifest["spec_key"]
    raw.set(remote.alias_name(spec), other.key)  # a valid entry, of another kernel
    tier = RemoteTier(node(tmp_path, "b"), RemoteCache(redis_server.url()))
    with caplog.at_level(logging.WARNING):
        assert tier.get_alias(spec).entry is None
    assert tier.remote.stats.rejected == 1 and tier.remote.stats.hits == 0
    assert any("not a build of spec" in w for w in warnings_of(caplog))
    assert tier.store.lookup(other.key) is None  # nothing published
    assert remote.fetch_verified(other.key) is not None  # the entry itself is fine: kept
    for junk in (b"not a key", b"", None):
        raw.delete(remote.alias_name(spec))
        if junk is not None:
            raw.set(remote.alias_name(spec), junk)
        assert tier.get_alias(spec).entry is None
    raw.delete(remote.alias_name(spec))
    raw.hset(remote.alias_name(spec), "k", "v")  # another type: a miss, not a failure
    assert tier.get_alias(spec).entry is None and tier.remote.available
    assert tier.remote.stats.errors == 0


def _rebuild(store: CacheStore, i: int, toolchain: str) -> Entry:
    """Hand-made kernel ``i`` built by another toolchain: another key, the same spec key."""
    comps = {**components(i), "toolchain": {"nvidia-cutlass-dsl": toolchain}}
    return store.publish(cache_key(comps), comps, fake_binary(i), 0.25)


def test_aliases_are_signed_and_a_forged_alias_is_rejected(redis_server, tmp_path, caplog):
    """A signed alias names its key and carries the signature of (spec_key, key). Pointing
    it elsewhere (here: at an older build of the same spec, itself a validly signed entry)
    without the secret gets it rejected; a node without a key file follows it."""
    key, url, raw = secret(), redis_server.url(), redis_server.client()
    a, signed = node(tmp_path, "a"), RemoteCache(url, secret=key)
    old = publish(a, 0)
    assert signed.upload(old.key, portable_manifest(old), old.cubin)
    alias = signed.alias_name(old.manifest["spec_key"])
    old_alias = raw.get(alias)
    new = _rebuild(a, 0, "4.9.0")
    spec = new.manifest["spec_key"]
    assert spec == old.manifest["spec_key"] and new.key != old.key
    assert signed.upload(new.key, portable_manifest(new), new.cubin)
    assert raw.get(alias) == new.key.encode() + b":" + FleetSigner(key).sign_alias(spec, new.key)
    follow = RemoteTier(node(tmp_path, "b"), RemoteCache(url, secret=key))
    assert follow.get_alias(spec).entry.key == new.key
    new_sig = raw.get(alias).split(b":")[1]
    forged = {  # alias value -> a word of its rejection
        old.key.encode(): "not signed",
        old.key.encode() + b":" + os.urandom(32).hex().encode(): "does not verify",
        old.key.encode() + b":" + new_sig: "does not verify",  # the signature of another key
        old.key.encode() + b":" + FleetSigner(secret()).sign_alias(spec, old.key): "does not",
    }
    for i, (value, word) in enumerate(forged.items()):
        raw.set(alias, value)
        tier = RemoteTier(node(tmp_path, f"c{i}"), RemoteCache(url, secret=key))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert tier.get_alias(spec).entry is None
        (rejected,) = rejections(caplog)
        assert "remote cache alias" in rejected and word in rejected, rejected
        assert tier.remote.stats.rejected == 1 and local_files(tier.store) == []
    assert int(raw.get(f"{DEFAULT_PREFIX}stats:rejected")) == len(forged)
    unsigned = RemoteTier(node(tmp_path, "u"), RemoteCache(url))
    raw.set(alias, old.key)
    assert unsigned.get_alias(spec).entry.key == old.key  # integrity only: it is a build of spec
    # Documented limit: a signed alias of the past can be put back. It names an older build
    # of the same spec that the fleet itself signed (no foreign code), e.g. an older toolchain.
    raw.set(alias, old_alias)
    replayed = RemoteTier(node(tmp_path, "r"), RemoteCache(url, secret=key))
    assert replayed.get_alias(spec).entry.key == old.key


# ------------------------------------------------------------------ fleet-wide counters


def test_fleet_counters_add_up_over_every_process(redis_server, tmp_path):
    a, b, c = node(tmp_path, "a"), node(tmp_path, "b"), node(tmp_path, "c")
    remote_a = RemoteCache(redis_server.url())
    entries = [publish(a, i) for i in range(2)]
    for entry in entries:
        assert RemoteTier(a, remote_a).put(entry)
    for store in (b, c):
        tier = RemoteTier(store, RemoteCache(redis_server.url()))
        assert all(tier.get(e.key).entry is not None for e in entries)
    raw = redis_server.client()
    raw.hset(remote_a.entry_name(entries[0].key), "cubin", b"\x7fELF poisoned")
    assert RemoteCache(redis_server.url()).fetch_verified(entries[0].key) is None
    counters = {"hits": 4, "rejected": 1, "uploads": 2}
    assert remote_a.fleet_counters() == counters
    assert remote_report(RemoteCache(redis_server.url()))["fleet"] == counters
    assert remote_a.stats.hits == 0  # this process's own counters stay its own
    raw.set(remote_a.counter_name("hits"), "not a number")  # best effort: no failure
    assert RemoteTier(node(tmp_path, "d"), remote_a).get(entries[1].key).entry is not None
    assert remote_a.available and remote_a.stats.errors == 0
    assert remote_a.fleet_counters()["hits"] == 0


def _sent_bytes(server: RedisServer) -> int:
    """Bytes the server has sent to all its clients so far."""
    return int(server.client().info("stats")["total_net_output_bytes"])


@pytest.mark.parametrize(
    "value",
    ["9" * 5000, "-" + "9" * 30, "1e3", "12abc", "x" * 4_000_000],
    ids=["5000-digits", "negative", "float", "junk", "4-MB"],
)
def test_counters_that_are_not_counts_read_as_0_without_crossing_the_network(redis_server, value):
    """A counter anyone can write must not break `cache stats` or doctor: a 5000-digit
    number (int() refuses it), junk or a 4 MB string is read as 0, and what is not a count
    never leaves the server."""
    remote = RemoteCache(redis_server.url())
    raw = redis_server.client()
    raw.set(remote.counter_name("hits"), value)
    raw.hset(remote.counter_name("rejected"), "a", "1")  # another type
    raw.set(remote.counter_name("uploads"), "7")
    before = _sent_bytes(redis_server)
    assert remote.fleet_counters() == {"hits": 0, "rejected": 0, "uploads": 7}
    assert remote_report(remote)["fleet"] == {"hits": 0, "rejected": 0, "uploads": 7}
    assert _sent_bytes(redis_server) - before < 64_000
    assert remote.available and remote.stats.errors == 0


def test_a_huge_alias_is_refused_on_the_server(redis_server, tmp_path):
    """An alias is a key and a signature: a bigger value is refused before it is read, so a
    planted 4 MB (or 300 MB) alias costs this process nothing."""
    entry = publish(node(tmp_path, "a"), 0)
    remote = RemoteCache(redis_server.url())
    spec_key = entry.manifest["spec_key"]
    redis_server.client().set(remote.alias_name(spec_key), entry.key.encode() + b"0" * 4_000_000)
    before = _sent_bytes(redis_server)
    assert remote.alias_target(spec_key) is None
    assert _sent_bytes(redis_server) - before < 64_000
    assert remote.available and remote.stats.errors == 0


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
    tier_b = RemoteTier(b, remote_b)
    with tier_b.single_flight(entry.key, wait=0) as flight:
        assert flight == Flight(busy=True)

    def finish() -> None:
        time.sleep(0.5)
        RemoteTier(a, remote_a).put(entry)
        holder.release()

    thread = threading.Thread(target=finish)
    thread.start()
    t0 = time.monotonic()
    with tier_b.single_flight(entry.key, wait=30) as flight:
        assert flight.entry is not None and flight.entry.cubin == entry.cubin
    thread.join()
    assert time.monotonic() - t0 < 10
    assert remote_b.stats.lock_waits == 1 and remote_b.stats.hits == 1


def test_a_waiter_on_a_bad_entry_waits_for_the_lock_instead_of_rejecting_it_again(
    redis_server, tmp_path
):
    """A bad value Redis keeps (here a string) is rejected once; the waiter then waits for
    the holder's lock, not for the entry (which "exists" all along), and takes its upload."""
    a, b = node(tmp_path, "a"), node(tmp_path, "b")
    entry = publish(a, 0)
    remote_a, remote_b = RemoteCache(redis_server.url()), RemoteCache(redis_server.url())
    redis_server.client().set(remote_a.entry_name(entry.key), b"not a hash")
    holder = remote_a.lock(entry.key)
    assert holder.try_acquire()

    def finish() -> None:
        time.sleep(1.0)
        RemoteTier(a, remote_a).put(entry)  # replaces the bad value
        holder.release()

    thread = threading.Thread(target=finish)
    thread.start()
    with RemoteTier(b, remote_b).single_flight(entry.key, wait=30) as flight:
        assert flight.entry is not None and flight.entry.cubin == entry.cubin
    thread.join()
    assert remote_b.stats.rejected == 1 and remote_b.stats.hits == 1


def test_single_flight_waiter_compiles_after_its_timeout(redis_server, tmp_path, caplog):
    key = cache_key(components(0))
    holder = RemoteCache(redis_server.url()).lock(key)
    assert holder.try_acquire()  # a holder that never uploads
    tier = RemoteTier(node(tmp_path, "b"), RemoteCache(redis_server.url()))
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING), tier.single_flight(key, wait=0.5) as flight:
        assert flight == Flight()  # neither an entry nor busy: compile here
    assert 0.5 <= time.monotonic() - t0 < 5
    assert any("compiling it here" in w for w in warnings_of(caplog))
    holder.release()


# Lock values no mlpjit node writes: (how to plant it, the name of the case). A live holder's
# value is a 32-hex-digit token with an expiry of at most the lock TTL, renewed while held.
PLANTED_LOCKS = {
    "token-without-expiry": lambda raw, name: raw.set(name, "0123456789abcdef" * 2),
    "foreign-value": lambda raw, name: raw.set(name, "held by me", px=600_000),
    "huge-value": lambda raw, name: raw.set(name, b"x" * 4_000_000),
    "a-hash": lambda raw, name: raw.hset(name, "token", "0123456789abcdef" * 2),
    "expiry-of-a-year": lambda raw, name: raw.set(name, "0123456789abcdef" * 2, ex=31_536_000),
}


@pytest.mark.parametrize("planted", sorted(PLANTED_LOCKS))
def test_a_planted_lock_is_taken_over_without_waiting(redis_server, tmp_path, planted, caplog):
    """Whoever can write Redis cannot stall every node with locks nobody holds: a value that
    is not a live holder's is taken over at once, for each kernel, and released after."""
    remote = RemoteCache(redis_server.url())
    raw, tier = redis_server.client(), RemoteTier(node(tmp_path, "b"), remote)
    keys = [cache_key(components(i)) for i in range(4)]
    for key in keys:
        PLANTED_LOCKS[planted](raw, remote.lock_name(key))
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        for key in keys:
            with tier.single_flight(key, wait=2.0) as flight:
                assert flight == Flight()  # this process compiles it, holding the lock
                value, ttl = raw.get(remote.lock_name(key)), raw.pttl(remote.lock_name(key))
                assert len(value) == 32 and 0 < ttl <= remote.lock_ttl_ms
            assert raw.exists(remote.lock_name(key)) == 0  # released
    assert time.monotonic() - t0 < 1.5
    assert remote.stats.lock_waits == 0 and remote.available and remote.stats.errors == 0
    assert sum("taken over" in w for w in warnings_of(caplog)) == 1  # once per process


def test_waits_for_other_nodes_share_one_budget_per_process(redis_server, tmp_path, caplog):
    """Live holders that never upload cost a process one wait in all, not one per kernel:
    after the budget (the per-kernel wait) is spent, the other kernels compile at once."""
    keys = [cache_key(components(i)) for i in range(4)]
    holders = [RemoteCache(redis_server.url()).lock(key) for key in keys]
    assert all(holder.try_acquire() for holder in holders)
    tier = RemoteTier(node(tmp_path, "b"), RemoteCache(redis_server.url()))
    t0 = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING):
            for key in keys:
                with tier.single_flight(key, wait=1.0) as flight:
                    assert flight == Flight()
    finally:
        for holder in holders:
            holder.release()
    assert 0.9 <= time.monotonic() - t0 < 2.5
    assert any("compiling the rest here" in w for w in warnings_of(caplog))


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
        return f"redis://127.0.0.1:{free_port()}/0", None
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


def _everything(manager: CompileManager) -> None:
    """Every public call of the remote tier, through the manager first; each must degrade
    to local behaviour."""
    store, tier = manager.store, manager.remote
    assert tier is not None
    remote, key = tier.remote, request_key(smoke(0))
    entry = manager.get(smoke(0))
    assert entry.persisted  # compiled and published locally
    assert remote.fetch(key) is None and remote.fetch_verified(key) is None
    assert not remote.exists(key)
    assert not remote.upload(key, portable_manifest(entry), entry.cubin)
    assert not tier.put(entry)
    lock = remote.lock(key)
    assert lock.acquire(timeout=5) and not lock.shared  # excludes nobody
    lock.release()
    with tier.single_flight(key, wait=5) as flight:
        assert flight == Flight()
    assert remote.entry_keys() is None
    assert tier.get_alias(entry.manifest["spec_key"]).entry is None
    assert remote.fleet_counters() is None
    assert push(store, remote)["failed"] == [key]
    assert pull(store, remote)["error"]


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_unusable_remote_warns_once_and_the_local_cache_carries_on(case, tmp_path, caplog):
    url, server = _unusable_url(case, tmp_path)
    try:
        store = node(tmp_path, "a")
        manager = fleet_manager(store, url)  # the default 2 s timeout
        remote = manager.remote.remote
        with caplog.at_level(logging.DEBUG, logger="mlpjit"):
            t0 = time.monotonic()
            _everything(manager)
            # The compile (and CuTe DSL's import) is not the remote's cost.
            first = time.monotonic() - t0 - manager.stats.compile_seconds
            t1 = time.monotonic()
            _everything(manager)  # the remote is skipped now: no waiting at all
            second = time.monotonic() - t1
        assert first < FAIL_OPEN_BOUND and second < 1.0, (first, second)
        assert manager.stats.compiles == 1  # then a local hit
        warned = warnings_of(caplog)
        assert len(warned) == 1, warned
        assert redact_url(url) in warned[0] and "continuing with the local cache" in warned[0]
        assert UNUSABLE[case] in warned[0], warned[0]
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert PASSWORD not in messages and "wrong-pass" not in messages
        assert remote.stats.errors == 1
        assert store.lookup(request_key(smoke(0))) is not None  # nothing local was lost
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
        assert remote.upload(entry.key, portable_manifest(entry), entry.cubin)
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
    assert RemoteTier(a, RemoteCache(url)).put(entry)
    got = RemoteTier(b, RemoteCache(url)).get(entry.key).entry
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
    assert push(a, remote, prefixes=[absent])["missing"] == [absent]
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
    assert pull(b, remote, prefixes=keys[1:])["skipped"] == [
        {"key": k, "reason": "already in the cache"} for k in keys[1:]
    ]
    assert pull(b, remote, prefixes=[absent])["missing"] == [absent]
    json.dumps(report)  # plain data for the CLI


def test_push_and_pull_sign_and_verify(redis_server, tmp_path, caplog):
    """push signs (and replaces an unsigned entry uploaded before the key file); pull takes
    only entries signed with its key, and rejects (and discards) the others."""
    a, b, c = node(tmp_path, "a"), node(tmp_path, "b"), node(tmp_path, "c")
    url, raw, key = redis_server.url(), redis_server.client(), secret()
    entries = [publish(a, i) for i in range(3)]
    keys = sorted(e.key for e in entries)
    assert RemoteCache(url).upload(entries[0].key, portable_manifest(entries[0]), entries[0].cubin)
    signed = RemoteCache(url, secret=key)
    with caplog.at_level(logging.WARNING):
        report = push(a, signed)
    assert report["pushed"] == keys and report["present"] == []
    assert signed.stats.rejected == 1 and "not signed" in rejections(caplog)[0]
    signer = FleetSigner(key)
    for k in keys:
        stored = raw.hgetall(signed.entry_name(k))
        assert stored[b"sig"] == signer.sign_entry(k, stored[b"manifest"], stored[b"cubin"])
    assert push(a, RemoteCache(url, secret=key))["present"] == keys
    assert pull(b, RemoteCache(url, secret=key))["pulled"] == keys
    assert all(b.lookup(k) is not None for k in keys)
    other = pull(c, RemoteCache(url, secret=secret()))
    assert other["pulled"] == [] and [r["key"] for r in other["rejected"]] == keys
    assert all("does not verify" in r["reason"] for r in other["rejected"])
    assert local_files(c) == [] and signed.entry_keys() == []  # read, rejected, discarded


def test_push_and_pull_select_by_key_prefix(redis_server, tmp_path):
    a, b = node(tmp_path, "a"), node(tmp_path, "b")
    keys = sorted(publish(a, i).key for i in range(4))
    unmatched = next(p for p in ("0" * 12, "f" * 12) if not any(k.startswith(p) for k in keys))
    remote = RemoteCache(redis_server.url())
    report = push(a, remote, prefixes=[keys[0][:8].upper(), unmatched])
    assert report["pushed"] == [keys[0]] and report["missing"] == [unmatched]
    assert push(a, remote)["pushed"] == keys[1:]
    pulled = pull(b, remote, prefixes=[keys[1][:10], keys[2][:10], unmatched])
    assert pulled["pulled"] == [keys[1], keys[2]] and pulled["missing"] == [unmatched]
    assert pulled["error"] is None and pulled["available"]
    assert [k for k in keys if b.lookup(k)] == [keys[1], keys[2]]
    assert check_prefixes([" AB12 ", "ab12", "cd"]) == ["ab12", "cd"]
    for bad in ("", "xyz", "a" * 65, "12 34"):
        with pytest.raises(ValueError, match="KEY_PREFIX"):
            check_prefixes([bad])


def test_remote_report_for_doctor(redis_server, redis_auth_server, tmp_path):
    remote = RemoteCache(redis_server.url())
    for i in range(2):
        entry = publish(node(tmp_path, "a"), i)
        remote.upload(entry.key, portable_manifest(entry), entry.cubin)
    report = remote_report(remote)
    assert report["reachable"] and report["auth_ok"] and report["entries"] == 2
    assert report["signed"] is False
    assert remote_report(RemoteCache(redis_server.url(), secret=secret()))["signed"] is True
    assert report["server_version"][0].isdigit() and report["error"] is None
    assert report["fleet"] == {"hits": 0, "rejected": 0, "uploads": 2}
    authed = remote_report(RemoteCache(redis_auth_server.url()))
    assert authed["reachable"] and authed["auth_ok"] and authed["entries"] == 0
    refused = remote_report(RemoteCache(redis_auth_server.url(password="wrong-pass")))
    assert refused["reachable"] and refused["auth_ok"] is False and refused["error"]
    assert "check the user and password" in refused["error"] and refused["fleet"] is None
    assert "wrong-pass" not in json.dumps(refused)
    down = remote_report(RemoteCache(f"redis://127.0.0.1:{free_port()}/0"))
    assert not down["reachable"] and down["auth_ok"] is None and down["error"]
    json.dumps(report)


# ------------------------------------------------------------------ settings


def test_an_unsigned_tier_warns_once_per_process_and_a_signed_one_never(
    redis_server, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(tiermod, "_UNSIGNED_WARNED", False)
    url = redis_server.url()
    with caplog.at_level(logging.WARNING):
        RemoteTier(node(tmp_path, "a"), RemoteCache(url, secret=secret()))
        assert warnings_of(caplog) == []
        for name in ("b", "c"):
            RemoteTier(node(tmp_path, name), RemoteCache(url, prefix="fleet:"))
    (warned,) = warnings_of(caplog)
    assert "not authenticated" in warned and "MLPJIT_REMOTE_KEY_FILE is unset" in warned
    assert url in warned and "fleet:*" in warned


def test_remote_from_env_reads_the_key_file(monkeypatch, tmp_path):
    monkeypatch.setenv("MLPJIT_REMOTE_CACHE", "redis://127.0.0.1:1/0")
    assert not remote_from_env().signed
    key = secret()
    monkeypatch.setenv("MLPJIT_REMOTE_KEY_FILE", str(write_key_file(tmp_path / "fleet.key", key)))
    remote = remote_from_env()
    assert remote.signed
    shown = repr(vars(remote)) + json.dumps(remote_report(remote))
    assert key.hex() not in shown and repr(key) not in shown  # the secret is never shown


def test_remote_from_env_reads_the_four_variables(monkeypatch):
    assert remote_from_env() is None
    monkeypatch.setenv("MLPJIT_REMOTE_CACHE", "  ")
    assert remote_from_env() is None
    settings = {
        "MLPJIT_REMOTE_CACHE": "rediss://user:pw@cache.internal:6380/2",
        "MLPJIT_REMOTE_PREFIX": "fleet:",
        "MLPJIT_REMOTE_TTL": "86400",
        "MLPJIT_REMOTE_TIMEOUT": "0.5",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    remote = remote_from_env()
    assert remote is not None
    assert (remote.prefix, remote.ttl_ms, remote.timeout) == ("fleet:", 86_400_000, 0.5)
    assert remote.url == "rediss://user:***@cache.internal:6380/2"
    for name in ("MLPJIT_REMOTE_PREFIX", "MLPJIT_REMOTE_TTL", "MLPJIT_REMOTE_TIMEOUT"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("MLPJIT_REMOTE_CACHE", "redis://127.0.0.1:1/0")
    default = remote_from_env()
    assert (default.prefix, default.ttl_ms, default.timeout) == (DEFAULT_PREFIX, None, 2.0)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MLPJIT_REMOTE_CACHE", "http://cache:6379/0"),
        ("MLPJIT_REMOTE_CACHE", "redis://cache:6379/notadb"),
        ("MLPJIT_REMOTE_CACHE", "redis://cache:port/0"),
        ("MLPJIT_REMOTE_CACHE", "redis:///0"),
        ("MLPJIT_REMOTE_CACHE", "redis://cache:6379/0?db=x"),
        ("MLPJIT_REMOTE_PREFIX", "two words"),
        ("MLPJIT_REMOTE_TTL", "0"),
        ("MLPJIT_REMOTE_TTL", "a day"),
        ("MLPJIT_REMOTE_TIMEOUT", "-1"),
        ("MLPJIT_REMOTE_TIMEOUT", "inf"),
        ("MLPJIT_REMOTE_KEY_FILE", "/nonexistent/fleet.key"),
        ("MLPJIT_REMOTE_KEY_FILE", "/etc/passwd"),  # readable by others
    ],
)
def test_remote_from_env_names_a_bad_variable(monkeypatch, name, value):
    monkeypatch.setenv("MLPJIT_REMOTE_CACHE", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        remote_from_env()


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0?ssl_ca_certs=/etc/ca.pem",
        "redis://" + "a" * 100_000 + ":6379/0",
        "redis://cache\u202e.internal:6379/0",
    ],
    ids=["tls-option-without-tls", "100-kB-host", "bidi-control"],
)
def test_a_bad_remote_url_leaves_a_serving_process_on_its_local_cache(
    monkeypatch, tmp_path, caplog, url
):
    """prepare() and warm build their manager through remote_tier: the fleet is optional
    there, so a bad URL is one warning naming the variable, and kernels still come."""
    monkeypatch.setenv("MLPJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLPJIT_REMOTE_CACHE", url)
    monkeypatch.setattr(managermod, "_DEFAULT", None)
    with caplog.at_level(logging.WARNING):
        manager = managermod.default_manager()
        assert manager.remote is None
        assert managermod.default_manager() is manager  # not rebuilt, not warned again
        assert manager.get(smoke(0)).persisted
    warned = warnings_of(caplog)
    assert len(warned) == 1 and warned[0].startswith("mlpjit: MLPJIT_REMOTE_CACHE"), warned
    assert "local cache only" in warned[0] and len(warned[0]) < 600


@pytest.mark.parametrize("setting", ["ttl", "timeout", "lock_ttl", "retry_after"])
@pytest.mark.parametrize("value", [1e308, 1e12, float("inf"), float("nan"), -1.0, 0.0])
def test_remote_cache_settings_out_of_range_are_one_line_errors(setting, value):
    with pytest.raises(ValueError, match=f"remote cache {setting} must be a number in"):
        RemoteCache("redis://127.0.0.1:6379/0", **{setting: value})


def test_redact_url_hides_passwords():
    assert redact_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact_url("rediss://u:pw@h:1/0") == "rediss://u:***@h:1/0"
    assert redact_url("redis://u@h:1/0") == "redis://u@h:1/0"
    assert "pw" not in redact_url("redis://h:1/0?password=pw&db=1")
