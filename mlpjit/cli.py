"""The `mlpjit` command: `mlpjit warm ...` and `mlpjit cache path|ls|info|stats|verify|prune|
clear|export|import|push|pull`, each with --json where it prints data.

Exit status: 0 on success, 1 on a failure (a bad entry found, a rejected import or pull, a
push Redis did not take, a compile error, a warm that matches no kernel, a bad MLPJIT_*
setting, no usable fleet cache for push/pull), 2 on a usage error. Every
error is one line on stderr, never a traceback: expected errors (mlpjit's own, bad values,
file problems) as "mlpjit: error: ...", usage errors as argparse's message plus where the
usage is. A compile error names the file holding the compiler's full output. Standard
library only; CuTe DSL is imported only when `warm` has to compile.

This module parses arguments and prints results; the work is elsewhere: `warm` resolves
its request list here and hands it to mlpjit.warm_pool (this process, or --jobs workers),
the cache commands call mlpjit.jit.maintenance / archive / remote (push, pull, and the fleet's
counters in `cache stats`), `doctor` calls mlpjit.doctor.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn

from mlpjit.errors import MlpjitError
from mlpjit.jit.bounds import MAX_DIGITS, bounded
from mlpjit.kernels.fp8_gemv.params import MAX_HIDDEN, MAX_INTERMEDIATE
from mlpjit.kernels.hopper import MAX_SMS, MIN_SMS
from mlpjit.models import LAYERS, PRESET_NAMES, PRESETS, get_preset

if TYPE_CHECKING:
    from mlpjit.jit.remote import RemoteCache
    from mlpjit.jit.spec import KernelRequest
    from mlpjit.jit.store import CacheStore

__all__ = [
    "MAX_JOBS",
    "MAX_PARAM_REQUESTS",
    "MAX_REQUESTS_BYTES",
    "MAX_TP",
    "MAX_WARM_TOKENS",
    "main",
    "parse_age",
    "parse_size",
    "parse_tokens",
]

# Largest token count `warm --tokens` takes. The kernels take 1-8 tokens and larger counts
# run the stock path (no kernel to warm), so this only bounds typos such as 1-99999999.
MAX_WARM_TOKENS = 1024
MAX_SIZE = 1 << 60  # --max-size: 1 EiB, far above any disk
# Largest `warm --from` file read: a request line is ~300 bytes, so this is ~200k lines.
MAX_REQUESTS_BYTES = 64 << 20
# Most requests the --param value lists of `warm --kernel` may multiply into (their
# product): a sweep of every tuning knob of one shape stays far below it.
MAX_PARAM_REQUESTS = 4096
# Largest --tp and --jobs: no deployment shards one layer over more GPUs, and more worker
# processes than this would only queue on the machine's cores.
MAX_TP = 1024
MAX_JOBS = 256
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_INT_RE = re.compile(r"[+-]?\d+")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smhdw])\s*$", re.IGNORECASE)
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


# --------------------------------------------------------------------- value parsers


def parse_size(text: str, what: str = "--max-size") -> int:
    """'500M', '2G', '1.5GiB', '4096' -> bytes (binary multiples) in [0, MAX_SIZE];
    ValueError naming ``what`` and the allowed range otherwise."""
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"{what} must look like 4096, 500K, 500M, 2G or 1T, got {text!r}")
    scale = 1024 ** " kmgt".index(match.group(2).lower() or " ")
    try:
        number = bounded(match.group(1), what, 0, MAX_SIZE / scale)
    except ValueError:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise ValueError(
            f"{what} must be a size from 0 to {MAX_SIZE >> 40}T, got {shown!r}"
        ) from None
    return min(int(number * scale), MAX_SIZE)


def parse_age(text: str) -> float:
    """'7d', '12h', '30m', '45s', '2w' -> seconds; ValueError otherwise."""
    match = _AGE_RE.match(text)
    if not match:
        raise ValueError(f"age must look like 45s, 30m, 12h, 7d or 2w, got {text!r}")
    return float(match.group(1)) * _AGE_UNITS[match.group(2).lower()]


def parse_tokens(text: str) -> list[int]:
    """'1-8', '1,2,4', '1-4,8' -> sorted distinct token counts in 1..MAX_WARM_TOKENS."""
    counts: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise ValueError(f"tokens must look like 1-8 or 1,2,4, got {text!r}") from None
        if first < 1 or last < first:
            raise ValueError(f"tokens must be positive ranges like 1-8, got {text!r}")
        if last > MAX_WARM_TOKENS:  # checked before the range is built: no huge lists
            raise ValueError(
                f"--tokens must be within 1-{MAX_WARM_TOKENS} (the kernels take 1-8 tokens; "
                f"more run the stock path and need no kernel), got {text!r}"
            )
        counts.update(range(first, last + 1))
    return sorted(counts)


def _scalar(text: str, name: str) -> int | float | bool | str | None:
    """A value of option ``name``: int, float, true/false, none, else the string itself.
    What reads as a number goes through jit.bounds (finite, at most MAX_DIGITS long), so
    1e999, nan and 5000 digits are a one-line error naming the option, not inf or a crash."""
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        float(stripped)  # every number form Python reads, inf, nan and 5000 digits included
    except ValueError:
        return text
    integer = _INT_RE.fullmatch(stripped) is not None
    high = 10**MAX_DIGITS if integer else sys.float_info.max  # any finite float
    return bounded(stripped, name, -high, high, integer=integer)


def _param_arg(text: str) -> tuple[str, list[Any]]:
    """'name=value' or 'name=v1,v2' (each value list multiplies the requests; at most
    MAX_PARAM_REQUESTS values)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--param must be name=value, got {text!r:.80}")
    name = name.strip()
    values = value.split(",")
    if len(values) > MAX_PARAM_REQUESTS:
        raise ValueError(
            f"--param {name} lists {len(values)} values; the --param lists may multiply into "
            f"at most {MAX_PARAM_REQUESTS} requests"
        )
    return name, [_scalar(v, f"--param {name}") for v in values]


