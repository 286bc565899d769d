#!/usr/bin/env python3
"""Compare the machine code of two compile caches, kernel by kernel.

Pairs the entries of cache A and cache B by (kernel, compile parameters, arch), whatever
their keys, and compares each pair's SASS (`cuobjdump -sass`, the kernel symbol name
aside) and resource usage (registers, shared/local memory, stack: `cuobjdump -res-usage`).
Use it to show that a refactor left the generated code alone:

    MLPJIT_CACHE_DIR=/tmp/before mlpjit warm --from requests.jsonl --arch sm_90a   # old tree
    MLPJIT_CACHE_DIR=/tmp/after  mlpjit warm --from requests.jsonl --arch sm_90a   # new tree
    python3 scripts/compare_sass.py /tmp/before /tmp/after [--json report.json]

Exit status 0 when every pair matches and every entry has a partner, else 1.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from mlpjit.jit.store import CacheStore
from mlpjit.testing.cubin_info import find_cuobjdump


def _entries(root: Path) -> dict[str, tuple[str, bytes]]:
    """(kernel, params, arch) as canonical JSON -> (symbol, cubin) for every entry."""
    store = CacheStore(root, read_only=())
    found = {}
    for key, _manifest in store.iter_manifests():
        entry = store.lookup(key)
        if entry is None:
            raise SystemExit(f"{root}: entry {key[:12]} fails verification")
        c = entry.manifest["components"]
        ident = json.dumps([c["kernel"], c["params"], c["arch"]], sort_keys=True)
        found[ident] = (entry.manifest["symbol"], entry.cubin)
    return found


def _machine_code(tool: str, symbol: str, cubin: bytes) -> tuple[str, str]:
    """(SASS without symbol names and addresses of the file, resource usage line)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True)
        res = subprocess.run(
            [tool, "-res-usage", f.name], capture_output=True, text=True, check=True
        )
    text = sass.stdout.replace(symbol, "KERNEL")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("\tcode for"))
    usage = " ".join(re.findall(r"(REG:\d+|STACK:\d+|SHARED:\d+|LOCAL:\d+)", res.stdout))
    return text, usage


def compare(before: Path, after: Path) -> dict:
    """Per-pair verdicts and the entries without a partner."""
    tool = find_cuobjdump()
    a, b = _entries(before), _entries(after)
    report = {"pairs": 0, "same": 0, "different": [], "only_before": [], "only_after": []}
    report["only_before"] = sorted(set(a) - set(b))
    report["only_after"] = sorted(set(b) - set(a))
    for ident in sorted(set(a) & set(b)):
        report["pairs"] += 1
        code_a, use_a = _machine_code(tool, *a[ident])
        code_b, use_b = _machine_code(tool, *b[ident])
        if code_a == code_b and use_a == use_b:
            report["same"] += 1
        else:
            report["different"].append({"kernel": ident, "before": use_a, "after": use_b})
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("before", type=Path, help="cache root A")
    p.add_argument("after", type=Path, help="cache root B")
    p.add_argument("--json", type=Path, default=None, help="write the full report here")
    args = p.parse_args(argv)
    report = compare(args.before, args.after)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"{report['pairs']} kernel pairs: {report['same']} identical SASS and resource usage, "
        f"{len(report['different'])} different; {len(report['only_before'])} only in "
        f"{args.before}, {len(report['only_after'])} only in {args.after}"
    )
    for item in report["different"][:10]:
        print(f"  differs: {item['kernel']} ({item['before']} -> {item['after']})")
    ok = not (report["different"] or report["only_before"] or report["only_after"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
