"""`mlpjit cache path|ls|info|stats|verify|prune|clear|export|import`: the local cache.

The work is in mlpjit.jit.maintenance and mlpjit.jit.archive; this module parses the
options, filters and prints (a readable view by default, the raw fields under --json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlpjit.cli import output
from mlpjit.cli.values import arg_type, bounded_int, key_prefix_arg, parse_age, parse_size
from mlpjit.errors import UsageError
from mlpjit.models import PRESET_NAMES

if TYPE_CHECKING:
    from mlpjit.jit.store import CacheStore

__all__ = ["add_parsers", "cache_store"]

STDIO = "-"  # export to stdout / import from stdin


def cache_store() -> CacheStore:
    """The store of MLPJIT_CACHE_DIR / MLPJIT_CACHE_PATH and the installed cubin wheels."""
    from mlpjit.jit import config
    from mlpjit.jit.store import CacheStore

    try:
        config.cache_wheels()
    except ValueError as err:
        raise UsageError(str(err), argument="MLPJIT_CACHE_WHEELS") from None
    return CacheStore()


def add_parsers(group: Any, sub: Any) -> None:
    """Add the local cache actions to the ``cache`` subparsers."""
    sub(group, "path", _path, "print the writable cache dir, read-only dirs and cubin wheels")
    ls = sub(group, "ls", _ls, "list entries: kernel, what it serves, shape, tokens, size, age")
    _add_filters(ls)
    ls.add_argument(
        "--long", action="store_true", help="also the full params, arch, origin and times"
    )
    info = sub(group, "info", _info, "print one entry's manifest")
    info.add_argument("key", metavar="KEY", help="a key or a unique key prefix")
    sub(group, "stats", _stats, "entries, bytes, per kernel, quarantined, lock files")
    sub(group, "verify", _verify, "re-hash every entry; quarantine bad ones (exit 1 if any)")
    prune = sub(group, "prune", _prune, "remove least recently used entries")
    prune.set_defaults(check=_check_prune)
    prune.add_argument(
        "--max-size", type=arg_type(parse_size), metavar="SIZE", help="e.g. 500M, 2G"
    )
    prune.add_argument("--older-than", type=arg_type(parse_age), metavar="AGE", help="e.g. 7d, 12h")
    sub(group, "clear", _clear, "remove every entry of the writable cache dir")
    export = sub(
        group,
        "export",
        _export,
        "write verified entries (all, or those the filters select) to one portable archive, "
        "or to a pip-installable cubin wheel (--wheel)",
    )
    export.set_defaults(check=_check_export)
    export.add_argument(
        "file",
        nargs="?",
        metavar="FILE",
        help="a .tar, .tar.gz (.tgz), .tar.xz or .tar.bz2 file (compressed as named), or - "
        "for a plain tar on stdout; not with --wheel",
    )
    _add_filters(export)
    wheel = export.add_argument_group("cubin wheel")
    wheel.add_argument(
        "--wheel",
        metavar="DIR",
        help="write a wheel into DIR instead (created if missing): pip install it and mlpjit "
        "finds its entries as a read-only cache dir",
    )
    wheel.add_argument(
        "--name",
        type=arg_type(_wheel_name),
        help="the wheel's distribution name, starting with mlpjit-cubins (default: "
        "mlpjit-cubins-[MODEL-][tpN-][HALF-]ARCH from the filters and the entries)",
    )
    wheel.add_argument(
        "--version",
        type=arg_type(_wheel_version),
        help="its version, normalized PEP 440 (default: YEAR.MONTH.DAY of the newest entry "
        "+g and 12 hex digits of its keys' hash)",
    )
    imp = sub(group, "import", _import, "verify an archive and add its entries")
    imp.add_argument(
        "file",
        metavar="FILE",
        help="an archive written by export (plain or compressed, whatever its name), or - for "
        "stdin",
    )


# --------------------------------------------------------------------- filters


def _add_filters(parser: argparse.ArgumentParser) -> None:
    """The entry filters of `cache ls` and `cache export` (all must match)."""
    parser.add_argument(
        "prefixes",
        nargs="*",
        type=arg_type(key_prefix_arg),
        metavar="KEY_PREFIX",
        help="only keys starting with one of these",
    )
    parser.add_argument("--kernel", metavar="NAME", help="only this kernel's entries")
    parser.add_argument(
        "--model",
        choices=PRESET_NAMES,
        metavar="NAME",
        help="only entries serving this model preset's layers (fp8_gemv, fp8_stream)",
    )
    parser.add_argument(
        "--tp",
        type=arg_type(bounded_int("--tp", 1, 1 << 20)),
        help="only entries serving a layer at this TP size",
    )
    parser.add_argument(
        "--half", choices=("gate_up", "down"), help="only gate_up or down entries"
    )


def _serves(row: dict[str, Any]) -> list[Any]:
    from mlpjit.planning import shard_roles

    return shard_roles(row.get("kernel"), row.get("params"))


def _selected(args: argparse.Namespace, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows every given filter matches."""
    from mlpjit.models import get_preset

    model = get_preset(args.model).name if args.model else None
    picked = []
    for row in rows:
        if args.prefixes and not any(row["key"].startswith(p) for p in args.prefixes):
            continue
        if args.kernel and row.get("kernel") != args.kernel:
            continue
        if model or args.tp or args.half:
            roles = [
                r
                for r in _serves(row)
                if (model is None or r.model == model)
                and (args.tp is None or r.tp == args.tp)
                and (args.half is None or r.half == args.half)
            ]
            if not roles:
                continue
        picked.append(row)
    return picked