def _bounded_int(name: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an int option in [low, high] (jit.bounds), named ``name``."""

    def parse(text: str) -> int:
        return int(bounded(text, name, low, high, integer=True))

    parse.__name__ = name.lstrip("-")
    return parse


def _limit_arg(text: str) -> float:
    """--limit: a finite BF16 number > 0 (as DenseMlp takes it)."""
    from mlpjit.kernels.fp8_gemv.params import check_limit

    return check_limit(_scalar(text, "--limit"), "--limit")


def _layers_arg(text: str) -> tuple[str, ...]:
    """'dense,shared' -> the --model layers to warm, in models.LAYERS order."""
    items = [s.strip() for s in text.split(",")]
    if not all(item in LAYERS for item in items):
        raise ValueError(f"layers must be a comma list of {' and/or '.join(LAYERS)}, got {text!r}")
    return tuple(layer for layer in LAYERS if layer in items)


def _key_prefix_arg(text: str) -> str:
    from mlpjit.jit.remote import check_prefixes

    return check_prefixes([text])[0]


def _arch_arg(text: str) -> str:
    from mlpjit.jit.spec import check_arch

    return check_arch(text, "--arch")


def _arg_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Turn a ValueError of ``parse`` into an argparse usage error (exit status 2)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = parse.__name__.lstrip("_").removesuffix("_arg")  # argparse shows it
    return convert


# --------------------------------------------------------------------- output helpers


def _one_line(text: str) -> str:
    """``text`` as one line: colour codes dropped, lines joined (error messages, log lines)."""
    lines = (s.strip() for s in _ANSI_RE.sub("", text).splitlines())
    return " ".join(s for s in lines if s)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line: the message, then where the usage is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (usage: {self.prog} --help)\n")


class _OneLineFormatter(logging.Formatter):
    """Log records (and warnings) as one line each: CuTe DSL's run to many lines."""

    def format(self, record: logging.LogRecord) -> str:
        return _one_line(super().format(record))


def _human_size(size: Any) -> str:
    if type(size) is not int:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def _local_time(stamp: Any) -> str:
    if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def _params_text(params: Any) -> str:
    if not isinstance(params, dict):
        return "?"
    return " ".join(f"{k}={v}" for k, v in params.items())


def _emit(args: argparse.Namespace, data: Any, lines: Callable[[], Sequence[str]]) -> None:
    """Print ``data`` as JSON with --json, else the text ``lines()``."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        for line in lines():
            print(line)


def _cache_store() -> CacheStore:
    from mlpjit.jit.store import CacheStore

    return CacheStore()


def _configured_remote() -> RemoteCache | None:
    """The fleet cache MLPJIT_REMOTE_CACHE names, or None when it is unset. A bad MLPJIT_REMOTE_*
    value (ValueError) or a missing redis-py (MlpjitError) is a one-line error."""
    from mlpjit.jit import config

    if config.remote_cache_url() is None:
        return None
    from mlpjit.jit.remote import remote_from_env

    try:
        return remote_from_env()
    except ImportError as err:
        raise MlpjitError(str(err)) from None


def _usable_remote() -> RemoteCache:
    """The configured fleet cache, answering with working credentials; else one error line."""
    remote = _configured_remote()
    if remote is None:
        raise MlpjitError(
            "MLPJIT_REMOTE_CACHE is not set: point it at the fleet cache, "
            "redis://[user:pass@]host:port/db (rediss:// for TLS)"
        )
    problem = remote.problem()
    if problem is not None:
        raise MlpjitError(f"remote compile cache {remote.url} is not usable: {problem}")
    return remote


# --------------------------------------------------------------------- cache commands


def _cmd_path(args: argparse.Namespace) -> int:
    store = _cache_store()
    layers = [{"path": str(p), "exists": p.is_dir()} for p in store.layers]
    data = {
        "root": str(store.root),
        "exists": store.root.is_dir(),
        "writable": os.access(
            store.root if store.root.exists() else _nearest_existing(store.root), os.W_OK
        ),
        "layers": layers,
    }

    def lines() -> list[str]:
        state = "" if data["exists"] else " (not created yet)"
        out = [f"{store.root}{state}"]
        out += [
            f"{x['path']} (read-only layer{'' if x['exists'] else ', missing'})" for x in layers
        ]
        return out

    _emit(args, data, lines)
    return 0


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _cmd_ls(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import entry_rows

    rows = entry_rows(_cache_store())

    def lines() -> list[str]:
        if not rows:
            return ["(no entries)"]
        table = [("KEY", "KERNEL", "PARAMS", "ARCH", "SIZE", "CREATED", "LAST USED")]
        for r in rows:
            kernel = r["kernel"] if "error" not in r else f"? ({r['error']})"
            table.append(
                (
                    r["key"][:12],
                    str(kernel),
                    _params_text(r["params"]),
                    str(r["arch"]),
                    _human_size(r["cubin_bytes"]),
                    _local_time(r["created"]),
                    _local_time(r["last_used"]),
                )
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        return [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in table
        ]

    _emit(args, rows, lines)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import find_entry

    key, manifest = find_entry(_cache_store(), args.key)
    data = {"key": key, **manifest}
    _emit(args, data, lambda: [json.dumps(data, indent=2, sort_keys=True)])
    return 0


def _remote_stats_line(remote: dict[str, Any]) -> str:
    """The `cache stats` line of the fleet cache: its entries and fleet-wide counters."""
    where = f"{remote['url']} (prefix {remote['prefix']})"
    if remote["error"]:
        return f"remote:      {where}: not usable: {remote['error']}"
    fleet = remote["fleet"]
    capped = "+" if remote["entries_capped"] else ""
    return (
        f"remote:      {where}: {remote['entries']}{capped} entries; fleet-wide "
        f"{fleet['hits']} hits, {fleet['rejected']} rejected, {fleet['uploads']} uploads"
    )


def _cmd_stats(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import cache_stats

    data = cache_stats(_cache_store(), _configured_remote())

    def lines() -> list[str]:
        out = [
            f"root:        {data['root']}",
            f"entries:     {data['entries']} ({_human_size(data['bytes'])})",
        ]
        for name, slot in data["kernels"].items():
            out.append(f"  {name}: {slot['entries']} ({_human_size(slot['bytes'])})")
        for name, slot in data["origins"].items():
            if name != data["root"]:
                out.append(f"  layer {name}: {slot['entries']} ({_human_size(slot['bytes'])})")
        out += [
            f"unreadable:  {data['unreadable_manifests']}",
            f"quarantined: {data['quarantined']}",
            f"lock files:  {data['lock_files']}",
            f"temp files:  {data['temp_files']}",
        ]
        if "remote" in data:
            out.append(_remote_stats_line(data["remote"]))
        return out

    _emit(args, data, lines)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import verify_cache

    data = verify_cache(_cache_store())

    def lines() -> list[str]:
        out = [
            f"{b.get('path') or b['key'][:12]}: BAD, {b['action']}: {b['reason']}"
            for b in data["bad"]
        ]
        out.append(f"verified {data['checked']} entries: {data['ok']} ok, {len(data['bad'])} bad")
        return out

    _emit(args, data, lines)
    return 1 if data["bad"] else 0


_LEFTOVER_NAMES = {
    "temp_files": "temp files",
    "orphan_cubins": "cubins without a manifest",
    "stale_aliases": "stale aliases",
    "stale_locks": "lock files of removed entries",
    "scratch_dirs": "compile scratch dirs",
}


def _leftovers_text(leftovers: dict[str, dict[str, int]]) -> str:
    """'leftovers: 2 temp files, 1 compile scratch dirs removed (1 in use, left alone)'."""
    removed = [
        f"{counts['removed']} {_LEFTOVER_NAMES.get(kind, kind)}"
        for kind, counts in leftovers.items()
        if counts["removed"]
    ]
    kept = sum(counts["kept"] for counts in leftovers.values())
    text = f"leftovers: {', '.join(removed)} removed" if removed else "no leftovers removed"
    return text + (f" ({kept} in use, left alone)" if kept else "")


def _cmd_prune(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import prune_cache

    data = prune_cache(_cache_store(), max_bytes=args.max_size, older_than=args.older_than)

    def lines() -> list[str]:
        busy = f", {len(data['busy'])} busy (being compiled, left alone)" if data["busy"] else ""
        return [
            f"removed {len(data['removed'])} entries ({_human_size(data['freed_bytes'])}){busy}; "
            f"{data['remaining_entries']} left ({_human_size(data['remaining_bytes'])}); "
            + _leftovers_text(data["leftovers"])
        ]

    _emit(args, data, lines)
    return 0


def _cmd_clear(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import clear_cache

    data = clear_cache(_cache_store())

    def lines() -> list[str]:
        busy = f", {len(data['busy'])} busy (being compiled, left alone)" if data["busy"] else ""
        repaired = [f"repaired {path} (removed: not a safe directory)" for path in data["repaired"]]
        return repaired + [
            f"removed {len(data['removed'])} entries and {data['quarantine_removed']} "
            f"quarantined{busy}; " + _leftovers_text(data["leftovers"])
        ]

    _emit(args, data, lines)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from mlpjit.jit.archive import export_archive

    report = export_archive(_cache_store(), Path(args.file))
    data = asdict(report)

    def lines() -> list[str]:
        out = [f"{r['key'][:12]}: skipped ({r['reason']})" for r in report.skipped]
        out.append(
            f"exported {report.entries} entries to {report.path} ({_human_size(report.bytes)})"
        )
        return out

    _emit(args, data, lines)
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from mlpjit.jit.archive import import_archive

    report = import_archive(_cache_store(), Path(args.file))
    data = {
        **asdict(report),
        "counts": {
            "imported": len(report.imported),
            "skipped": len(report.skipped),
            "rejected": len(report.rejected),
        },
    }

    def lines() -> list[str]:
        out = [f"{r['key'][:12]}: REJECTED: {r['reason']}" for r in report.rejected]
        out += [f"{r['key'][:12]}: skipped ({r['reason']})" for r in report.skipped]
        out.append(
            f"imported {len(report.imported)}, skipped {len(report.skipped)}, "
            f"rejected {len(report.rejected)} from {report.path}"
        )
        return out

    _emit(args, data, lines)
    return 1 if report.rejected else 0


def _cmd_push(args: argparse.Namespace) -> int:
    from mlpjit.jit.remote import push

    remote = _usable_remote()
    data = push(_cache_store(), remote, args.prefixes or None)

    def lines() -> list[str]:
        out = [f"{k[:12]}: FAILED: Redis did not take it" for k in data["failed"]]
        out += [f"{k[:12]}: missing: no verified local entry matches" for k in data["missing"]]
        out.append(
            f"pushed {len(data['pushed'])}, already there {len(data['present'])}, failed "
            f"{len(data['failed'])}, missing {len(data['missing'])} to {data['remote']}"
        )
        return out

    _emit(args, data, lines)
    return 1 if data["failed"] or data["missing"] else 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from mlpjit.jit.remote import pull

    remote = _usable_remote()
    data = pull(_cache_store(), remote, args.prefixes or None)

    def lines() -> list[str]:
        out = [f"{r['key'][:12]}: REJECTED: {r['reason']}" for r in data["rejected"]]
        out += [f"{r['key'][:12]}: skipped ({r['reason']})" for r in data["skipped"]]
        out += [f"{k[:12]}: missing: not in the remote cache" for k in data["missing"]]
        out.append(
            f"pulled {len(data['pulled'])}, skipped {len(data['skipped'])}, rejected "
            f"{len(data['rejected'])}, missing {len(data['missing'])} from {data['remote']}"
        )
        return out

    _emit(args, data, lines)
    if data["error"]:
        print(f"mlpjit: error: {data['error']}", file=sys.stderr)
    return 1 if data["rejected"] or data["missing"] or data["error"] else 0


# --------------------------------------------------------------------- warm


def _local_arch() -> str | None:
    """The kernel arch of the current GPU, as DenseMlp picks it ("sm_90a" on Hopper), or
    None without a GPU the kernels run on."""
    from mlpjit.device import current_cuda_device, kernel_arch

    device = current_cuda_device()
    return None if device is None else kernel_arch(device)


def _resolve_sms(args: argparse.Namespace) -> int:
    """--sms, else the current GPU's SM count when the kernels run on it, else hopper.SMS."""
    from mlpjit.kernels.hopper import SMS

    if args.sms is not None:
        return args.sms
    if _local_arch() is None:
        return SMS
    from mlpjit.device import current_cuda_device, device_sms

    return device_sms(current_cuda_device())


def _resolve_arch(args: argparse.Namespace) -> str:
    from mlpjit.jit.config import arch_override

    arch = args.arch or arch_override() or _local_arch()
    if arch is None:
        raise ValueError(
            "no target arch: pass --arch (e.g. --arch sm_90a), set MLPJIT_ARCH, or run on a "
            "machine with a GPU the kernels support (Hopper, sm_90a)"
        )
    return arch


def _warm_requests(args: argparse.Namespace, arch: str) -> list[KernelRequest]:
    """The kernel list of `mlpjit warm` from --kernel/--param, --model/--hidden, or --requests."""
    from mlpjit.jit.spec import KernelRequest

    if args.sms is not None and (args.kernel or args.requests):
        raise ValueError(
            "--sms plans --model/--hidden kernels; with --kernel give it as --param sms=N, "
            "a --requests file carries it in each request"
        )
    if args.kernel:
        names = [name for name, _ in args.param]
        if len(set(names)) != len(names):
            raise ValueError(f"--param given twice for one name: {names}")
        total = 1
        for _, values in args.param:
            total *= len(values)
            if total > MAX_PARAM_REQUESTS:  # checked as it grows: no huge product built
                lists = " x ".join(str(len(v)) for _, v in args.param)
                raise ValueError(
                    f"--param value lists multiply into {lists} requests; at most "
                    f"{MAX_PARAM_REQUESTS} (warm the rest in another run)"
                )
        grid = itertools.product(*(values for _, values in args.param))
        return [
            KernelRequest(args.kernel, dict(zip(names, combo, strict=True)), arch) for combo in grid
        ]
    if args.requests:
        requests = _read_requests(Path(args.requests))
        if args.arch:  # an explicit --arch retargets the whole list
            requests = [KernelRequest(r.kernel, r.params, args.arch) for r in requests]
        return requests
    if args.checkpoint:
        return _checkpoint_requests(args, arch)
    if args.model:
        return _shard_requests(args, arch, _model_shapes(args))
    if args.intermediate is None:
        raise ValueError("--hidden needs --intermediate")
    return _shard_requests(args, arch, [(args.hidden, args.intermediate, "the layer")])


def _model_shapes(args: argparse.Namespace) -> list[tuple[int, int, str]]:
    """(hidden, full intermediate, label) of each --layers layer of the --model preset.

    "shared" of a model without a shared expert is skipped with a note on stderr, or an
    error when it is all --layers asked for; a layer whose intermediate size --tp does not
    divide is an error naming it (no rank could hold such a shard).
    """
    preset = get_preset(args.model)
    have = preset.layers()
    asked = args.layers or LAYERS
    missing = [layer for layer in asked if layer not in have]
    if missing and len(missing) == len(asked):
        raise ValueError(
            f"{preset.name} has no shared expert: --layers {','.join(asked)} leaves nothing "
            f"to warm (allowed for it: {', '.join(have)})"
        )
    if missing:
        print(
            f"mlpjit: note: {preset.name} has no shared expert; warming its dense layers only",
            file=sys.stderr,
        )
    shapes = []
    for layer in asked:
        if layer in have:
            what = "dense MLP" if layer == "dense" else "shared expert"
            if have[layer] % args.tp:
                raise ValueError(
                    f"tp must divide {preset.name}'s {what} intermediate size "
                    f"{have[layer]}, got {args.tp}"
                )
            shapes.append((preset.hidden, have[layer], f"{preset.name} {what}"))
    return shapes


def _shard_requests(
    args: argparse.Namespace, arch: str, shapes: Sequence[tuple[int, int, str]]
) -> list[KernelRequest]:
    """The distinct kernels of every (hidden, full intermediate, label) shape at --tp and
    --tokens, in order. A shape the kernels cannot take runs the stock path and needs none:
    one note line on stderr per such layer kind, saying why; only when no shape has any
    kernel is that an error, saying why for each."""
    from mlpjit.kernels.fp8_gemv.params import MAX_TOKENS
    from mlpjit.kernels.fp8_gemv.plan import dense_mlp_requests
    from mlpjit.scale_rule import resolve_ue8m0

    requests: list[KernelRequest] = []
    notes: list[str] = []
    for hidden, intermediate, label in shapes:
        found = dense_mlp_requests(
            hidden,
            intermediate,
            args.tp,
            args.tokens,
            arch,
            ue8m0=resolve_ue8m0(args.ue8m0),
            limit=args.limit,
            sms=_resolve_sms(args),
        )
        planned = {r.params.get("tokens") for r in found}
        stock = [m for m in args.tokens if m <= MAX_TOKENS and m not in planned]
        if stock:
            why = _stock_reason(hidden, intermediate, args.tp, stock)
            counts = "" if not found else f" for tokens {','.join(map(str, stock))}"
            notes.append(f"{label} runs the stock path at tp {args.tp}{counts}: {why}")
        for r in found:
            if r not in requests:
                requests.append(r)
    if not requests:
        raise ValueError(
            "; ".join(_why_no_kernels(h, i, args.tp, args.tokens) for h, i, _ in shapes)
        )
    for note in dict.fromkeys(notes):
        print(f"mlpjit: note: {note}", file=sys.stderr)
    return requests


def _checkpoint_requests(args: argparse.Namespace, arch: str) -> list[KernelRequest]:
    """The kernels of every distinct dense-MLP / shared-expert shape of --checkpoint at --tp
    (a shape the kernels cannot take runs the stock path and needs none; only when no
    shape has any kernel is that an error). Without --ue8m0/--no-ue8m0 the scale rule is
    the one config.json gives (quantization_config.scale_fmt), else the default."""
    from mlpjit.checkpoint import checkpoint_mlp_shapes, checkpoint_ue8m0, shard_range

    if args.ue8m0 is None:
        args.ue8m0 = checkpoint_ue8m0(args.checkpoint)
    labels = {
        "dense": "dense MLP (config.json intermediate_size {})",
        "shared": "shared expert (config.json moe_intermediate_size * n_shared_experts = {})",
    }
    shapes = sorted(
        {
            (h, i, labels["shared" if prefix.endswith("shared_experts") else "dense"].format(i))
            for prefix, h, i in checkpoint_mlp_shapes(args.checkpoint)
        }
    )
    for _, intermediate, label in shapes:
        try:
            shard_range(intermediate, 0, args.tp)
        except ValueError as err:
            raise ValueError(f"{label}: {err}") from None
    return _shard_requests(args, arch, shapes)


def _stock_reason(hidden: int, intermediate: int, tp: int, tokens: Sequence[int]) -> str:
    """Why no kernel takes this shape at ``tp`` for ``tokens``: it runs the stock path."""
    from mlpjit.kernels.fp8_gemv.params import GROUP, MAX_TOKENS

    inter = intermediate // tp
    lo, hi = min(tokens), max(tokens)
    if lo > MAX_TOKENS:
        return (
            f"no token count in {lo}..{hi} takes the kernel path (1-{MAX_TOKENS}); larger "
            f"counts run the stock path and need no kernel"
        )
    if hidden % GROUP:
        return f"hidden {hidden} is not a multiple of {GROUP}"
    if inter % GROUP:
        return (
            f"tp {tp} does not divide intermediate {intermediate} into multiples of {GROUP} "
            f"(each rank gets {inter})"
        )
    return (
        f"fp8_gemv cannot take gate_up {2 * inter}x{hidden} or down {hidden}x{inter} "
        f"within the shared-memory and register limits (they run the stock path)"
    )


def _why_no_kernels(hidden: int, intermediate: int, tp: int, tokens: Sequence[int]) -> str:
    """What was asked and why no kernel fits it (a plan with 0 kernels warms nothing)."""
    lo, hi = min(tokens), max(tokens)
    asked = f"hidden {hidden}, intermediate {intermediate}, tp {tp}, tokens {lo}..{hi}"
    return f"no kernels to warm for {asked}: {_stock_reason(hidden, intermediate, tp, tokens)}"


def _check_archs(requests: Sequence[KernelRequest]) -> None:
    """Refuse, before any work, a target arch some requested kernel does not compile for."""
    from mlpjit.jit.manager import check_compile_arch
    from mlpjit.jit.spec import get_spec

    for kernel, arch in sorted({(r.kernel, r.arch) for r in requests}):
        try:
            check_compile_arch(get_spec(kernel), arch)
        except ValueError as err:
            raise ValueError(f"cannot warm for {arch}: {err}") from None


def _open_requests(path: Path) -> BinaryIO:
    """Open a request file: a regular file of at most MAX_REQUESTS_BYTES, else ValueError.

    O_NONBLOCK so that a FIFO is refused instead of waiting for a writer; /dev/zero and the
    like are refused instead of being read until memory runs out.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"request file {path} is not a regular file")
        if st.st_size > MAX_REQUESTS_BYTES:
            raise ValueError(
                f"request file {path} has {st.st_size} bytes, more than the "
                f"{MAX_REQUESTS_BYTES >> 20} MiB a request list may have"
            )
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _request_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line; never reads more than MAX_REQUESTS_BYTES,
    even of a file that grows while it is read."""
    budget = MAX_REQUESTS_BYTES
    with _open_requests(path) as f:
        for number in itertools.count(1):
            raw = f.readline(budget + 1)
            if not raw:
                return
            budget -= len(raw)
            if budget < 0:
                raise ValueError(
                    f"request file {path} grew past {MAX_REQUESTS_BYTES >> 20} MiB while read"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path}:{number}: not UTF-8 text") from None
            if line.strip():
                yield number, line


def _read_requests(path: Path) -> list[KernelRequest]:
    """Requests from a JSON-lines file ({"kernel", "params", "arch"} per line, MLPJIT_RECORD),
    in first-seen order, duplicates dropped."""
    from mlpjit.jit.spec import KernelRequest

    requests: dict[str, KernelRequest] = {}
    for number, line in _request_lines(path):
        try:
            request = KernelRequest.from_json_line(line)
        except ValueError as err:
            raise ValueError(f"{path}:{number}: {err}") from None
        requests.setdefault(request.to_json_line(), request)
    return list(requests.values())


def _dry_run(args: argparse.Namespace, arch: str, requests: list[KernelRequest]) -> int:
    """List what warm would compile (key, kernel, params, already cached?) without compiling."""
    from mlpjit.jit.key import request_key
    from mlpjit.jit.store import CacheStore

    cached = {key for key, _ in CacheStore().iter_manifests()}
    rows = []
    for r in requests:
        key = request_key(r)
        rows.append(
            {"key": key, "kernel": r.kernel, "params": dict(r.params), "cached": key in cached}
        )
    data = {
        "arch": arch,
        "total": len(rows),
        "cached": sum(r["cached"] for r in rows),
        "entries": rows,
    }

    def lines() -> list[str]:
        out = [
            f"{r['key'][:12]}  {r['kernel']}  {_params_text(r['params'])}  "
            f"{'cached' if r['cached'] else 'to compile'}"
            for r in rows
        ]
        out.append(f"{data['total']} kernels for {arch}, {data['cached']} already cached")
        return out

    _emit(args, data, lines)
    return 0


def _check_settings() -> None:
    """Read the MLPJIT_* settings a command relies on, so a bad value fails before any work
    (ValueError naming the variable) instead of on the rare lock wait that reads it."""
    from mlpjit.jit import config

    config.lock_timeout()


def _register_kernels() -> None:
    """Register mlpjit's kernels, then those of MLPJIT_KERNEL_MODULES, by importing them
    (their specs register on import; no compiler is imported)."""
    import importlib

    import mlpjit.kernels  # noqa: F401
    from mlpjit.jit import config

    for name in config.kernel_modules():
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ValueError(f"MLPJIT_KERNEL_MODULES: cannot import {name!r} ({err})") from None


def _cmd_warm(args: argparse.Namespace) -> int:
    _check_settings()
    _register_kernels()
    if args.requests:
        # Each line names its arch; --arch (if given) overrides them all.
        requests = _warm_requests(args, args.arch or "")
        arch = ",".join(sorted({r.arch for r in requests})) or (args.arch or "")
    else:
        arch = _resolve_arch(args)
        requests = _warm_requests(args, arch)
    _check_archs(requests)
    if args.dry_run:
        return _dry_run(args, arch, requests)
    from mlpjit.jit.store import CacheStore
    from mlpjit.warm_pool import warm_in_process, warm_in_workers

    t0 = time.perf_counter()
    if args.jobs > 1 and requests:
        records = warm_in_workers(requests, args.jobs)
    else:
        records = warm_in_process(requests, worker_id=args.worker_id)
    compiled = sum(r["status"] == "compiled" for r in records)
    data = {
        "arch": arch,
        "root": str(CacheStore().root),
        "total": len(records),
        "compiled": compiled,
        "compiles": sum(r["compiles"] for r in records),
        "hits": len(records) - compiled,
        "jobs": args.jobs,
        "seconds": round(time.perf_counter() - t0, 3),
        "entries": records,
    }
    lines = [
        f"warmed {data['total']} kernels for {arch}: {compiled} compiled, {data['hits']} hits "
        f"in {data['seconds']:.1f} s ({args.jobs} job{'s' if args.jobs > 1 else ''}); "
        f"cache {data['root']}"
    ]
    _emit(args, data, lambda: lines)
    return 0


# --------------------------------------------------------------------- parser and main


def _sm_count(text: str) -> int:
    """--sms: an SM count in the planner's range (hopper.MIN_SMS..MAX_SMS)."""
    return _bounded_int("--sms", MIN_SMS, MAX_SMS)(text)


def _int_option(
    group: Any, flag: str, high: int, help_text: str, default: int | None = None
) -> None:
    """Add an int option within [1, high]: anything else is a usage error naming it."""
    group.add_argument(
        flag,
        type=_arg_type(_bounded_int(flag, 1, high)),
        default=default,
        help=f"{help_text}, 1-{high}",
    )


def _cmd_doctor(args: argparse.Namespace) -> int:
    from mlpjit.doctor import format_report, run_doctor

    _check_settings()
    report = run_doctor(verify=args.verify)
    print(format_report(report, as_json=args.json))
    return report.exit_status


def _presets_text() -> str:
    """The --model presets for --help: "glm5 (hidden 6144, dense 12288, shared 2048); ...",
    aliases after their preset."""
    parts = []
    for name, p in PRESETS.items():
        shared = f", shared {p.shared_intermediate}" if p.shared_intermediate else ""
        aliases = f", also {', '.join(p.aliases)}" if p.aliases else ""
        parts.append(f"{name} (hidden {p.hidden}, dense {p.intermediate}{shared}{aliases})")
    return "; ".join(parts)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mlpjit", description="mlpjit compile cache: warm it, inspect it, ship it."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log INFO (-vv: DEBUG)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def sub(group: Any, name: str, func: Callable, help_text: str, json_flag: bool = True) -> Any:
        p = group.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func, parser=p)
        if json_flag:
            p.add_argument("--json", action="store_true", help="print JSON")
        return p

    warm = sub(commands, "warm", _cmd_warm, "compile kernels into the cache (no GPU needed)")
    what = warm.add_mutually_exclusive_group(required=True)
    what.add_argument("--kernel", help="a registered kernel name (e.g. fp8_gemv)")
    what.add_argument(
        "--model",
        choices=PRESET_NAMES,
        metavar="NAME",
        help=f"a model preset, full (unsharded) sizes: {_presets_text()}; warms its "
        "--layers at --tp",
    )
    _int_option(what, "--hidden", MAX_HIDDEN, "hidden size (with --intermediate)")
    what.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="a Hugging Face FP8 checkpoint dir: warm the dense-MLP and shared-expert shapes "
        "its config.json gives (with --tp)",
    )
    what.add_argument(
        "--from",
        "--requests",
        dest="requests",
        metavar="FILE",
        help="replay JSON lines of requests, e.g. a file written through MLPJIT_RECORD",
    )
    warm.add_argument(
        "--param",
        action="append",
        default=[],
        type=_arg_type(_param_arg),
        metavar="NAME=VALUE[,VALUE...]",
        help="compile parameter of --kernel; a value list multiplies the requests",
    )
    warm.add_argument(
        "--layers",
        type=_arg_type(_layers_arg),
        default=None,
        metavar="dense,shared",
        help="with --model: its dense MLP layers and/or its MoE layers' shared expert, each "
        "sharded intermediate/tp (default both; a model without a shared expert warms dense)",
    )
    _int_option(warm, "--intermediate", MAX_INTERMEDIATE, "full intermediate size")
    _int_option(warm, "--tp", MAX_TP, "tensor-parallel size", default=1)
    warm.add_argument(
        "--tokens",
        type=_arg_type(parse_tokens),
        default=list(range(1, 9)),
        help=f"token counts, e.g. 1-8 or 1,2,4 (within 1-{MAX_WARM_TOKENS}; the kernels take "
        "1-8, more tokens run the stock path)",
    )
    warm.add_argument(
        "--arch",
        type=_arg_type(_arch_arg),
        help="target, e.g. sm_90a, the only one the fp8 kernels compile for (default: "
        "MLPJIT_ARCH, else the GPU's)",
    )
    warm.add_argument(
        "--sms",
        type=_arg_type(_sm_count),
        default=None,
        help="SM count of the target GPU, which sizes persistent grids (default: the GPU's "
        "here, else 132 as on the H200 and H100 SXM; H100/H800 PCIe 114, H20 78; within "
        f"{MIN_SMS}-{MAX_SMS})",
    )
    warm.add_argument(
        "--ue8m0",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="power-of-two (UE8M0) activation scales (default: on, as DenseMlp; with "
        "--checkpoint, what its quantization_config.scale_fmt says where it says)",
    )
    warm.add_argument(
        "--limit",
        type=_arg_type(_limit_arg),
        default=None,
        help="clamped-SwiGLU limit, a finite BF16 number > 0 (default: no clamp)",
    )
    _int_option(warm, "--jobs", MAX_JOBS, "worker processes", default=1)
    warm.add_argument("--dry-run", action="store_true", help="list the kernels, compile nothing")
    warm.add_argument("--worker-id", type=int, default=None, help=argparse.SUPPRESS)

    doctor = sub(commands, "doctor", _cmd_doctor, "check toolchain, GPU, cache dirs and locks")
    doctor.add_argument("--verify", action="store_true", help="also re-hash every cache entry")

    cache = commands.add_parser("cache", help="inspect and maintain the cache")
    group = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    sub(group, "path", _cmd_path, "print the writable cache dir and read-only layers")
    sub(group, "ls", _cmd_ls, "list entries")
    info = sub(group, "info", _cmd_info, "print one entry's manifest")
    info.add_argument("key", metavar="KEY", help="a key or a unique key prefix")
    sub(group, "stats", _cmd_stats, "entries, bytes, per kernel, quarantined, lock files")
    sub(group, "verify", _cmd_verify, "re-hash every entry; quarantine bad ones (exit 1 if any)")
    prune = sub(group, "prune", _cmd_prune, "remove least recently used entries")
    prune.add_argument(
        "--max-size", type=_arg_type(parse_size), metavar="SIZE", help="e.g. 500M, 2G"
    )
    prune.add_argument(
        "--older-than", type=_arg_type(parse_age), metavar="AGE", help="e.g. 7d, 12h"
    )
    sub(group, "clear", _cmd_clear, "remove every entry of the writable cache dir")
    export = sub(group, "export", _cmd_export, "write every entry to one portable archive")
    export.add_argument("file", metavar="FILE")
    imp = sub(group, "import", _cmd_import, "verify an archive and add its entries")
    imp.add_argument("file", metavar="FILE")
    for name, func, help_text in (
        ("push", _cmd_push, "upload verified entries to the fleet cache (MLPJIT_REMOTE_CACHE)"),
        ("pull", _cmd_pull, "verify entries of the fleet cache and add them (exit 1 if any bad)"),
    ):
        fleet = sub(group, name, func, help_text)
        fleet.add_argument(
            "prefixes",
            nargs="*",
            type=_arg_type(_key_prefix_arg),
            metavar="KEY_PREFIX",
            help="only keys starting with one of these (default: every entry)",
        )
    return parser


