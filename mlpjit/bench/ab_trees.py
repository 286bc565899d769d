"""DenseMlp before and after a change: two source trees timed alternately in one GPU run
(scripts/ab_dense_mlp.py).

A change to a plan or a kernel is judged by the layer time through DenseMlp with and
without it, measured side by side on one warm GPU: the base tree (a git revision, exported
with ``git archive``) and this checkout, alternating A B B A back to back and B A A B with a
server's norm between the layers, so neither gains from its place in the run.

``prepare`` (a CPU machine): exports the base revision's ``mlpjit/`` and ``scripts/`` into
the work folder and compiles both trees' kernels for the shapes into one cache, each tree
with its own source (their keys differ where the kernel source or the plan differs).
``run`` (the GPU machine, from that cache): runs bench_dense_mlp.py of each tree in turn and
writes every run into one JSON. ``report``: each tree's mean per (mode, shape, tokens), the
ratio after / before and the spread of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

BASE = "A"  # the base revision's tree
HEAD = "B"  # this checkout
MODES = ("chain", "norm")
REPO = Path(__file__).resolve().parents[2]


def run_order(rounds: int) -> list[tuple[str, int, str]]:
    """(mode, round, tree) in the order they run: back to back A B, B A, A B ... (each pair
    of rounds A B B A), then with the norm the mirror image (B A A B ...)."""
    out = []
    for mode, first in ((MODES[0], (BASE, HEAD)), (MODES[1], (HEAD, BASE))):
        for r in range(1, rounds + 1):
            order = first if r % 2 else first[::-1]
            out += [(mode, r, tree) for tree in order]
    return out


def export_base(rev: str, dest: Path, repo: Path = REPO) -> Path:
    """``rev``'s mlpjit/ and scripts/ under ``dest`` (emptied first); ValueError naming the
    revision if git cannot read it."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tempfile.TemporaryFile() as tar:
        done = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", rev, "mlpjit", "scripts"],
            stdout=tar,
            stderr=subprocess.PIPE,
            text=False,
        )
        if done.returncode:
            raise ValueError(f"--base: git cannot export {rev!r}: {done.stderr.decode().strip()}")
        tar.seek(0)
        with tarfile.open(fileobj=tar) as archive:
            archive.extractall(dest, filter="data")
    return dest


def tree_env(tree: Path, cache: Path | None = None) -> dict[str, str]:
    """The environment that runs ``tree``'s mlpjit: first on PYTHONPATH (any carried site
    folder after it), and the cache if given."""
    env = dict(os.environ)
    rest = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), rest) if p)
    if cache is not None:
        env["MLPJIT_CACHE_DIR"] = str(cache)
    return env


def warm_tree(tree: Path, shapes: str, tokens: str, cache: Path, arch: str, jobs: int) -> None:
    """Compile ``tree``'s DenseMlp kernels for the shapes and token counts into ``cache``,
    with that tree's own source: its ``mlpjit warm`` per layer (the requests DenseMlp's
    prepare makes)."""
    from mlpjit.testing.layers import layer_shapes

    env = tree_env(tree, cache)
    env["CUTE_DSL_ARCH"] = arch
    for hidden, inter in layer_shapes(shapes.split(",")).values():
        warm = [
            "warm", "--hidden", str(hidden), "--intermediate", str(inter), "--tp", "1",
            "--tokens", tokens, "--arch", arch, "--jobs", str(jobs),
        ]  # fmt: skip
        subprocess.run([sys.executable, "-m", "mlpjit", *warm], env=env, cwd=tree, check=True)


def run_bench(
    tree: Path,
    cache: Path,
    mode: str,
    shapes: str,
    tokens: str,
    replays: int,
    warmup: int,
    out: Path,
) -> dict:
    """One bench_dense_mlp.py run of ``tree`` from ``cache`` (mlpjit only); its JSON."""
    argv = [
        sys.executable, str(tree / "scripts" / "bench_dense_mlp.py"), "--shapes", shapes,
        "--tokens", tokens, "--methods", "mlpjit", "--replays", str(replays),
        "--warmup", str(warmup), "--json", str(out),
    ]  # fmt: skip
    if mode == "norm":
        argv.append("--norm-between")
    subprocess.run(argv, env=tree_env(tree, cache), cwd=tree, check=True)
    return json.loads(out.read_text())