# --------------------------------------------------------------------- commands


def _path(args: argparse.Namespace) -> int:
    store = cache_store()
    layers = [_layer(store, p) for p in store.read_only]
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
        for x in layers:
            what = f"cubin wheel {x['wheel']}" if "wheel" in x else "read-only layer"
            out.append(f"{x['path']} ({what}{'' if x['exists'] else ', missing'})")
        return out

    output.emit(args.json, data, lines)
    return 0


def _layer(store: CacheStore, path: Path) -> dict[str, Any]:
    """A read-only tier for `cache path`: path, exists, and "wheel" (name version) for a
    cubin wheel's."""
    layer: dict[str, Any] = {"path": str(path), "exists": path.is_dir()}
    wheel = store.wheel_of(path)
    if wheel is not None:
        layer["wheel"] = wheel.label()
    return layer


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _shape(row: dict[str, Any]) -> str:
    """A layer kernel's (planning.LAYER_KERNELS) 'rows x k'; another kernel: its params."""
    from mlpjit.planning import LAYER_KERNELS

    params = row.get("params")
    if row.get("kernel") in LAYER_KERNELS and isinstance(params, dict):
        return f"{params.get('rows')}x{params.get('k')}"
    return output.params_text(params)


def _ls_key(row: dict[str, Any]) -> tuple:
    """Sort by what an entry serves: kernel, model layer and TP, half, then tokens."""
    roles = _serves(row)
    params = row.get("params") if isinstance(row.get("params"), dict) else {}
    tokens = params.get("tokens")
    return (
        str(row.get("kernel")),
        str(roles[0]) if roles else "~",  # entries serving no preset last
        _shape(row),
        tokens if isinstance(tokens, int) else 0,
        row["key"],
    )