def _setup_logging(verbose: int) -> None:
    """WARNING and up to stderr, one line per record (-v: INFO, -vv: DEBUG, as written).

    Python warnings (CuTe DSL's run to a dozen lines) go through logging too.
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _OneLineFormatter("%(message)s") if verbose == 0 else logging.Formatter("%(message)s")
    )
    logging.basicConfig(level=level, handlers=[handler])
    logging.captureWarnings(True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 failure, 2 usage error)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if (
        args.command == "cache"
        and args.cache_command == "prune"
        and (args.max_size is None and args.older_than is None)
    ):
        args.parser.error("cache prune needs --max-size and/or --older-than")
    if args.command == "warm" and args.param and not args.kernel:
        args.parser.error("--param goes with --kernel")
    if args.command == "warm" and args.intermediate is not None and args.hidden is None:
        args.parser.error("--intermediate goes with --hidden")
    if args.command == "warm" and args.layers is not None and not args.model:
        args.parser.error("--layers goes with --model")
    _setup_logging(args.verbose)
    try:
        return args.func(args)
    except BrokenPipeError:
        # Output piped into e.g. `head`: stop quietly, and keep Python's exit-time flush quiet.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 1
    except (MlpjitError, ValueError, OSError) as err:
        print(f"mlpjit: error: {_one_line(str(err))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mlpjit: interrupted", file=sys.stderr)
        return 130