def report(runs: Sequence[dict]) -> list[dict]:
    """Per (mode, shape, tokens): each tree's mean over its rounds, B / A, and the largest
    spread of a tree's rounds (max / min - 1)."""
    times: dict[tuple, dict[str, list[float]]] = {}
    for run in runs:
        for row in run["results"]:
            key = (run["mode"], row["shape"], row["tokens"])
            times.setdefault(key, {BASE: [], HEAD: []})[run["tree"]].append(row["mlpjit_us"])
    rows = []
    for (mode, shape, tokens), by_tree in times.items():
        if not by_tree[BASE] or not by_tree[HEAD]:
            continue
        a, b = statistics.mean(by_tree[BASE]), statistics.mean(by_tree[HEAD])
        spread = max(max(v) / min(v) - 1 for v in by_tree.values())
        rows.append(
            {"mode": mode, "shape": shape, "tokens": tokens, "before_us": a, "after_us": b,
             "ratio": b / a, "round_spread": spread}
        )  # fmt: skip
    return rows


def markdown(rows: Sequence[dict]) -> str:
    lines = [
        "| mode | shape | tokens | before us | after us | after / before | rounds' spread |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['mode']} | {r['shape']} | {r['tokens']} | {r['before_us']:.2f} | "
        f"{r['after_us']:.2f} | {r['ratio']:.3f} | {100 * r['round_spread']:.1f}% |"
        for r in rows
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None, description: str | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--work",
        type=Path,
        default=REPO / ".gpu-cache" / "ab",
        help="work folder: the base tree (base/) and the cache (cache/)",
    )
    common.add_argument(
        "--shapes", default="glm5-tp8,glm4.5-tp8", help="bench_dense_mlp.py's --shapes"
    )
    common.add_argument("--tokens", default="1,8", help="bench_dense_mlp.py's --tokens")
    prep = sub.add_parser("prepare", parents=[common], help="export the base, warm both trees")
    prep.add_argument("--base", required=True, help="the git revision to compare against")
    prep.add_argument("--arch", default="sm_90a")
    prep.add_argument("--jobs", type=int, default=2)
    run = sub.add_parser("run", parents=[common], help="time both trees alternately (GPU)")
    run.add_argument("--rounds", type=int, default=2, help="rounds per tree and mode (>= 1)")
    run.add_argument(
        "--modes",
        default="chain,norm",
        help="back to back (chain) and/or with a norm between the layers (norm)",
    )
    run.add_argument("--replays", type=int, default=30)
    run.add_argument("--warmup", type=int, default=5)
    run.add_argument("--json", type=Path, help="every run and the report (default: in --work)")
    rep = sub.add_parser("report", help="the table of a run's JSON")
    rep.add_argument("json", type=Path)
    args = p.parse_args(argv)
    if args.command == "run":
        args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not args.mode_list or any(m not in MODES for m in args.mode_list):
            p.error(f"--modes must be a comma list of {', '.join(MODES)}, got {args.modes!r}")
        if args.rounds < 1 or args.replays < 1 or args.warmup < 0:
            p.error("--rounds and --replays must be >= 1 and --warmup >= 0")
    if args.command == "prepare" and args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    return args


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    args = parse_args(argv, description)
    if args.command == "report":
        print(markdown(report(json.loads(args.json.read_text())["runs"])))
        return 0
    base, cache = args.work / "base", args.work / "cache"
    if args.command == "prepare":
        try:
            export_base(args.base, base)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for tree in (base, REPO):
            print(f"warming {tree} ...", flush=True)
            warm_tree(tree, args.shapes, args.tokens, cache, args.arch, args.jobs)
        print(f"ready: carry {args.work} (or its tarball) and run `... run` on the GPU")
        return 0
    if not (base / "scripts" / "bench_dense_mlp.py").is_file():
        print(f"error: no base tree in {base}: run `prepare --base REV` first", file=sys.stderr)
        return 2
    trees = {BASE: base, HEAD: REPO}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode, r, tree in run_order(args.rounds):
            if mode not in args.mode_list:
                continue
            print(f"{mode} round {r}: tree {tree}", flush=True)
            out = Path(tmp) / f"{mode}_{r}_{tree}.json"
            result = run_bench(
                trees[tree], cache, mode, args.shapes, args.tokens, args.replays, args.warmup, out
            )
            runs.append({"mode": mode, "round": r, "tree": tree, **result})
    rows = report(runs)
    path = args.json or args.work / "ab.json"
    path.write_text(json.dumps({"runs": runs, "report": rows}, indent=1))
    print(markdown(rows))
    print(f"json: {path}")
    return 0
