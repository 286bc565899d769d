"""The DenseMlp A/B of two source trees: run order, base export, report, orchestration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlpjit.bench import ab_trees


def test_run_order_alternates_and_mirrors_with_the_norm() -> None:
    order = [(mode, tree) for mode, _, tree in ab_trees.run_order(2)]
    assert order == [
        ("chain", "A"), ("chain", "B"), ("chain", "B"), ("chain", "A"),
        ("norm", "B"), ("norm", "A"), ("norm", "A"), ("norm", "B"),
    ]  # fmt: skip
    assert [r for _, r, _ in ab_trees.run_order(3)][:6] == [1, 1, 2, 2, 3, 3]


def test_tree_env_puts_the_tree_first_and_sets_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/carried/site")
    env = ab_trees.tree_env(tmp_path / "base", tmp_path / "cache")
    assert env["PYTHONPATH"].split(":") == [str(tmp_path / "base"), "/carried/site"]
    assert env["MLPJIT_CACHE_DIR"] == str(tmp_path / "cache")


def test_export_base_writes_the_revision_and_names_a_bad_one(tmp_path: Path) -> None:
    dest = ab_trees.export_base("HEAD", tmp_path / "base")
    assert (dest / "mlpjit" / "dense_mlp.py").is_file()
    assert (dest / "scripts" / "bench_dense_mlp.py").is_file()
    assert not (dest / "tests").exists()
    (dest / "stale.py").write_text("")
    assert not (ab_trees.export_base("HEAD", dest) / "stale.py").exists()  # emptied first
    with pytest.raises(ValueError, match="no-such-revision"):
        ab_trees.export_base("no-such-revision", tmp_path / "bad")


def _run(mode: str, r: int, tree: str, us: dict[tuple[str, int], float]) -> dict:
    rows = [{"shape": s, "tokens": t, "mlpjit_us": v} for (s, t), v in us.items()]
    return {"mode": mode, "round": r, "tree": tree, "results": rows}


def test_report_means_ratio_and_spread() -> None:
    runs = [
        _run("chain", 1, "A", {("glm5-tp8", 1): 10.0, ("glm5-tp8", 8): 12.0}),
        _run("chain", 1, "B", {("glm5-tp8", 1): 9.0}),
        _run("chain", 2, "B", {("glm5-tp8", 1): 9.9}),
        _run("chain", 2, "A", {("glm5-tp8", 1): 10.0}),
    ]
    (row,) = ab_trees.report(runs)  # glm5-tp8 at 8 tokens has no B: left out
    assert (row["mode"], row["shape"], row["tokens"]) == ("chain", "glm5-tp8", 1)
    assert row["before_us"] == 10.0 and row["after_us"] == pytest.approx(9.45)
    assert row["ratio"] == pytest.approx(0.945) and row["round_spread"] == pytest.approx(0.1)
    assert "| chain | glm5-tp8 | 1 | 10.00 | 9.45 | 0.945 | 10.0% |" in ab_trees.markdown([row])


def test_run_times_both_trees_in_order_and_writes_one_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    work = tmp_path / "ab"
    (work / "base" / "scripts").mkdir(parents=True)
    (work / "base" / "scripts" / "bench_dense_mlp.py").write_text("")
    calls = []

    def fake_bench(tree, cache, mode, shapes, tokens, replays, warmup, out):
        assert cache == work / "cache"
        calls.append((tree, mode, shapes, tokens, replays, warmup))
        us = 10.0 if tree == work / "base" else 9.0
        return {"meta": {}, "results": [{"shape": "glm5-tp8", "tokens": 1, "mlpjit_us": us}]}

    monkeypatch.setattr(ab_trees, "run_bench", fake_bench)
    argv = ["run", "--work", str(work), "--shapes", "glm5-tp8", "--tokens", "1", "--modes",
            "chain", "--rounds", "2", "--replays", "7"]  # fmt: skip
    assert ab_trees.main(argv) == 0
    assert [c[0] for c in calls] == [work / "base", ab_trees.REPO, ab_trees.REPO, work / "base"]
    assert all(c[1:] == ("chain", "glm5-tp8", "1", 7, 5) for c in calls)
    saved = json.loads((work / "ab.json").read_text())
    assert [r["tree"] for r in saved["runs"]] == ["A", "B", "B", "A"]
    assert saved["report"][0]["ratio"] == pytest.approx(0.9)
    assert "0.900" in capsys.readouterr().out
    monkeypatch.undo()
    assert ab_trees.main(["report", str(work / "ab.json")]) == 0


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["run", "--modes", "chain,x"], "--modes"),
        (["run", "--rounds", "0"], "--rounds"),
        (["prepare", "--base", "main", "--jobs", "0"], "--jobs"),
        (["prepare"], "--base"),
    ],
)
def test_bad_arguments(argv, match, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        ab_trees.main(argv)
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_run_without_a_prepared_base_says_so(tmp_path: Path, capsys) -> None:
    assert ab_trees.main(["run", "--work", str(tmp_path)]) == 2
    assert "prepare --base" in capsys.readouterr().err
