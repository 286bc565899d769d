"""The `mlpjit` CLI in real subprocesses against private caches, with real smoke compiles."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from entries import child_env
from redis_server import PASSWORD, RedisServer, free_port, start_redis, write_key_file

from mlpjit import layer_plan
from mlpjit.cli import MAX_WARM_TOKENS, parse_age, parse_size, parse_tokens
from mlpjit.cli import warm as warm_command
from mlpjit.cli.parser import build_parser
from mlpjit.jit import config
from mlpjit.models import PRESETS

REPO = Path(__file__).resolve().parent.parent
SMOKE = ["--kernel", "smoke", "--param", "n=1024,2048,4096", "--param", "scale=2.0"]
SMOKE += ["--param", "block=128", "--arch", "sm_90a"]
SMOKE_64 = ["--kernel", "smoke", "--param", "n=64", "--param", "block=64"]  # give scale
REMOTE_VARS = ("MLPJIT_REMOTE_CACHE", "MLPJIT_REMOTE_PREFIX", "MLPJIT_REMOTE_TTL")
REMOTE_VARS += ("MLPJIT_REMOTE_TIMEOUT", "MLPJIT_REMOTE_KEY_FILE")


def mlpjit(cache: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m mlpjit ARGS` with MLPJIT_CACHE_DIR=cache; never raises on exit status.

    TMPDIR is a private dir beside the cache (what `cache clear` cleans of compile scratch
    dirs, where compile logs go), so no test touches the machine's /tmp.
    """
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), full.get("PYTHONPATH", "")) if p)
    full["MLPJIT_CACHE_DIR"] = str(cache)
    tmpdir = cache.parent / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    full["TMPDIR"] = str(tmpdir)
    for name in ("MLPJIT_CACHE_PATH", "MLPJIT_ARCH", "MLPJIT_RECORD", *REMOTE_VARS):
        full.pop(name, None)
    full["MLPJIT_KERNEL_MODULES"] = "mlpjit.testing.smoke"  # the tests' cheap kernel
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "mlpjit", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=600,
        check=False,
    )


def ok_json(cache: Path, *args: str) -> dict | list:
    run = mlpjit(cache, *args, "--json")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A cache with three smoke kernels, warmed once per module through the CLI."""
    cache = tmp_path_factory.mktemp("warmed") / "cache"
    run = mlpjit(cache, "warm", *SMOKE, "--json")
    assert run.returncode == 0, run.stderr
    return cache, json.loads(run.stdout)


@pytest.fixture
def cache_copy(warmed: tuple[Path, dict], tmp_path: Path) -> Path:
    """A private copy of the warmed cache for tests that change it."""
    dest = tmp_path / "copy"
    shutil.copytree(warmed[0], dest, symlinks=True)
    return dest


def entry_files(cache: Path) -> dict[str, Path]:
    return {p.stem: p for p in (cache / "v1" / "entries").glob("*/*.cubin")}


# ------------------------------------------------------------------ value parsers


def test_value_parsers() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("500M") == 500 << 20
    assert parse_size("2G") == 2 << 30
    assert parse_size("1.5KiB") == 1536
    assert parse_age("7d") == 7 * 86400
    assert parse_age("12h") == 12 * 3600
    assert parse_age("30m") == 1800
    assert parse_tokens("1-8") == list(range(1, 9))
    assert parse_tokens("1-3,8,2") == [1, 2, 3, 8]
    for bad, parse in (("5X", parse_size), ("-1M", parse_size), ("7y", parse_age)):
        with pytest.raises(ValueError):
            parse(bad)
    for bad in ("0-2", "4-2", "a", ""):
        with pytest.raises(ValueError):
            parse_tokens(bad)
    assert parse_tokens(f"1,{MAX_WARM_TOKENS}") == [1, MAX_WARM_TOKENS]
    for bad in (f"1-{MAX_WARM_TOKENS + 1}", "1-99999999999", "8,99999999999999999999"):
        with pytest.raises(ValueError, match=f"--tokens must be within 1-{MAX_WARM_TOKENS}"):
            parse_tokens(bad)


@pytest.mark.parametrize(
    "size", ["1" + "0" * 400 + "T", "1e400", "9" * 41, "99999999999999999999T"]
)
def test_huge_max_size_is_a_one_line_error(tmp_path: Path, size: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mlpjit", "cache", "prune", "--max-size", size],
        capture_output=True,
        text=True,
        env=child_env(MLPJIT_CACHE_DIR=str(tmp_path / "cache")),
        timeout=60,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "--max-size must" in run.stderr and len(run.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ warm and inspect


def test_warm_then_ls_info_stats_verify_path(warmed: tuple[Path, dict]) -> None:
    cache, summary = warmed
    assert summary["total"] == 3 and summary["compiled"] == 3 and summary["hits"] == 0
    assert summary["arch"] == "sm_90a"
    keys = {e["key"] for e in summary["entries"]}
    assert [e["params"]["n"] for e in summary["entries"]] == [1024, 2048, 4096]

    rows = ok_json(cache, "cache", "ls")
    assert {r["key"] for r in rows} == keys
    assert all(r["kernel"] == "smoke" and r["arch"] == "sm_90a" for r in rows)
    assert all(r["cubin_bytes"] > 0 and r["created"] <= r["last_used"] for r in rows)
    text = mlpjit(cache, "cache", "ls").stdout
    assert all(k[:12] in text for k in keys) and "n=2048" in text

    key = sorted(keys)[0]
    info = ok_json(cache, "cache", "info", key[:10])
    assert info["key"] == key
    assert info["components"]["kernel"] == "smoke"
    assert info["params"] == [{"name": "out", "kind": "ptr"}, {"name": "x", "kind": "ptr"}]
    cubin = next(p for k, p in entry_files(cache).items() if k == key).read_bytes()
    assert info["cubin_sha256"] == hashlib.sha256(cubin).hexdigest()

    stats = ok_json(cache, "cache", "stats")
    assert stats["entries"] == 3
    assert stats["kernels"]["smoke"]["entries"] == 3
    assert stats["bytes"] == sum(r["cubin_bytes"] for r in rows)
    assert stats["quarantined"] == 0 and stats["lock_files"] >= 3

    verify = ok_json(cache, "cache", "verify")
    assert verify == {"checked": 3, "ok": 3, "bad": []}

    path = ok_json(cache, "cache", "path")
    assert Path(path["root"]) == cache.absolute() and path["exists"] and path["layers"] == []


def test_warm_again_is_all_hits(cache_copy: Path) -> None:
    summary = ok_json(cache_copy, "warm", *SMOKE)
    assert summary["total"] == 3 and summary["compiled"] == 0 and summary["hits"] == 3


def test_warm_progress_lines(tmp_path: Path) -> None:
    run = mlpjit(tmp_path / "c", "warm", "--kernel", "smoke", "--param", "n=512", "--param",
                 "scale=1.5", "--param", "block=64", "--arch", "sm_90a")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "[1/1] smoke" in run.stderr and "compiled" in run.stderr
    assert "warmed 1 kernels for sm_90a: 1 compiled" in run.stdout


def test_warm_jobs_compile_each_kernel_once(tmp_path: Path) -> None:
    args = [a.replace("block=128", "block=64") for a in SMOKE]  # distinct from `warmed`
    summary = ok_json(tmp_path / "c", "warm", *args, "--jobs", "2")
    assert summary["jobs"] == 2 and summary["total"] == 3
    assert summary["compiles"] == 3 and summary["compiled"] == 3
    assert len(ok_json(tmp_path / "c", "cache", "ls")) == 3


def test_warm_model_plans_fp8_kernels(tmp_path: Path) -> None:
    plan = ok_json(tmp_path / "c", "warm", "--model", "glm5", "--tp", "8", "--tokens", "1-8",
                   "--layers", "dense", "--arch", "sm_90a", "--dry-run")  # fmt: skip
    assert plan["total"] == 16 and plan["cached"] == 0
    rows = {(e["params"]["rows"], e["params"]["k"]) for e in plan["entries"]}
    assert rows == {(2 * 12288 // 8, 6144), (6144, 12288 // 8)}
    assert not (tmp_path / "c" / "v1" / "entries").exists()  # dry run compiled nothing

    summary = ok_json(tmp_path / "c", "warm", "--model", "glm5", "--tp", "8", "--tokens", "1",
                      "--layers", "dense", "--arch", "sm_90a")  # fmt: skip
    assert summary["total"] == 2 and summary["compiled"] == 2
    assert {e["kernel"] for e in summary["entries"]} == {"fp8_gemv"}
    assert {e["params"]["swiglu"] for e in summary["entries"]} == {True, False}


def _planned(cache: Path, *args: str) -> dict[tuple[int, int], set[int]]:
    """(rows, k) -> token counts of the fp8_gemv kernels a `warm --dry-run` lists."""
    plan = ok_json(cache, "warm", *args, "--arch", "sm_90a", "--dry-run")
    found: dict[tuple[int, int], set[int]] = {}
    for e in plan["entries"]:
        found.setdefault((e["params"]["rows"], e["params"]["k"]), set()).add(e["params"]["tokens"])
    return found


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_warm_model_layers_plan_dense_and_shared_shards(tmp_path: Path, tp: int) -> None:
    """GLM-5's dense layer (12288) and shared expert (2048) both split over --tp: gate_up
    rows 2*intermediate/tp at k hidden, down k intermediate/tp (the kernel takes these)."""
    dense = {(2 * 12288 // tp, 6144), (6144, 12288 // tp)}
    shared = {(2 * 2048 // tp, 6144), (6144, 2048 // tp)}
    c, tokens = tmp_path / "c", ["--model", "glm5", "--tp", str(tp), "--tokens", "1,8"]
    both = _planned(c, *tokens)
    assert set(both) == dense | shared
    assert all(counts == {1, 8} for counts in both.values())
    assert _planned(c, *tokens, "--layers", "shared,dense") == both
    assert set(_planned(c, *tokens, "--layers", "dense")) == dense
    assert set(_planned(c, *tokens, "--layers", " shared ")) == shared


def test_warm_model_aliases_plan_the_same_kernels(tmp_path: Path) -> None:
    """kimi-k2 and deepseek-r1 are deepseek-v3's shapes: the same kernel keys."""

    def keys(model: str) -> list[str]:
        plan = ok_json(tmp_path / "c", "warm", "--model", model, "--tp", "4", "--tokens", "1",
                       "--arch", "sm_90a", "--dry-run")  # fmt: skip
        return [e["key"] for e in plan["entries"]]

    v3 = keys("deepseek-v3")
    assert len(v3) == 4  # dense 7168 x 4608 and shared 7168 x 512 at TP 4, gate_up and down
    assert keys("kimi-k2") == v3 and keys("deepseek-r1") == v3
    assert keys("glm5") != v3


