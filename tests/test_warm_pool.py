"""mlpjit.warm_pool with a fake compile manager and fake worker processes (no compiles).

The real pool, compiling real kernels in real workers, is tested through the CLI in
tests/test_cli.py (test_warm_jobs_compile_each_kernel_once and the --from/--jobs case).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlpjit import warm_pool
from mlpjit.errors import MlpjitError
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


def test_worker_command_replays_the_request_file() -> None:
    command = warm_pool.worker_command(Path("/tmp/list.jsonl"), 2)
    assert command == [
        sys.executable, "-m", "mlpjit", "warm", "--from", "/tmp/list.jsonl", "--json",
        "--worker-id", "2",
    ]  # fmt: skip


class _FakeWorkers:
    """Stands in for subprocess.Popen: worker w reports ``outcomes[w]`` (status per request,
    or a returncode and raw stdout) after reading the request file it was given."""

    def __init__(self, outcomes: list) -> None:
        self.outcomes = outcomes
        self.commands: list[list[str]] = []
        self.files: list[Path] = []
        self.lines: list[list[str]] = []

    def __call__(self, command, stdout=None, text=None):
        worker = int(command[command.index("--worker-id") + 1])
        path = Path(command[command.index("--from") + 1])
        self.commands.append(command)
        self.files.append(path)
        self.lines.append(path.read_text().splitlines())
        outcome = self.outcomes[worker]
        if isinstance(outcome, tuple):
            returncode, out = outcome
        else:
            requests = [KernelRequest.from_json_line(line) for line in self.lines[-1]]
            entries = [
                {
                    "key": request_key(r),
                    "kernel": r.kernel,
                    "params": dict(r.params),
                    "status": status,
                    "seconds": 1.5 if status == "compiled" else 0.01,
                    "compiles": int(status == "compiled"),
                }
                for r, status in zip(requests, outcome, strict=True)
            ]
            returncode, out = 0, json.dumps({"entries": entries})
        return SimpleNamespace(returncode=returncode, communicate=lambda: (out, None))


def test_workers_share_one_request_file_and_records_merge_by_key(monkeypatch) -> None:
    fake = _FakeWorkers(
        [
            ["compiled", "hit", "compiled"],
            ["hit", "compiled", "compiled"],  # the third compiled twice: counted twice
        ]
    )
    monkeypatch.setattr(warm_pool.subprocess, "Popen", fake)
    requests = _requests(1024, 1056, 1088)
    records = warm_pool.warm_in_workers(requests, jobs=2)
    assert fake.commands == [warm_pool.worker_command(fake.files[0], w) for w in (0, 1)]
    assert fake.files[0] == fake.files[1] and not fake.files[0].exists()  # removed after
    assert fake.lines[0] == [r.to_json_line() for r in requests]
    assert [r["key"] for r in records] == [request_key(r) for r in requests]
    assert [(r["status"], r["compiles"], r["seconds"]) for r in records] == [
        ("compiled", 1, 1.5),
        ("compiled", 1, 1.5),
        ("compiled", 2, 1.5),
    ]


def test_failed_workers_are_named(monkeypatch) -> None:
    fake = _FakeWorkers([["hit"], (1, ""), (0, "not json")])
    monkeypatch.setattr(warm_pool.subprocess, "Popen", fake)
    with pytest.raises(MlpjitError) as raised:
        warm_pool.warm_in_workers(_requests(1024), jobs=3)
    assert str(raised.value) == (
        "warm failed: worker 1 exited with status 1; "
        "worker 2 printed no summary (output ends: 'not json')"
    )
    assert not fake.files[0].exists()