def _ls(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import entry_rows

    rows = sorted(_selected(args, entry_rows(cache_store())), key=_ls_key)
    for row in rows:
        row["serves"] = [str(r) for r in _serves(row)]

    def lines() -> list[str]:
        if not rows:
            return ["(no entries)"]
        header = ["KEY", "KERNEL", "SERVES", "SHAPE", "TOKENS", "SIZE", "USED"]
        if args.long:
            header += ["ARCH", "PARAMS", "CREATED", "LAST USED", "ORIGIN"]
        table = []
        for r in rows:
            params = r["params"] if isinstance(r["params"], dict) else {}
            kernel = r["kernel"] if "error" not in r else f"? ({r['error']})"
            serves = r["serves"][0] if r["serves"] else "-"
            if len(r["serves"]) > 1:
                serves += f" (+{len(r['serves']) - 1})"
            line = [
                r["key"][:12],
                str(kernel),
                serves,
                _shape(r),
                str(params.get("tokens", "-")),
                output.human_size(r["cubin_bytes"]),
                output.human_age(r["last_used"]),
            ]
            if args.long:
                line += [
                    str(r["arch"]),
                    output.params_text(r["params"]),
                    output.local_time(r["created"]),
                    output.local_time(r["last_used"]),
                    str(r["origin"]),
                ]
            table.append(line)
        total = sum(r["cubin_bytes"] for r in rows if type(r["cubin_bytes"]) is int)
        return [
            *output.table(header, table),
            f"{len(rows)} entries, {output.human_size(total)}",
        ]

    output.emit(args.json, rows, lines)
    return 0


_TIME_FIELDS = ("created", "last_used")


def _info(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import find_entry

    store = cache_store()
    try:
        key, manifest = find_entry(store, args.key)
    except ValueError as err:  # the KEY the user gave: no entry, bad hex, ambiguous
        raise UsageError(str(err), argument="KEY", value=args.key) from None
    data = {"key": key, **manifest}
    wheel = store.wheel_of(str(manifest.get("origin", "")))
    if wheel is not None:
        data["wheel"] = wheel.label()

    def lines() -> list[str]:
        components = data.get("components") if isinstance(data.get("components"), dict) else {}
        roles = _serves({"kernel": components.get("kernel"), "params": components.get("params")})
        out = [f"key: {key}"]
        if roles:
            out.append(f"serves: {', '.join(str(r) for r in roles)}")
        for name, value in sorted(data.items()):
            if name == "key":
                continue
            if name in _TIME_FIELDS:
                shown = f"{output.local_time(value)} ({output.human_age(value)} ago)"
            elif name == "cubin_bytes":
                shown = output.human_size(value)
            elif isinstance(value, (dict, list)):
                shown = json.dumps(value, sort_keys=True)
            else:
                shown = str(value)
            out.append(f"{name}: {shown}")
        return out

    output.emit(args.json, data, lines)
    return 0


def _stats(args: argparse.Namespace) -> int:
    from mlpjit.cli.fleet import configured_remote, remote_stats_line
    from mlpjit.jit.maintenance import cache_stats

    data = cache_stats(cache_store(), configured_remote())

    def lines() -> list[str]:
        size = output.human_size
        out = [
            f"root:        {data['root']}",
            f"entries:     {data['entries']} ({size(data['bytes'])})",
        ]
        for name, slot in data["kernels"].items():
            out.append(f"  {name}: {slot['entries']} ({size(slot['bytes'])})")
        for name, slot in data["origins"].items():
            if name != data["root"]:
                wheel = data["wheels"].get(name)
                what = f"wheel {wheel}" if wheel else "layer"
                out.append(f"  {what} {name}: {slot['entries']} ({size(slot['bytes'])})")
        out += [
            f"unreadable:  {data['unreadable_manifests']}",
            f"quarantined: {data['quarantined']}",
            f"lock files:  {data['lock_files']}",
            f"temp files:  {data['temp_files']}",
        ]
        if "remote" in data:
            out.append(remote_stats_line(data["remote"]))
        return out

    output.emit(args.json, data, lines)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import verify_cache

    data = verify_cache(cache_store())

    def lines() -> list[str]:
        out = [
            f"{b.get('path') or b['key'][:12]}: BAD, {b['action']}: {b['reason']}"
            for b in data["bad"]
        ]
        out.append(f"verified {data['checked']} entries: {data['ok']} ok, {len(data['bad'])} bad")
        return out

    output.emit(args.json, data, lines)
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


def _busy_text(data: dict[str, Any]) -> str:
    return f", {len(data['busy'])} busy (being compiled, left alone)" if data["busy"] else ""


def _check_prune(args: argparse.Namespace) -> None:
    if args.max_size is None and args.older_than is None:
        args.parser.error("cache prune needs --max-size and/or --older-than")


def _prune(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import prune_cache

    data = prune_cache(cache_store(), max_bytes=args.max_size, older_than=args.older_than)

    def lines() -> list[str]:
        return [
            f"removed {len(data['removed'])} entries ({output.human_size(data['freed_bytes'])})"
            f"{_busy_text(data)}; {data['remaining_entries']} left "
            f"({output.human_size(data['remaining_bytes'])}); " + _leftovers_text(data["leftovers"])
        ]

    output.emit(args.json, data, lines)
    return 0


def _clear(args: argparse.Namespace) -> int:
    from mlpjit.jit.maintenance import clear_cache

    data = clear_cache(cache_store())

    def lines() -> list[str]:
        repaired = [f"repaired {path} (removed: not a safe directory)" for path in data["repaired"]]
        return repaired + [
            f"removed {len(data['removed'])} entries and {data['quarantine_removed']} "
            f"quarantined{_busy_text(data)}; " + _leftovers_text(data["leftovers"])
        ]

    output.emit(args.json, data, lines)
    return 0


# --------------------------------------------------------------------- archives


def _wheel_name(text: str) -> str:
    from mlpjit.jit.wheel import check_name

    return check_name(text)


def _wheel_version(text: str) -> str:
    from mlpjit.jit.wheel import check_version

    return check_version(text)


def _check_export(args: argparse.Namespace) -> None:
    """FILE or --wheel; --name and --version only with --wheel. With --wheel, a FILE given is
    the first key prefix (`export --wheel dist 3f2a`)."""
    if args.wheel is None:
        if args.file is None:
            args.parser.error("cache export needs FILE (or --wheel DIR)")
        for flag, value in (("--name", args.name), ("--version", args.version)):
            if value is not None:
                args.parser.error(f"{flag} goes with --wheel")
        return
    if args.file is not None:
        try:
            args.prefixes.insert(0, key_prefix_arg(args.file))
        except ValueError:
            args.parser.error(
                f"with --wheel DIR, no FILE is written; {args.file!r} is not a key prefix either"
            )
        args.file = None


def _check_archive_name(file: str) -> None:
    """Refuse a name that asks for a compression export does not write (.zst, .zip): a plain
    tar under that name would be a lie. .tar.gz, .tar.xz and .tar.bz2 are written as named."""
    from mlpjit.jit.compression import compression_for_name

    try:
        compression_for_name(file)
    except ValueError as err:
        raise UsageError(str(err), argument="FILE", value=file, path=file) from None


def _export(args: argparse.Namespace) -> int:
    from mlpjit.jit.archive import export_archive
    from mlpjit.jit.maintenance import entry_rows

    store = cache_store()
    filtered = args.prefixes or args.kernel or args.model or args.tp or args.half
    keys = [r["key"] for r in _selected(args, entry_rows(store))] if filtered else None
    if args.wheel is not None:
        return _export_wheel(args, store, keys)
    _check_archive_name(args.file)
    if args.file != STDIO:
        report = export_archive(store, Path(args.file), keys)
    else:
        with tempfile.TemporaryDirectory(prefix="mlpjit-export-") as tmp:
            report = export_archive(store, Path(tmp) / "archive.tar", keys)
            with open(report.path, "rb") as f:
                shutil.copyfileobj(f, sys.stdout.buffer)
            sys.stdout.flush()
        report.path = STDIO
    data = asdict(report)

    def lines() -> list[str]:
        return [
            *_skipped_lines(report.skipped),
            f"exported {report.entries} entries to {report.path} "
            f"({output.human_size(report.bytes)})",
        ]

    if args.file == STDIO:  # stdout holds the archive: the summary goes to stderr
        for line in lines():
            print(line, file=sys.stderr)
    else:
        output.emit(args.json, data, lines)
    return 0


def _skipped_lines(skipped: list[dict[str, str]]) -> list[str]:
    return [f"{r['key'][:12]}: skipped ({r['reason']})" for r in skipped]


def _export_wheel(args: argparse.Namespace, store: CacheStore, keys: list[str] | None) -> int:
    from mlpjit.jit.wheel import write_wheel

    if keys == []:
        raise UsageError("the filters select no entries; `mlpjit cache ls` with them shows none")
    tags = []
    if args.model:
        from mlpjit.models import get_preset

        tags.append(get_preset(args.model).name)
    if args.tp:
        tags.append(f"tp{args.tp}")
    if args.half:
        tags.append(args.half)
    try:
        report = write_wheel(
            store, Path(args.wheel), keys, name=args.name, version=args.version, tags=tags
        )
    except ValueError as err:
        raise UsageError(str(err), argument="--wheel", value=args.wheel, path=args.wheel) from None
    data = asdict(report)

    def lines() -> list[str]:
        return [
            *_skipped_lines(report.skipped),
            f"wrote {report.path}: {report.name} {report.version}, {report.entries} entries "
            f"({output.human_size(report.bytes)})",
            f"install it where the kernels run: pip install {report.path}",
        ]

    output.emit(args.json, data, lines)
    return 0


def _import(args: argparse.Namespace) -> int:
    from mlpjit.jit.archive import import_archive

    store = cache_store()
    try:
        if args.file != STDIO:
            report = import_archive(store, Path(args.file))
        else:
            with tempfile.TemporaryDirectory(prefix="mlpjit-import-") as tmp:
                path = Path(tmp) / "archive.tar"
                _copy_stdin(path)
                report = import_archive(store, path)
            report.path = STDIO
    except ValueError as err:  # the archive as a whole is refused: nothing was written
        raise UsageError(str(err), argument="FILE", path=args.file) from None
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

    output.emit(args.json, data, lines)
    return 1 if report.rejected else 0


def _copy_stdin(path: Path) -> None:
    """Copy stdin to ``path``, at most the largest archive import reads (the same cap
    applies to a file), so an endless stream is refused instead of filling the disk."""
    from mlpjit.jit.archive import MAX_ARCHIVE_BYTES

    left = MAX_ARCHIVE_BYTES + 1
    with open(path, "wb") as f:
        while left > 0:
            chunk = sys.stdin.buffer.read(min(1 << 20, left))
            if not chunk:
                return
            f.write(chunk)
            left -= len(chunk)
    raise UsageError(
        f"the archive on stdin is over the {MAX_ARCHIVE_BYTES} byte limit", argument="FILE"
    )
