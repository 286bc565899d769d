"""A layer sweep's pairs against the planned pair, and the table's adoption rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlpjit.bench import sweep_compare, tune_gemv


def _row(gate_up: str, down: str, rounds: list[float], default: bool = False) -> dict:
    us = sum(rounds) / len(rounds)
    return {"shape": "glm5-tp8", "tokens": 1, "gate_up": gate_up, "down": down,
            "default": default, "us": us, "round_us": rounds}  # fmt: skip


CHAIN = [
    _row("t1/r3/c2", "t4/r3/c2", [10.0, 10.0], default=True),
    _row("t1/r3/c2/p1", "t4/r3/c2", [9.6, 9.5]),  # > 3% faster in both rounds
    _row("t1/r3/c2/p2", "t4/r3/c2", [9.5, 9.8]),  # one round only 2% faster
    _row("t1/r3/c2", "t4/r3/c2/early", [9.0, 9.0]),  # down triggering early: never
    _row("t1/r3/c2", "t4/r3/c2/p1", [9.0, 9.1]),  # faster, but slower with the norm
]
NORM = [
    _row("t1/r3/c2", "t4/r3/c2", [12.0, 12.0], default=True),
    _row("t1/r3/c2/p1", "t4/r3/c2", [11.0, 11.0]),
    _row("t1/r3/c2", "t4/r3/c2/p1", [12.5, 12.5]),
]


def test_compare_applies_the_adoption_rule() -> None:
    found = {(r["gate_up"], r["down"]): r for r in sweep_compare.compare(CHAIN, NORM)}
    assert [k for k, r in found.items() if r["passes"]] == [("t1/r3/c2/p1", "t4/r3/c2")]
    paced = found[("t1/r3/c2/p1", "t4/r3/c2")]
    assert paced["ratio"] == pytest.approx(0.955) and paced["worst_round"] == pytest.approx(0.96)
    assert paced["norm_ratio"] == pytest.approx(11 / 12)
    assert found[("t1/r3/c2/p2", "t4/r3/c2")]["norm_ratio"] is None  # not timed with the norm
    assert found[("t1/r3/c2", "t4/r3/c2/p1")]["norm_ratio"] == pytest.approx(12.5 / 12)
    # Without the norm's run only the rounds decide (and the down's trigger).
    passing = {(r["gate_up"], r["down"]) for r in sweep_compare.compare(CHAIN) if r["passes"]}
    assert passing == {("t1/r3/c2/p1", "t4/r3/c2"), ("t1/r3/c2", "t4/r3/c2/p1")}
    with pytest.raises(ValueError, match="no planned"):
        sweep_compare.compare(CHAIN[1:])


def test_compare_command_prints_the_passing_pairs(tmp_path: Path, capsys) -> None:
    chain, norm = tmp_path / "chain.json", tmp_path / "norm.json"
    chain.write_text(json.dumps({"meta": {}, "results": CHAIN}))
    norm.write_text(json.dumps({"meta": {}, "results": NORM}))
    assert tune_gemv.main(["compare", str(chain), "--norm", str(norm), "--passing"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 3 and "| t1/r3/c2/p1 | t4/r3/c2 | 0.955 | 0.960 | 0.917 |" in table[2]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["compare", "/nonexistent.json"], "not a layer sweep's --json"),
        (["compare", "{path}", "--min-gain", "1.5"], "--min-gain"),
    ],
)
def test_compare_bad_input(argv, match, tmp_path: Path, capsys) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"results": CHAIN}))
    argv = [a.replace("{path}", str(path)) for a in argv]
    try:
        code = tune_gemv.main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2 and match in capsys.readouterr().err
