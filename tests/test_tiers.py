"""mlpjit.jit.tiers: the local tiers behind the CacheTier interface."""

from __future__ import annotations

import logging
import os

from entries import made, paths, publish

from mlpjit.jit.directory_tier import ReadOnlyTier
from mlpjit.jit.key import spec_key
from mlpjit.jit.store import CacheStore
from mlpjit.jit.tiers import MISS
from mlpjit.jit.writable_tier import WritableTier


def test_writable_tier_gets_publishes_and_quarantines(tmp_path):
    tier = WritableTier(tmp_path / "cache")
    key, components, binary = made(0)
    assert tier.get(key) == MISS  # nothing there yet: not even the root
    entry = tier.publish(key, components, binary, 0.5)
    assert tier.get(key).entry.cubin == entry.cubin == binary.cubin
    assert tier.get_alias(spec_key(components)).entry.key == key
    paths(tier.path, key)[1].write_bytes(b"tampered")
    found = tier.get(key)
    assert found.entry is None and "cubin has 8 bytes" in found.rejected
    assert tier.quarantined == 1 and tier.get(key) == MISS  # moved away


def test_read_only_tier_skips_a_bad_entry_and_never_locks(tmp_path, caplog):
    root = tmp_path / "built"
    key, _, _ = publish(root, 1)
    tier = ReadOnlyTier(root)
    assert tier.get(key).entry is not None
    manifest, cubin = paths(root, key)
    os.chmod(cubin, 0o666)
    with caplog.at_level(logging.WARNING, logger="mlpjit"):
        found = tier.get(key)
    assert found.entry is None and "writable by group or other" in found.rejected
    assert cubin.exists() and "read-only cache dir" in caplog.text
    lock = tier.lock(key)
    assert lock.try_acquire() and not lock.shared  # nothing there to guard


def test_a_read_only_tier_missing_at_start_stays_skipped(tmp_path):
    later = tmp_path / "later"
    tier = ReadOnlyTier(later)
    key, _, _ = publish(later, 2)
    assert tier.get(key) == MISS


def test_the_store_walks_its_tiers_in_order(tmp_path):
    built = tmp_path / "built"
    key, _, _ = publish(built, 3)
    store = CacheStore(tmp_path / "root", read_only=[built])
    assert [t.path for t in store.tiers] == [store.root, built.resolve()]
    assert store.lookup(key).origin == built.resolve()