def test_warm_model_without_a_shared_expert_notes_it(tmp_path: Path) -> None:
    """qwen3-8b has no shared expert: the default --layers warms its dense layer with a
    one-line note on stderr; --layers dense asks for nothing else, so no note."""
    args = ["warm", "--model", "qwen3-8b", "--tp", "8", "--tokens", "1", "--arch", "sm_90a"]
    run = mlpjit(tmp_path / "c", *args, "--dry-run", "--json")
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [
        "mlpjit: note: qwen3-8b has no shared expert; warming its dense layers only"
    ]
    rows = {(e["params"]["rows"], e["params"]["k"]) for e in json.loads(run.stdout)["entries"]}
    assert rows == {(2 * 12288 // 8, 4096), (4096, 12288 // 8)}
    run = mlpjit(tmp_path / "c", *args, "--layers", "dense", "--dry-run")
    assert run.returncode == 0 and run.stderr == ""


def test_warm_model_notes_each_layer_kind_on_the_stock_path(tmp_path: Path) -> None:
    """GLM-4.5's shared expert at TP 8 (1536 / 8 = 192 rows, not a multiple of 128) runs
    the stock path: warm says so in one note line and warms the dense layers; at TP 4 both
    layer kinds have kernels and there is no note."""
    args = ["warm", "--model", "glm4.5", "--tokens", "1-8", "--arch", "sm_90a", "--dry-run"]
    run = mlpjit(tmp_path / "c", *args, "--tp", "8", "--json")
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [
        "mlpjit: note: glm4.5 shared expert runs the stock path at tp 8: tp 8 does not "
        "divide intermediate 1536 into multiples of 128 (each rank gets 192)"
    ]
    rows = {(e["params"]["rows"], e["params"]["k"]) for e in json.loads(run.stdout)["entries"]}
    assert rows == {(2 * 12288 // 8, 5120), (5120, 12288 // 8)}
    run = mlpjit(tmp_path / "c", *args, "--tp", "4")
    assert run.returncode == 0 and run.stderr == ""


def test_warm_layers_usage_errors_name_the_option(tmp_path: Path) -> None:
    run = mlpjit(tmp_path / "c", "warm", "--model", "glm5", "--layers", "dense,moe")
    assert run.returncode == 2
    assert "--layers" in run.stderr and "dense and/or shared, got 'dense,moe'" in run.stderr
    run = mlpjit(tmp_path / "c", "warm", "--hidden", "6144", "--intermediate", "1536",
                 "--layers", "shared", "--arch", "sm_90a")  # fmt: skip
    assert run.returncode == 2 and "--layers goes with --model" in run.stderr


def _planner_calls(monkeypatch, *args: str) -> list[tuple[int, int, int]]:
    """(hidden, intermediate, tp) of each call `warm ARGS` makes to dense_mlp_requests,
    which is stubbed: what the CLI asks for, whatever the kernels take."""
    calls: list[tuple[int, int, int]] = []

    def planned(hidden: int, shard: int, m: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(shard=(hidden, shard), params={"tokens": m})

    def fake(hidden: int, intermediate: int, tp: int, tokens, arch: str, **kwargs) -> list:
        calls.append((hidden, intermediate, tp))
        return [planned(hidden, intermediate // tp, m) for m in tokens]

    monkeypatch.setattr(layer_plan, "dense_mlp_requests", fake)
    parsed = build_parser().parse_args(["warm", *args, "--sms", "132"])
    parsed.check(parsed)
    requests = warm_command.warm_requests(parsed, "sm_90a")
    assert requests == [planned(h, i // tp, m) for h, i, tp in calls for m in range(1, 9)]
    return calls


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_warm_model_asks_the_planner_for_each_layer(monkeypatch, name: str, tp: int) -> None:
    preset = PRESETS[name]
    dense = (preset.hidden, preset.intermediate, tp)
    shared = (preset.hidden, preset.shared_intermediate, tp)
    want = [dense, shared] if preset.shared_intermediate else [dense]

    def calls(*layers: str) -> list[tuple[int, int, int]]:
        extra = ["--layers", *layers] if layers else []
        return _planner_calls(monkeypatch, "--model", name, "--tp", str(tp), *extra)

    assert calls() == want
    assert calls("dense") == [dense]
    assert calls("shared,dense") == want
    if preset.shared_intermediate:
        assert calls("shared") == [shared]


def test_warm_model_preset_sizes_reach_the_planner(monkeypatch) -> None:
    """The presets' numbers as config.json gives them, aliases included."""
    assert _planner_calls(monkeypatch, "--model", "kimi-k2", "--tp", "8") == [
        (7168, 18432, 8),
        (7168, 2048, 8),
    ]
    assert _planner_calls(monkeypatch, "--model", "glm4.5", "--tp", "4") == [
        (5120, 12288, 4),
        (5120, 1536, 4),
    ]
    assert _planner_calls(monkeypatch, "--model", "qwen3-32b", "--tp", "8") == [(5120, 25600, 8)]
    assert _planner_calls(monkeypatch, "--hidden", "4096", "--intermediate", "1024") == [
        (4096, 1024, 1)
    ]


def test_warm_sms_plans_for_the_target_gpu(tmp_path: Path) -> None:
    """--sms sizes the persistent grids (an H20 has 78 SMs): the requests say so, the
    132-SM default leaves the parameter out, a bad count is a usage error."""
    h20 = ok_json(tmp_path / "c", "warm", "--model", "glm5", "--tp", "1", "--tokens", "1,8",
                  "--arch", "sm_90a", "--sms", "78", "--dry-run")  # fmt: skip
    assert {e["params"]["sms"] for e in h20["entries"]} == {78}
    default = ok_json(tmp_path / "c", "warm", "--model", "glm5", "--tp", "1", "--tokens", "1,8",
                      "--arch", "sm_90a", "--sms", "132", "--dry-run")  # fmt: skip
    assert all("sms" not in e["params"] for e in default["entries"])
    for bad in ("0", "1", "1025", "9" * 50):  # 1: a ZeroDivisionError in the planner once
        run = mlpjit(tmp_path / "c", "warm", "--model", "glm5", "--arch", "sm_90a", "--sms", bad)
        assert run.returncode == 2 and "--sms must be an integer in [8, 1024]" in run.stderr
    run = mlpjit(tmp_path / "c", "warm", *SMOKE, "--sms", "78", "--dry-run")
    assert run.returncode == 1 and "--sms plans --model/--hidden kernels" in run.stderr


def test_warm_requests_file_with_jobs(tmp_path: Path) -> None:
    """MLPJIT_RECORD-style JSON lines; each line carries its arch, duplicates collapse."""
    lines = [
        {"kernel": "smoke", "params": {"n": 96 * i, "scale": 1.0, "block": 32}, "arch": "sm_90a"}
        for i in (1, 2, 2)
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "\n")
    summary = ok_json(tmp_path / "c", "warm", "--requests", str(path), "--jobs", "2")
    assert summary["arch"] == "sm_90a" and summary["total"] == 2 and summary["compiles"] == 2
    path.write_text('{"kernel": "smoke"}\n')
    run = mlpjit(tmp_path / "c", "warm", "--requests", str(path))
    assert run.returncode == 1 and "not a kernel request line" in run.stderr


def test_warm_arch_from_env_and_missing(tmp_path: Path) -> None:
    plan = mlpjit(tmp_path / "c", "warm", "--model", "glm4.5", "--tp", "8", "--dry-run",
                  "--json", env={"MLPJIT_ARCH": "sm_90a"})  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["arch"] == "sm_90a"
    import torch

    if not torch.cuda.is_available():  # with a GPU its own arch is the default
        run = mlpjit(tmp_path / "c", "warm", "--model", "glm5", "--dry-run")
        assert run.returncode == 1 and "no target arch: pass --arch" in run.stderr


# ------------------------------------------------------------------ verify, prune, clear


def test_verify_finds_and_quarantines_a_corrupt_entry(cache_copy: Path) -> None:
    files = entry_files(cache_copy)
    bad_key = sorted(files)[1]
    data = bytearray(files[bad_key].read_bytes())
    data[len(data) // 2] ^= 0xFF
    files[bad_key].write_bytes(bytes(data))

    run = mlpjit(cache_copy, "cache", "verify", "--json")
    assert run.returncode == 1
    report = json.loads(run.stdout)
    assert report["checked"] == 3 and report["ok"] == 2
    assert [b["key"] for b in report["bad"]] == [bad_key]
    assert report["bad"][0]["action"] == "quarantined"
    assert bad_key not in entry_files(cache_copy)
    assert ok_json(cache_copy, "cache", "stats")["quarantined"] == 1
    assert ok_json(cache_copy, "cache", "verify")["bad"] == []  # the rest is clean


def _age(cache: Path, key: str, seconds: float) -> None:
    """Make ``key`` look last used ``seconds`` ago (manifest field and mtime)."""
    mpath = cache / "v1" / "entries" / key[:2] / f"{key}.json"
    manifest = json.loads(mpath.read_text())
    stamp = time.time() - seconds
    manifest["created"] = manifest["last_used"] = stamp
    mpath.write_text(json.dumps(manifest, sort_keys=True, separators=(",", ":")))
    os.utime(mpath, (stamp, stamp))


def test_prune_by_age_then_size_lru_first(cache_copy: Path) -> None:
    old, older, new = sorted(entry_files(cache_copy))
    _age(cache_copy, older, 10 * 86400)
    _age(cache_copy, old, 3 * 3600)

    report = ok_json(cache_copy, "cache", "prune", "--older-than", "1d")
    assert report["removed"] == [older] and report["remaining_entries"] == 2

    one = ok_json(cache_copy, "cache", "info", new)["cubin_bytes"]
    report = ok_json(cache_copy, "cache", "prune", "--max-size", str(one))
    assert report["removed"] == [old]  # least recently used goes first
    assert report["remaining_bytes"] == one
    assert [r["key"] for r in ok_json(cache_copy, "cache", "ls")] == [new]
    assert ok_json(cache_copy, "cache", "verify")["ok"] == 1


def test_clear_removes_everything(cache_copy: Path) -> None:
    report = ok_json(cache_copy, "cache", "clear")
    assert len(report["removed"]) == 3 and report["busy"] == []
    assert ok_json(cache_copy, "cache", "ls") == []
    assert ok_json(cache_copy, "cache", "stats")["entries"] == 0
    assert set(report["leftovers"]) == {
        "temp_files",
        "orphan_cubins",
        "stale_aliases",
        "stale_locks",
        "scratch_dirs",
    }
    assert list((cache_copy / "v1" / "aliases").iterdir()) == []
    assert list((cache_copy / "v1" / "locks").iterdir()) == []  # lock files went too
    text = mlpjit(cache_copy, "cache", "clear").stdout
    assert text == "removed 0 entries and 0 quarantined; no leftovers removed\n"


def test_prune_and_clear_leave_a_locked_entry_alone(cache_copy: Path) -> None:
    from mlpjit.jit.locks import KeyLock
    from mlpjit.jit.store import CacheStore

    key = sorted(entry_files(cache_copy))[0]
    lock = KeyLock(CacheStore(cache_copy).lock_path(key))
    assert lock.try_acquire()
    try:
        report = ok_json(cache_copy, "cache", "clear")
    finally:
        lock.release()
    assert report["busy"] == [key] and len(report["removed"]) == 2
    assert [r["key"] for r in ok_json(cache_copy, "cache", "ls")] == [key]


# ------------------------------------------------------------------ export / import


def test_export_import_round_trip(warmed: tuple[Path, dict], tmp_path: Path) -> None:
    cache = warmed[0]
    archive = tmp_path / "cache.tar"
    report = ok_json(cache, "cache", "export", str(archive))
    assert report["entries"] == 3 and report["bytes"] == archive.stat().st_size
    again = tmp_path / "again.tar"
    ok_json(cache, "cache", "export", str(again))
    assert again.read_bytes() == archive.read_bytes()  # deterministic

    target = tmp_path / "target"
    report = ok_json(target, "cache", "import", str(archive))
    assert report["counts"] == {"imported": 3, "skipped": 0, "rejected": 0}
    src, dst = entry_files(cache), entry_files(target)
    assert set(src) == set(dst)
    for key in src:
        assert dst[key].read_bytes() == src[key].read_bytes()
        a = json.loads(src[key].with_suffix(".json").read_text())
        b = json.loads(dst[key].with_suffix(".json").read_text())
        for manifest in (a, b):
            del manifest["created"], manifest["last_used"]
        assert a == b
    assert ok_json(target, "cache", "verify")["ok"] == 3
    report = ok_json(target, "cache", "import", str(archive))
    assert report["counts"] == {"imported": 0, "skipped": 3, "rejected": 0}

    # The imported cache serves warm without compiling.
    assert ok_json(target, "warm", *SMOKE)["compiled"] == 0


def _rewrite(archive: Path, out: Path, extra: list[tarfile.TarInfo | tuple]) -> None:
    """Copy ``archive`` to ``out`` and append extra members (TarInfo, optional bytes)."""
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member))
        for info, data in extra:
            dst.addfile(info, io.BytesIO(data) if data is not None else None)


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_import_rejects_malicious_archives(
    warmed: tuple[Path, dict], tmp_path: Path, kind: str
) -> None:
    archive = tmp_path / "good.tar"
    ok_json(warmed[0], "cache", "export", str(archive))
    victim = tmp_path / "victim.txt"
    if kind == "dotdot":
        info = tarfile.TarInfo("entries/../../victim.txt")
    elif kind == "absolute":
        info = tarfile.TarInfo(str(victim))
    else:
        info = tarfile.TarInfo("entries/" + "0" * 64 + ".cubin")
        info.type, info.linkname = tarfile.SYMTYPE, str(victim)
    payload = b"pwned" if kind != "symlink" else None
    if payload is not None:
        info.size = len(payload)
    evil = tmp_path / "evil.tar"
    _rewrite(archive, evil, [(info, payload)])

    target = tmp_path / "target"
    run = mlpjit(target, "cache", "import", str(evil))
    assert run.returncode == 1
    assert "rejected" in run.stderr and "Traceback" not in run.stderr
    assert not victim.exists()
    assert not (target / "v1" / "entries").exists() or not entry_files(target)


def test_import_rejects_hash_mismatch(warmed: tuple[Path, dict], tmp_path: Path) -> None:
    archive = tmp_path / "good.tar"
    ok_json(warmed[0], "cache", "export", str(archive))
    tampered = tmp_path / "tampered.tar"
    with tarfile.open(archive) as src, tarfile.open(tampered, "w") as dst:
        victim = None
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name.endswith(".cubin") and victim is None:
                victim = member.name.split("/")[1].split(".")[0]
                data = data[:-1] + bytes([data[-1] ^ 1])
            dst.addfile(member, io.BytesIO(data))
    target = tmp_path / "target"
    run = mlpjit(target, "cache", "import", str(tampered), "--json")
    assert run.returncode == 1
    report = json.loads(run.stdout)
    assert [r["key"] for r in report["rejected"]] == [victim]
    assert "sha256" in report["rejected"][0]["reason"]
    assert report["counts"]["imported"] == 2
    assert victim not in entry_files(target) and len(entry_files(target)) == 2


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "args",
    [
        ["cache", "prune"],
        ["cache", "prune", "--max-size", "5X"],
        ["cache", "prune", "--older-than", "soon"],
        ["warm"],
        ["warm", "--model", "glm6"],
        ["warm", "--model", "qwen3"],
        ["warm", "--model", "glm5", "--layers", "moe"],
        ["warm", "--model", "glm5", "--layers", ""],
        ["warm", "--model", "glm5", "--layers", "dense,,shared"],
        ["warm", "--hidden", "6144", "--intermediate", "1536", "--layers", "dense"],
        ["warm", "--model", "glm5", "--arch", "hopper"],
        ["cache", "bogus"],
        ["warm", "--model", "glm5", "--tokens", "1-99999999999"],
        ["cache", "push", "xyz"],
        ["cache", "pull", "0" * 65],
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    run = mlpjit(tmp_path / "c", *args)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "usage:" in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.splitlines()) == 1, run.stderr  # message, then where the usage is


def test_huge_token_range_is_refused_at_once(tmp_path: Path) -> None:
    """1-99999999999 once built a list until MemoryError; now the range is checked first."""
    t0 = time.monotonic()
    run = mlpjit(tmp_path / "c", "warm", "--model", "glm5", "--tokens", "1-99999999999")
    assert time.monotonic() - t0 < 60
    assert run.returncode == 2
    assert f"--tokens must be within 1-{MAX_WARM_TOKENS}" in run.stderr
    assert "MemoryError" not in run.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["cache", "info", "abc"], "no cache entry"),
        (["cache", "info", "xyz"], "KEY must be"),
        (["cache", "import", "/nonexistent/archive.tar"], "No such file"),
        (["warm", "--kernel", "nope", "--arch", "sm_90a"], "kernel must be one of"),
        (["warm", "--kernel", "smoke", "--param", "n=3", "--arch", "sm_90a"], "smoke param"),
        (["warm", "--model", "glm5", "--tp", "7", "--arch", "sm_90a"], "tp must divide"),
        (
            ["warm", "--model", "glm5", "--tp", "192", "--layers", "dense", "--arch", "sm_90a"],
            "tp 192 does not divide intermediate 12288 into multiples of",
        ),
        (
            ["warm", "--model", "glm5", "--tp", "96", "--arch", "sm_90a"],
            "tp must divide glm5's shared expert intermediate size 2048, got 96",
        ),
        (
            ["warm", "--model", "qwen3-8b", "--layers", "shared", "--arch", "sm_90a"],
            "qwen3-8b has no shared expert: --layers shared leaves nothing to warm (allowed "
            "for it: dense)",
        ),
        (
            ["warm", "--model", "glm5", "--tokens", "9", "--arch", "sm_90a"],
            "no token count in 9..9 takes the kernel path (1-8)",
        ),
        (
            ["warm", "--hidden", "100", "--intermediate", "100", "--arch", "sm_90a", "--dry-run"],
            "hidden 100 is not a multiple of 128",
        ),
        (
            ["warm", "--model", "glm5", "--arch", "sm_999"],
            "kernel fp8_gemv compiles for sm_90a, not 'sm_999'",
        ),
        (
            ["warm", "--model", "glm5", "--arch", "sm_80", "--dry-run"],
            "kernel fp8_gemv compiles for sm_90a, not 'sm_80'",
        ),
        (
            ["warm", *SMOKE_64, "--param", "scale=1.0", "--arch", "sm_80"],
            "kernel smoke compiles for sm_90, sm_90a,",
        ),
        (["warm", "--from", "/dev/zero"], "request file /dev/zero is not a regular file"),
    ],
)
def test_failures_exit_1_without_traceback(tmp_path: Path, args: list[str], message: str) -> None:
    run = mlpjit(tmp_path / "c", *args)
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert run.stderr.startswith("mlpjit: error:") and message in run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert run.stdout == "" and not (tmp_path / "c" / "v1" / "entries").exists()


def _bad_file(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / kind
    if kind == "random bytes":
        path.write_bytes(hashlib.sha256(b"seed").digest() * 200)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "fifo":
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    elif kind == "oversized":
        with open(path, "wb") as f:
            f.truncate((64 << 20) + 1)  # sparse: no disk used
    elif kind == "not utf-8":
        path.write_bytes(b"\xff\xfe{}\n")
    return path


@pytest.mark.parametrize(
    "command, kind, message",
    [
        ("import", "random bytes", "is not a readable tar archive"),
        ("import", "empty", "is not a readable tar archive"),
        ("warm", "fifo", "is not a regular file"),
        ("warm", "oversized", "more than the 64 MiB a request list may have"),
        ("warm", "not utf-8", ":1: not UTF-8 text"),
        ("warm", "empty", None),
    ],
)
def test_bad_files_are_one_line(tmp_path: Path, command: str, kind: str, message: str) -> None:
    path = _bad_file(tmp_path, kind)
    args = ["cache", "import", str(path)] if command == "import" else ["warm", "--from", str(path)]
    run = mlpjit(tmp_path / "c", *args)
    if message is None:  # an empty request list warms nothing, successfully
        assert run.returncode == 0 and "warmed 0 kernels" in run.stdout, run.stderr
        return
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert run.stderr.startswith("mlpjit: error:") and message in run.stderr
    assert len(run.stderr.splitlines()) == 1, run.stderr


@pytest.mark.parametrize("value", ["abc", "-1", "1e308"])
@pytest.mark.parametrize("command", [["warm", *SMOKE], ["warm", *SMOKE, "--dry-run"], ["doctor"]])
def test_bad_lock_timeout_fails_before_any_work(
    tmp_path: Path, command: list[str], value: str
) -> None:
    run = mlpjit(tmp_path / "c", *command, env={"MLPJIT_LOCK_TIMEOUT": value})
    assert run.returncode == 1, (run.stdout, run.stderr)
    lo, hi = config.LOCK_TIMEOUT_RANGE
    expected = f"MLPJIT_LOCK_TIMEOUT must be a number in [{lo:g}, {hi:g}] (got {value!r})"
    assert run.stderr == f"mlpjit: error: {expected}\n"
    assert run.stdout == "" and not (tmp_path / "c").exists()  # no compile, no cache dir


def test_compile_failure_is_one_line_naming_the_log(tmp_path: Path) -> None:
    """A real compiler failure (scale 1e308 is inf in float32; NVVM rejects the kernel's
    name) once printed pages: now one error line and the log file that has it all."""
    run = mlpjit(tmp_path / "c", "warm", *SMOKE_64, "--param", "scale=1e308", "--arch", "sm_90a")
    assert run.returncode == 1, (run.stdout, run.stderr)
    errors = [line for line in run.stderr.splitlines() if line.startswith("mlpjit: error:")]
    assert len(errors) == 1 and "Traceback" not in run.stderr
    assert "compiling smoke " in errors[0] and " for sm_90a failed: " in errors[0]
    assert "NVVM backend compilation failed" in errors[0]
    (log,) = (tmp_path / "tmpdir").glob("mlpjit-compile-*.log")
    assert errors[0].endswith(f"(full log: {log})")
    assert "Invalid identifier name" in log.read_text()
    # Besides the error, only CuTe DSL's warning about the float, as one line of its own.
    others = [line for line in run.stderr.splitlines() if line not in errors]
    assert len(others) <= 1 and all("TYPE_FLOAT_LITERAL_OVERFLOW" in line for line in others)


def test_unsafe_cache_dir_is_a_clear_error(tmp_path: Path) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    run = mlpjit(cache, "cache", "ls")
    assert run.returncode == 1
    assert "writable by group or other" in run.stderr and "Traceback" not in run.stderr


def test_record_then_warm_from_replays_into_a_fresh_cache(tmp_path: Path) -> None:
    """MLPJIT_RECORD written by one process is what `warm --from` compiles elsewhere."""
    record = tmp_path / "needed.jsonl"
    first = mlpjit(tmp_path / "a", "warm", *SMOKE, env={"MLPJIT_RECORD": str(record)})
    assert first.returncode == 0, first.stderr
    assert len(record.read_text().splitlines()) == 3
    summary = ok_json(tmp_path / "b", "warm", "--from", str(record))
    assert summary["total"] == 3 and summary["compiles"] == 3
    keys_a = {e["key"] for e in ok_json(tmp_path / "a", "cache", "ls")}
    keys_b = {e["key"] for e in ok_json(tmp_path / "b", "cache", "ls")}
    assert keys_a == keys_b and len(keys_b) == 3


def test_doctor_fails_on_a_group_writable_cache(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    good = mlpjit(cache, "doctor", "--json")
    assert good.returncode == 0, good.stdout + good.stderr
    assert json.loads(good.stdout)["status"] in ("ok", "warn")
    cache.mkdir(exist_ok=True)
    cache.chmod(0o777)
    bad = mlpjit(cache, "doctor", "--json")
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["status"] == "fail"


# ------------------------------------------------------------------ the fleet cache


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server (tests/redis_server.py) that wants PASSWORD, killed at teardown."""
    server = start_redis(tmp_path / "redis", password=PASSWORD)
    yield server
    server.kill()


def test_push_pull_stats_and_doctor_through_redis(
    cache_copy: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    key_file = str(write_key_file(tmp_path / "fleet.key"))
    fleet = {"MLPJIT_REMOTE_CACHE": redis_server.url(), "MLPJIT_REMOTE_KEY_FILE": key_file}
    keys = sorted(entry_files(cache_copy))
    pushed = mlpjit(cache_copy, "cache", "push", "--json", env=fleet)
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["pushed"] == keys
    again = mlpjit(cache_copy, "cache", "push", env=fleet)
    assert again.returncode == 0 and "pushed 0, already there 3" in again.stdout
    assert PASSWORD not in again.stdout + again.stderr

    node = tmp_path / "node-b"  # a fresh node: one entry by prefix, then the rest
    first = mlpjit(node, "cache", "pull", keys[0][:10], "--json", env=fleet)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["pulled"] == [keys[0]]
    rest = mlpjit(node, "cache", "pull", env=fleet)
    assert rest.returncode == 0, rest.stderr
    assert "pulled 2, skipped 1, rejected 0, missing 0" in rest.stdout
    assert ok_json(node, "cache", "verify")["ok"] == 3
    assert ok_json(node, "warm", *SMOKE)["compiled"] == 0  # served from the pulled entries

    stats = mlpjit(node, "cache", "stats", "--json", env=fleet)
    assert stats.returncode == 0, stats.stderr
    remote = json.loads(stats.stdout)["remote"]
    assert remote["entries"] == 3 and remote["fleet"] == {"hits": 3, "rejected": 0, "uploads": 3}
    text = mlpjit(node, "cache", "stats", env=fleet).stdout
    assert "3 entries; fleet-wide 3 hits, 0 rejected, 3 uploads" in text
    assert "remote" not in ok_json(node, "cache", "stats")  # unset: local stats only

    doctor = mlpjit(node, "doctor", "--json", env=fleet)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    check = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}["remote"]
    assert check["status"] == "ok" and check["details"]["entries"] == 3


def test_warm_fetches_from_and_uploads_to_the_fleet_cache_when_it_is_set(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """docs/SERVER.md: with MLPJIT_REMOTE_CACHE set, `mlpjit warm` uploads what it compiles
    and fetches what the fleet has; without it, it fills the local cache only."""
    fleet = {"MLPJIT_REMOTE_CACHE": redis_server.url()}
    alone = mlpjit(tmp_path / "alone", "warm", *SMOKE, "--json")  # the variable unset
    assert alone.returncode == 0 and json.loads(alone.stdout)["compiled"] == 3, alone.stderr
    assert "remote" not in ok_json(tmp_path / "alone", "cache", "stats")
    first = mlpjit(tmp_path / "a", "warm", *SMOKE, "--json", env=fleet)
    assert first.returncode == 0 and json.loads(first.stdout)["compiled"] == 3, first.stderr
    stats = mlpjit(tmp_path / "a", "cache", "stats", "--json", env=fleet)
    assert json.loads(stats.stdout)["remote"]["fleet"]["uploads"] == 3, stats.stderr
    fresh = mlpjit(tmp_path / "b", "warm", *SMOKE, "--json", env=fleet)  # another node
    assert fresh.returncode == 0 and json.loads(fresh.stdout)["compiled"] == 0, fresh.stderr
    assert sorted(entry_files(tmp_path / "b")) == sorted(entry_files(tmp_path / "a"))


def test_pull_exits_1_on_a_rejected_or_missing_entry(
    cache_copy: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    fleet = {"MLPJIT_REMOTE_CACHE": redis_server.url()}
    keys = sorted(entry_files(cache_copy))
    assert mlpjit(cache_copy, "cache", "push", env=fleet).returncode == 0
    redis_server.client().hset(f"mlpjit:entry:{keys[1]}", "cubin", b"\x7fELF poisoned")
    run = mlpjit(tmp_path / "node-b", "cache", "pull", env=fleet)
    assert run.returncode == 1, run.stderr
    assert f"{keys[1][:12]}: REJECTED: cubin has" in run.stdout
    assert "pulled 2, skipped 0, rejected 1, missing 0" in run.stdout
    assert keys[1] not in entry_files(tmp_path / "node-b")
    stats = json.loads(mlpjit(cache_copy, "cache", "stats", "--json", env=fleet).stdout)
    assert stats["remote"]["fleet"]["rejected"] == 1
    # The rejected entry was deleted from Redis: a push puts the good one back.
    assert "pushed 1, already there 2" in mlpjit(cache_copy, "cache", "push", env=fleet).stdout
    unmatched = next(p for p in ("0" * 8, "f" * 8) if not any(k.startswith(p) for k in keys))
    for command in ("push", "pull"):
        run = mlpjit(cache_copy, "cache", command, unmatched, env=fleet)
        assert run.returncode == 1 and f"{unmatched}: missing" in run.stdout, run.stdout


BAD_REMOTE_URLS = {  # case -> an MLPJIT_REMOTE_CACHE that cannot be used
    "tls-option-without-tls": "redis://127.0.0.1:6379/0?ssl_ca_certs=/etc/ca.pem",
    "unknown-option": "redis://127.0.0.1:6379/0?no_such_option=1",
    "100-kB-host": "redis://" + "a" * 100_000 + ":6379/0",
    "bidi-control": "redis://cache\u202e.internal:6379/0",
}


@pytest.mark.parametrize("case", sorted(BAD_REMOTE_URLS))
def test_a_bad_remote_url_is_a_warning_for_warm_and_an_error_for_fleet_commands(
    tmp_path: Path, case: str
) -> None:
    """Where the fleet is optional (warm) a bad URL is one warning and the local cache
    only; the fleet commands fail with one line naming the variable."""
    env = {"MLPJIT_REMOTE_CACHE": BAD_REMOTE_URLS[case]}
    cache = tmp_path / "cache"
    warm = mlpjit(cache, "warm", *SMOKE[:3], "n=1024", *SMOKE[4:], env=env)
    assert warm.returncode == 0, warm.stderr[-2000:]
    warned = [line for line in warm.stderr.splitlines() if "MLPJIT_REMOTE_CACHE" in line]
    assert len(warned) == 1 and "local cache only" in warned[0], warm.stderr[-2000:]
    assert "Traceback" not in warm.stderr and len(warned[0]) < 600
    for command in (["cache", "push"], ["cache", "pull"], ["cache", "stats"]):
        run = mlpjit(cache, *command, env=env)
        assert run.returncode == 1, (command, run.stdout, run.stderr[-2000:])
        assert run.stderr.startswith("mlpjit: error: MLPJIT_REMOTE_CACHE"), run.stderr[-2000:]
        assert len(run.stderr.splitlines()) == 1 and len(run.stderr) < 600


@pytest.mark.parametrize("case", ["unset", "unreachable", "wrong-password", "bad-ttl"])
def test_push_and_pull_without_a_usable_remote_are_one_line_errors(
    cache_copy: Path, redis_server: RedisServer, case: str
) -> None:
    env = {
        "unset": {},
        "unreachable": {"MLPJIT_REMOTE_CACHE": f"redis://127.0.0.1:{free_port()}/0"},
        "wrong-password": {"MLPJIT_REMOTE_CACHE": redis_server.url(password="wrong-pass")},
        "bad-ttl": {"MLPJIT_REMOTE_CACHE": redis_server.url(), "MLPJIT_REMOTE_TTL": "a day"},
    }[case]
    expected = {
        "unset": "MLPJIT_REMOTE_CACHE is not set",
        "unreachable": "is not usable: ConnectionError",
        "wrong-password": "check the user and password in MLPJIT_REMOTE_CACHE",
        "bad-ttl": "MLPJIT_REMOTE_TTL must be a number",
    }[case]
    for command in ("push", "pull"):
        run = mlpjit(cache_copy, "cache", command, env=env)
        assert run.returncode == 1, (run.stdout, run.stderr)
        assert run.stderr.startswith("mlpjit: error:") and expected in run.stderr, run.stderr
        assert len(run.stderr.splitlines()) == 1 and run.stdout == "", run.stderr
        assert "wrong-pass" not in run.stderr and PASSWORD not in run.stderr
    if case in ("unreachable", "wrong-password"):  # stats and doctor still report the rest
        stats = mlpjit(cache_copy, "cache", "stats", env=env)
        assert stats.returncode == 0 and "not usable" in stats.stdout, stats.stderr
        doctor = mlpjit(cache_copy, "doctor", env=env)
        assert doctor.returncode == 0 and "[warn] remote:" in doctor.stdout, doctor.stdout


# ------------------------------------------------------------------ readable output


def _fp8_cache(tmp_path: Path) -> tuple[Path, dict[tuple[str, int], str]]:
    """A cache of hand-made fp8_gemv entries (no compile): GLM-5's dense layer at TP 8,
    gate_up and down at 1 and 8 tokens. Returns it and {(half, tokens): key}."""
    from entries import made

    import mlpjit.kernels  # noqa: F401 (registers fp8_gemv)
    from mlpjit.jit.key import cache_key, key_components
    from mlpjit.jit.store import CacheStore

    cache = tmp_path / "fp8"
    store = CacheStore(root=cache, read_only=())
    keys = {}
    for i, r in enumerate(layer_plan.dense_mlp_requests(6144, 12288, 8, [1, 8], "sm_90a")):
        components = key_components(r.spec, dict(r.params), r.arch)
        key = cache_key(components)
        assert store.publish(key, components, made(i)[2], 0.1).persisted
        keys["gate_up" if r.params["swiglu"] else "down", r.params["tokens"]] = key
    return cache, keys


def test_ls_names_the_layers_of_streamed_down_projections(tmp_path: Path) -> None:
    """Qwen3-14B TP 2's down runs on fp8_stream: ls shows its layer and shape like fp8_gemv's."""
    from entries import made

    from mlpjit import kernels  # noqa: F401 (registers the kernels; `mlpjit` is the CLI here)
    from mlpjit.jit.key import cache_key, key_components
    from mlpjit.jit.store import CacheStore

    cache = tmp_path / "stream"
    store = CacheStore(root=cache, read_only=())
    for i, r in enumerate(layer_plan.dense_mlp_requests(5120, 17408, 2, [1], "sm_90a")):
        components = key_components(r.spec, dict(r.params), r.arch)
        assert store.publish(cache_key(components), components, made(i)[2], 0.1).persisted
    lines = [line.split() for line in mlpjit(cache, "cache", "ls").stdout.splitlines()[1:3]]
    assert [line[1:7] for line in lines] == [
        ["fp8_gemv", "qwen3-14b", "dense", "tp2", "gate_up", "17408x5120"],
        ["fp8_stream", "qwen3-14b", "dense", "tp2", "down", "5120x8704"],
    ]  # fmt: skip
    rows = ok_json(cache, "cache", "ls", "--half", "down", "--model", "qwen3-14b")
    assert [r["kernel"] for r in rows] == ["fp8_stream"]


def test_ls_shows_what_each_entry_serves_and_filters(tmp_path: Path) -> None:
    cache, keys = _fp8_cache(tmp_path)
    text = mlpjit(cache, "cache", "ls").stdout.splitlines()
    assert text[0].split() == ["KEY", "KERNEL", "SERVES", "SHAPE", "TOKENS", "SIZE", "USED"]
    assert text[1].split()[:7] == [keys["down", 1][:12], "fp8_gemv", "glm5", "dense", "tp8",
                                   "down", "6144x1536"]  # fmt: skip
    assert [line.split()[0] for line in text[1:5]] == [
        keys[half, m][:12] for half in ("down", "gate_up") for m in (1, 8)
    ]  # by layer, half and tokens, not by key
    assert text[-1] == "4 entries, 304 B"  # hand-made cubins of 76 bytes
    assert max(len(line) for line in text) <= 100

    rows = ok_json(cache, "cache", "ls", "--half", "down")
    assert {r["key"] for r in rows} == {keys["down", 1], keys["down", 8]}
    assert all(r["serves"] == ["glm5 dense tp8 down"] for r in rows)
    assert all(isinstance(r["created"], float) and r["params"]["k"] == 1536 for r in rows)
    assert len(ok_json(cache, "cache", "ls", "--model", "glm5", "--tp", "8")) == 4
    assert ok_json(cache, "cache", "ls", "--model", "qwen3-8b") == []
    assert ok_json(cache, "cache", "ls", "--tp", "4") == []
    assert [r["key"] for r in ok_json(cache, "cache", "ls", keys["gate_up", 8][:6])] == [
        keys["gate_up", 8]
    ]
    assert mlpjit(cache, "cache", "ls", "--kernel", "smoke").stdout == "(no entries)\n"


def test_info_shows_times_and_sizes_for_people(tmp_path: Path) -> None:
    cache, keys = _fp8_cache(tmp_path)
    lines = mlpjit(cache, "cache", "info", keys["down", 8][:8]).stdout.splitlines()
    assert lines[:2] == [f"key: {keys['down', 8]}", "serves: glm5 dense tp8 down"]
    created = next(line for line in lines if line.startswith("created: "))
    assert created.endswith("s ago)") and created[9:13].isdigit()  # 2026-... (0s ago)
    assert any(line.endswith(" B") and line.startswith("cubin_bytes: ") for line in lines)
    info = ok_json(cache, "cache", "info", keys["down", 8])
    assert isinstance(info["created"], float) and isinstance(info["cubin_bytes"], int)


def test_json_errors_are_objects_on_stdout(tmp_path: Path) -> None:
    run = mlpjit(tmp_path / "c", "warm", "--model", "glm5", "--tp", "7", "--arch", "sm_90a",
                 "--json")  # fmt: skip
    assert run.returncode == 1
    error = json.loads(run.stdout)
    assert error["exit_status"] == 1 and error["error"]["type"] == "UsageError"
    assert error["error"]["argument"] == "--tp" and error["error"]["value"] == 7
    assert "tp must divide glm5's dense MLP" in error["error"]["message"]
    assert run.stderr.startswith("mlpjit: error: tp must divide") and "Traceback" not in run.stderr

    run = mlpjit(tmp_path / "c", "cache", "info", "0" * 12, "--json")
    assert run.returncode == 1
    error = json.loads(run.stdout)["error"]
    assert error["argument"] == "KEY" and "no cache entry" in error["message"]

    run = mlpjit(tmp_path / "c", "warm", "--model", "glm5", "--tokens", "0", "--json")
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert json.loads(run.stdout) == {
        "error": {"type": "usage", "message": run.stderr.split("error: ", 1)[1].strip()},
        "exit_status": 2,
    }


def test_a_bug_keeps_its_traceback(monkeypatch, capsys) -> None:
    from mlpjit.cli import cache as cache_command
    from mlpjit.cli import main

    def broken(args) -> int:
        raise KeyError("internal")

    monkeypatch.setattr(cache_command, "_path", broken)
    assert main(["cache", "path", "--json"]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" in err and "KeyError: 'internal'" in err
    assert err.rstrip().endswith("this is a bug, please report it with the traceback above")
    assert json.loads(out)["error"]["type"] == "KeyError"


def test_version_and_help_import_neither_torch_nor_cutlass() -> None:
    code = (
        "import contextlib, io, sys\n"
        "from mlpjit.cli import main\n"
        "for argv in (['--version'], ['--help'], ['warm', '--help'], ['cache', 'ls', '--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cutlass')))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env(), timeout=120, check=True)  # fmt: skip
    assert run.stdout.strip() == "[]", run.stderr
    version = mlpjit(REPO / "unused", "--version")
    assert version.returncode == 0 and version.stdout == "mlpjit 0.1.0\n"


def test_help_shows_the_defaults(tmp_path: Path) -> None:
    text = " ".join(mlpjit(tmp_path / "c", "warm", "--help").stdout.split())
    assert "default 1-8" in text and "(default 1;" in text
    assert "default: half the CPUs, at most 8" in text
    assert "(default: on, as DenseMlp;" in text


@pytest.mark.parametrize("cpus, jobs", [(None, 1), (1, 1), (2, 1), (6, 3), (64, 8)])
def test_default_jobs_follow_the_cpu_count(monkeypatch, cpus, jobs: int) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert warm_command.default_jobs() == jobs


def test_warm_says_when_tp_is_the_default(tmp_path: Path) -> None:
    args = ["warm", "--model", "glm5", "--tokens", "1", "--arch", "sm_90a", "--dry-run"]
    run = mlpjit(tmp_path / "c", *args)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == (
        "4 kernels for sm_90a at tp 1 (the default; pass --tp), 0 already cached"
    )
    assert ok_json(tmp_path / "c", *args)["tp"] == 1
    explicit = mlpjit(tmp_path / "c", *args, "--tp", "1").stdout.splitlines()[-1]
    assert explicit == "4 kernels for sm_90a at tp 1, 0 already cached"


def test_export_a_subset_to_stdout_and_import_from_stdin(
    warmed: tuple[Path, dict], tmp_path: Path
) -> None:
    cache, summary = warmed
    key = summary["entries"][1]["key"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLPJIT_CACHE_DIR": str(cache)}
    env["MLPJIT_KERNEL_MODULES"] = "mlpjit.testing.smoke"
    export = subprocess.run([sys.executable, "-m", "mlpjit", "cache", "export", "-", key[:8]],
                            capture_output=True, env=env, timeout=120, check=False)  # fmt: skip
    assert export.returncode == 0, export.stderr
    assert b"exported 1 entries to -" in export.stderr
    with tarfile.open(fileobj=io.BytesIO(export.stdout)) as tar:
        assert f"entries/{key}.cubin" in tar.getnames()

    env["MLPJIT_CACHE_DIR"] = str(tmp_path / "other")
    imported = subprocess.run([sys.executable, "-m", "mlpjit", "cache", "import", "-", "--json"],
                              input=export.stdout, capture_output=True, env=env, timeout=120,
                              check=False)  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["imported"] == [key]


@pytest.mark.parametrize("name", ["out.tar.gz", "out.tgz", "out.tar.xz", "out.tar.bz2"])
def test_a_compressed_archive_name_compresses(warmed: tuple[Path, dict], tmp_path: Path, name):
    cache = warmed[0]
    report = ok_json(cache, "cache", "export", str(tmp_path / name))
    assert report["entries"] == 3 and report["bytes"] == (tmp_path / name).stat().st_size
    with tarfile.open(tmp_path / name) as tar:  # "r:*" reads any of them
        assert "mlpjit-archive.json" in tar.getnames()
    imported = ok_json(tmp_path / "target", "cache", "import", str(tmp_path / name))
    assert imported["counts"] == {"imported": 3, "skipped": 0, "rejected": 0}


def test_a_compressed_archive_imports_from_stdin(warmed: tuple[Path, dict], tmp_path: Path):
    ok_json(warmed[0], "cache", "export", str(tmp_path / "a.tar.xz"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLPJIT_CACHE_DIR": str(tmp_path / "other")}
    imported = subprocess.run([sys.executable, "-m", "mlpjit", "cache", "import", "-", "--json"],
                              input=(tmp_path / "a.tar.xz").read_bytes(), capture_output=True,
                              env=env, timeout=120, check=False)  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["counts"]["imported"] == 3


@pytest.mark.parametrize("name", ["out.tar.zst", "out.zip"])
def test_a_compression_export_does_not_write_is_refused(
    warmed: tuple[Path, dict], tmp_path: Path, name: str
):
    run = mlpjit(warmed[0], "cache", "export", str(tmp_path / name))
    assert run.returncode == 1 and "does not write" in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / name).exists()


def test_a_truncated_compressed_archive_is_one_line(warmed: tuple[Path, dict], tmp_path: Path):
    ok_json(warmed[0], "cache", "export", str(tmp_path / "a.tar.gz"))
    data = (tmp_path / "a.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(data[: len(data) // 2])
    run = mlpjit(tmp_path / "target", "cache", "import", str(tmp_path / "cut.tar.gz"))
    assert run.returncode != 0 and "corrupt or truncated" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_export_wheel_writes_a_wheel_of_the_selected_entries(
    warmed: tuple[Path, dict], tmp_path: Path
) -> None:
    cache, summary = warmed
    key = summary["entries"][0]["key"]
    args = ["cache", "export", "--wheel", str(tmp_path / "dist"), key[:8]]
    report = ok_json(cache, *args, "--name", "mlpjit-cubins-one", "--version", "2.0")
    assert (report["entries"], report["name"], report["version"]) == (1, "mlpjit-cubins-one", "2.0")
    assert Path(report["path"]).name == "mlpjit_cubins_one-2.0-py3-none-any.whl"
    text = mlpjit(cache, *args).stdout
    assert "entries" in text and "pip install" in text


@pytest.mark.parametrize(
    "args, status, message",
    [
        (["out.tar", "--name", "mlpjit-cubins-x"], 2, "--name goes with --wheel"),
        ([], 2, "cache export needs FILE (or --wheel DIR)"),
        (["--wheel", "d", "--version", "v1"], 2, "normalized PEP 440"),
        (["--wheel", "d", "--name", "torch"], 2, "must start with 'mlpjit-cubins'"),
        (["--wheel", "d", "--model", "glm5"], 1, "the filters select no entries"),
    ],
)
def test_export_wheel_usage_errors_are_one_line(
    warmed: tuple[Path, dict], tmp_path: Path, args: list[str], status: int, message: str
) -> None:
    args = [str(tmp_path / "d") if a == "d" else a for a in args]
    run = mlpjit(warmed[0], "cache", "export", *args)
    assert run.returncode == status and message in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "d").exists()
