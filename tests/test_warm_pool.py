"""mlpjit.warm_pool with a fake compile manager and a fake process pool (no compiles).

The real pool, compiling real kernels in real workers, is tested through the CLI in
tests/test_cli.py (test_warm_jobs_compile_each_kernel_once and the --from/--jobs case).
"""

from __future__ import annotations

import io
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from types import SimpleNamespace

import pytest

from mlpjit import warm_pool
from mlpjit.errors import CompilerUnavailableError, MlpjitError
from mlpjit.jit.key import request_key
from mlpjit.jit.spec import KernelRequest


def _requests(*ns: int) -> list[KernelRequest]:
    return [KernelRequest("smoke", {"n": n, "scale": 2.0, "block": 128}, "sm_90a") for n in ns]


class _FakeManager:
    """Reports progress in reverse order (a pool's lock waits reorder it); odd n compile."""

    def __init__(self, store=None, remote=None) -> None:
        assert remote is None  # no MLPJIT_REMOTE_CACHE in tests: no fleet layer
        self.stats = SimpleNamespace(compiles=0)

    def warm(self, requests, progress=None):
        for done, request in enumerate(reversed(requests), 1):
            if request.params["n"] % 2:
                self.stats.compiles += 1
            progress(done, len(requests), request)
        return list(requests)


def test_in_process_records_in_request_order_with_progress_lines(monkeypatch) -> None:
    import mlpjit.jit.manager as manager

    monkeypatch.setattr(manager, "CompileManager", _FakeManager)
    requests = _requests(1025, 1056, 1089)
    log = io.StringIO()
    records = warm_pool.warm_in_process(requests, worker_id=3, log=log)
    keys = [request_key(r) for r in requests]
    assert [r["key"] for r in records] == keys and len(set(keys)) == 3
    assert [(r["status"], r["compiles"]) for r in records] == [
        ("compiled", 1),
        ("hit", 0),
        ("compiled", 1),
    ]
    assert records[1]["kernel"] == "smoke" and records[1]["params"] == requests[1].params
    assert all(isinstance(r["seconds"], float) for r in records)
    lines = log.getvalue().splitlines()
    assert [line.split()[:4] for line in lines] == [
        ["w3", "[1/3]", "smoke", keys[2][:12]],
        ["w3", "[2/3]", "smoke", keys[1][:12]],
        ["w3", "[3/3]", "smoke", keys[0][:12]],
    ]
    assert lines[0].split()[4] == "compiled" and lines[1].split()[4] == "hit"


def test_in_process_without_worker_id_has_no_prefix(monkeypatch, capsys) -> None:
    import mlpjit.jit.manager as manager

    monkeypatch.setattr(manager, "CompileManager", _FakeManager)
    warm_pool.warm_in_process(_requests(1024))
    assert capsys.readouterr().err.startswith("[1/1] smoke ")


class _FakePool:
    """Stands in for ProcessPoolExecutor: worker w returns ``outcomes[w]`` (a status per
    request, as records) or raises it (an exception), given the request lines."""

    outcomes: list = []
    calls: list = []

    def __init__(self, max_workers, mp_context) -> None:
        assert mp_context.get_start_method() == "spawn"
        self.max_workers = max_workers

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def submit(self, fn, lines, worker):
        assert fn is warm_pool._worker
        type(self).calls.append((lines, worker))
        future = Future()
        outcome = self.outcomes[worker]
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
            return future
        requests = [KernelRequest.from_json_line(line) for line in lines]
        future.set_result(
            [
                {
                    "key": request_key(r),
                    "kernel": r.kernel,
                    "params": dict(r.params),
                    "status": status,
                    "seconds": 1.5 if status == "compiled" else 0.01,
                    "compiles": int(status == "compiled"),
                }
                for r, status in reversed(list(zip(requests, outcome, strict=True)))
            ]
        )
        return future


def _fake_pool(monkeypatch, outcomes: list) -> type[_FakePool]:
    monkeypatch.setattr(_FakePool, "outcomes", outcomes)
    monkeypatch.setattr(_FakePool, "calls", [])
    monkeypatch.setattr(warm_pool, "ProcessPoolExecutor", _FakePool)
    return _FakePool


def test_workers_get_the_whole_list_and_records_merge_by_key(monkeypatch) -> None:
    pool = _fake_pool(
        monkeypatch,
        [
            ["compiled", "hit", "compiled"],
            ["hit", "compiled", "compiled"],  # the third compiled twice: counted twice
        ],
    )
    requests = _requests(1024, 1056, 1088)
    records = warm_pool.warm_in_workers(requests, jobs=2)
    lines = [r.to_json_line() for r in requests]
    assert pool.calls == [(lines, 0), (lines, 1)]
    assert [r["key"] for r in records] == [request_key(r) for r in requests]  # request order
    assert [(r["status"], r["compiles"], r["seconds"]) for r in records] == [
        ("compiled", 1, 1.5),
        ("compiled", 1, 1.5),
        ("compiled", 2, 1.5),
    ]


def test_failed_workers_are_named(monkeypatch) -> None:
    _fake_pool(
        monkeypatch,
        [["hit"], CompilerUnavailableError("no compiler"), BrokenProcessPool("killed")],
    )
    with pytest.raises(MlpjitError) as raised:
        warm_pool.warm_in_workers(_requests(1024), jobs=3)
    assert str(raised.value) == "warm failed: worker 1: no compiler; worker 2 died (killed)"


def test_a_bug_in_a_worker_keeps_its_exception(monkeypatch) -> None:
    _fake_pool(monkeypatch, [["hit"], KeyError("bug")])
    with pytest.raises(KeyError, match="bug"):
        warm_pool.warm_in_workers(_requests(1024), jobs=2)
