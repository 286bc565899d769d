"""The process-wide memo of loaded kernels (mlpjit.jit.loaded), without a GPU: the launcher's
load is a stand-in that counts; the managers are fakes or real ones over hand-made entries."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from entries import publish

from mlpjit.jit import launcher, loaded
from mlpjit.jit.manager import default_manager
from mlpjit.jit.spec import KernelRequest

CUDA0 = torch.device("cuda", 0)


class _CountingManager:
    """A compile manager that serves each request as its own entry and records the asks."""

    def __init__(self) -> None:
        self.asked: list[list[KernelRequest]] = []

    def warm(self, requests):
        self.asked.append(list(requests))
        return list(requests)


def _request(n: int = 1024, **params: object) -> KernelRequest:
    return KernelRequest("smoke", {"n": n, "scale": 2.0, "block": 128, **params}, "sm_90a")


@pytest.fixture()
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Every launcher.load_kernel call as (entry, device); the 'kernel' is that tuple."""
    calls: list[tuple] = []

    def load(entry, device):
        calls.append((entry, device))
        return (entry, device)

    monkeypatch.setattr(launcher, "load_kernel", load)
    loaded.clear()
    yield calls
    loaded.clear()


def test_each_request_is_loaded_once_per_device(loads: list[tuple]) -> None:
    manager = _CountingManager()
    requests = [_request(1024), _request(2048)]
    first = list(loaded.load_kernels(requests, CUDA0, manager))
    # Equal requests, other objects (another layer's plan): served from the memo.
    again = list(loaded.load_kernels([_request(2048), _request(1024)], CUDA0, manager))
    assert again == first[::-1] and len(loads) == 2 and len(manager.asked) == 1
    other_device = list(loaded.load_kernels(requests, torch.device("cuda", 1), manager))
    assert [device for _, device in other_device] == [torch.device("cuda", 1)] * 2
    assert len(loads) == 4 and len(manager.asked) == 2
    assert loaded.stats() == loaded.MemoStats(asked=6, hits=2)


def test_only_the_missing_requests_go_to_the_manager(loads: list[tuple]) -> None:
    manager = _CountingManager()
    list(loaded.load_kernels([_request(1024)], CUDA0, manager))
    list(loaded.load_kernels([_request(1024), _request(4096)], CUDA0, manager))
    assert [[r.params["n"] for r in asked] for asked in manager.asked] == [[1024], [4096]]


def test_value_types_tell_requests_apart(loads: list[tuple]) -> None:
    """1, 1.0 and True are equal in Python but not in a cache key: three kernels."""
    manager = _CountingManager()
    requests = [_request(extra=1), _request(extra=1.0), _request(extra=True)]
    list(loaded.load_kernels(requests, CUDA0, manager))
    assert len(loads) == 3


def test_another_manager_or_record_file_asks_again(
    loads: list[tuple], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A new manager (new cache dirs) or a new MLPJIT_RECORD file never gets a remembered
    kernel: its manager is asked (and records the request)."""
    one, two = _CountingManager(), _CountingManager()
    list(loaded.load_kernels([_request()], CUDA0, one))
    list(loaded.load_kernels([_request()], CUDA0, two))
    assert len(one.asked) == len(two.asked) == 1
    monkeypatch.setenv("MLPJIT_RECORD", str(tmp_path / "record.jsonl"))
    list(loaded.load_kernels([_request()], CUDA0, one))
    list(loaded.load_kernels([_request()], CUDA0, one))
    assert len(one.asked) == 2


def test_a_failed_load_keeps_the_kernels_before_it(
    loads: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = _CountingManager()

    def fail_on_the_second(entry, device):
        loads.append((entry, device))
        if len(loads) == 2:
            raise RuntimeError("no module")
        return (entry, device)

    monkeypatch.setattr(launcher, "load_kernel", fail_on_the_second)
    kernels = loaded.load_kernels([_request(1), _request(2)], CUDA0, manager)
    assert next(kernels)[0].params["n"] == 1
    with pytest.raises(RuntimeError, match="no module"):
        next(kernels)
    list(loaded.load_kernels([_request(1), _request(2)], CUDA0, manager))
    assert [[r.params["n"] for r in asked] for asked in manager.asked] == [[1, 2], [2]]


def test_default_manager_lookups_happen_once_and_follow_the_cache_dir(
    loads: list[tuple], isolated_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Through the real default manager: one verified cache hit per request; after
    MLPJIT_CACHE_DIR changes, the rebuilt manager's cache is asked again."""
    key, components, _binary = publish(isolated_cache)
    request = KernelRequest("smoke", components["params"], "sm_90a")
    for _ in range(3):
        (kernel,) = loaded.load_kernels([request], CUDA0)
    assert kernel[0].key == key and default_manager().stats.hits == 1 and len(loads) == 1
    other = tmp_path / "other-cache"
    publish(other)
    monkeypatch.setenv("MLPJIT_CACHE_DIR", str(other))
    (kernel,) = loaded.load_kernels([request], CUDA0)
    assert kernel[0].origin == other.resolve() and default_manager().stats.hits == 1
    assert len(loads) == 2


def test_clear_forgets_everything(loads: list[tuple]) -> None:
    manager = _CountingManager()
    list(loaded.load_kernels([_request()], CUDA0, manager))
    loaded.clear()
    assert loaded.stats() == loaded.MemoStats()
    list(loaded.load_kernels([_request()], CUDA0, manager))
    assert len(manager.asked) == 2


def test_derived_values_live_in_the_kernels_scope(
    loads: list[tuple], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """derived(): one dict per manager and MLPJIT_RECORD file, the same dict on every ask
    within them, a fresh one in another scope, emptied by clear(); managers stay weak."""
    import gc
    import weakref

    one, two = _CountingManager(), _CountingManager()
    loaded.derived(one)["pair"] = "of one"
    assert loaded.derived(one) == {"pair": "of one"} and loaded.derived(two) == {}
    monkeypatch.setenv("MLPJIT_RECORD", str(tmp_path / "record.jsonl"))
    assert loaded.derived(one) == {}
    monkeypatch.delenv("MLPJIT_RECORD")
    assert loaded.derived(one) == {"pair": "of one"}
    loaded.clear()
    assert loaded.derived(one) == {}
    gone = weakref.ref(two)
    del two
    gc.collect()
    assert gone() is None
    monkeypatch.setenv("MLPJIT_CACHE_DIR", str(tmp_path / "cache"))
    loaded.derived()["default"] = 1
    assert loaded.derived(default_manager()) == {"default": 1}
