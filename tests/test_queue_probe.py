"""The queue probe without a GPU: its parameters, its SASS (the flood's copies before x's
one load, no spills), the report's arithmetic and the bench's request list."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from mlpjit.bench import queue_probe as bench  # noqa: E402
from mlpjit.kernels import queue_probe  # noqa: E402
from mlpjit.kernels.queue_probe import STAMPS, QueueParams  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"flood_bytes": 1000}, "flood_bytes must be"),
        ({"flood_bytes": 8192 + 2048}, "multiple of 4096"),
        ({"flood_bytes": 300 * 1024}, "flood_bytes must be"),
        ({"flood_bytes": 8192, "quiet": 132}, "quiet must be"),
        ({"flood_bytes": 8192, "delay_ns": -1}, "delay_ns must be"),
        ({"flood_bytes": 8192, "ctas": 0}, "ctas must be"),
    ],
)
def test_bad_params(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        QueueParams(**kwargs)


def test_every_cta_takes_an_sm_of_its_own() -> None:
    """More than half an SM's shared memory, whatever the flood: one CTA per SM."""
    for kb in (4, 96, 224):
        assert QueueParams(kb * 1024).smem_bytes > 228 * 1024 // 2


@pytest.mark.parametrize("params", [QueueParams(192 * 1024, 4, 2000), QueueParams(4096, 0)])
def test_sass_requests_the_flood_before_the_one_x_load(params) -> None:
    from mlpjit.testing.cubin_info import sass_facts

    facts = sass_facts(queue_probe.compile_cubin(params, "sm_90a").cubin)
    assert facts.stack == 0 and facts.local == 0
    ops = list(facts.ops)
    counts = Counter(ops)
    assert counts["LDG.E.128"] == 1  # x: 16 bytes a lane of the first warp
    assert counts["CS2R"] >= 5  # the five stamps (more with the delay's spin)
    assert counts["STG.E.64"] == 7
    assert ops.index("LDGSTS.E.BYPASS.128") < ops.index("LDG.E.128")


def _launch(starts: list[int], trip: int, landed: int) -> list[list[int]]:
    rows = []
    for start in starts:
        row = [start, start + 100, start + 1000, start + 1000 + trip, start + landed, 0, 0, 0]
        assert len(row) == STAMPS
        rows.append(row)
    return rows


def test_summarize_splits_flooding_and_quiet_ctas() -> None:
    params = QueueParams(8192, quiet=1, delay_ns=1000, ctas=3)
    flood = _launch([0, 50], trip=4000, landed=6000)
    quiet = _launch([20], trip=700, landed=0)
    row = bench.summarize(params, [flood + quiet, flood + quiet])
    assert row["x_flood_us"] == [4.0] * 4 and row["x_quiet_us"] == [0.7] * 2
    assert row["landed_median_us"] == pytest.approx(6.025)
    assert row["landed_latest_us"] == pytest.approx(6.05)
    assert (row["flood_kb"], row["flooders"], row["delay_us"]) == (8, 2, 1.0)


def test_probe_params_cross_floods_and_delays() -> None:
    params = bench.probe_params([0, 96], [0, 2000], quiet=4)
    assert [(p.flood_bytes, p.quiet, p.delay_ns) for p in params] == [
        (16384, 131, 0), (16384, 131, 2000), (98304, 4, 0), (98304, 4, 2000)
    ]  # fmt: skip


def test_emit_writes_the_requests(tmp_path) -> None:
    out = tmp_path / "q.jsonl"
    assert bench.main(["--emit", str(out), "--floods", "96", "--delays", "0,1000"]) == 0
    items = [json.loads(line) for line in out.read_text().splitlines()]
    assert [i["kernel"] for i in items] == ["queue_probe"] * 2
    # parameters at their defaults stay out of the key (quiet 4, delay 0)
    assert [i["params"].get("delay_ns", 0) for i in items] == [0, 1000]
    assert all(i["params"]["flood_bytes"] == 96 * 1024 for i in items)


@pytest.mark.parametrize(
    ("args", "match"),
    [(["--floods", "a"], "--floods must be"), (["--delays", "-5"], "--delays must be"),
     (["--floods", "300"], "flood_bytes must be")],
)  # fmt: skip
def test_bad_command_lines_exit_2_with_one_line(args, match, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main([*args, "--emit", os.devnull])
    assert exc.value.code == 2
    assert match in capsys.readouterr().err.strip().splitlines()[-1]


def test_script_is_the_bench_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_queue_probe.py"), "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0 and "distributed shared memory" in proc.stdout
