"""`mlpjit cache push|pull`: the fleet cache on Redis (MLPJIT_REMOTE_CACHE), and its line in
`cache stats`. The work is in mlpjit.jit.remote; this module parses and prints."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from mlpjit.cli import output
from mlpjit.cli.values import arg_type, key_prefix_arg
from mlpjit.errors import MlpjitError, UsageError

if TYPE_CHECKING:
    from mlpjit.jit.remote import RemoteCache

__all__ = ["add_parsers", "configured_remote", "remote_stats_line"]


def add_parsers(group: Any, sub: Any) -> None:
    """Add push and pull to the ``cache`` subparsers."""
    for name, func, help_text in (
        ("push", _push, "upload verified entries to the fleet cache (MLPJIT_REMOTE_CACHE)"),
        ("pull", _pull, "verify entries of the fleet cache and add them (exit 1 if any bad)"),
    ):
        fleet = sub(group, name, func, help_text)
        fleet.add_argument(
            "prefixes",
            nargs="*",
            type=arg_type(key_prefix_arg),
            metavar="KEY_PREFIX",
            help="only keys starting with one of these (default: every entry)",
        )


def configured_remote() -> RemoteCache | None:
    """The fleet cache MLPJIT_REMOTE_CACHE names, or None when it is unset. A bad
    MLPJIT_REMOTE_* value or a missing redis-py is a one-line error."""
    from mlpjit.jit import config
    from mlpjit.jit.remote import remote_from_env

    try:
        if config.remote_cache_url() is None:
            return None
        return remote_from_env()
    except ImportError as err:  # redis-py is not installed
        raise MlpjitError(str(err), argument="MLPJIT_REMOTE_CACHE") from None
    except ValueError as err:  # a malformed MLPJIT_REMOTE_* value (the message names it)
        raise UsageError(str(err)) from None


def _usable_remote() -> RemoteCache:
    """The configured fleet cache, answering with working credentials; else one error line."""
    remote = configured_remote()
    if remote is None:
        raise MlpjitError(
            "MLPJIT_REMOTE_CACHE is not set: point it at the fleet cache, "
            "redis://[user:pass@]host:port/db (rediss:// for TLS)",
            argument="MLPJIT_REMOTE_CACHE",
        )
    problem = remote.problem()
    if problem is not None:
        raise MlpjitError(
            f"remote compile cache {remote.url} is not usable: {problem}",
            argument="MLPJIT_REMOTE_CACHE",
        )
    return remote


def remote_stats_line(remote: dict[str, Any]) -> str:
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


def _push(args: argparse.Namespace) -> int:
    from mlpjit.cli.cache import cache_store
    from mlpjit.jit.remote import push

    remote = _usable_remote()
    data = push(cache_store(), remote, args.prefixes or None)

    def lines() -> list[str]:
        out = [f"{k[:12]}: FAILED: Redis did not take it" for k in data["failed"]]
        out += [f"{k[:12]}: missing: no verified local entry matches" for k in data["missing"]]
        out.append(
            f"pushed {len(data['pushed'])}, already there {len(data['present'])}, failed "
            f"{len(data['failed'])}, missing {len(data['missing'])} to {data['remote']}"
        )
        return out

    output.emit(args.json, data, lines)
    return 1 if data["failed"] or data["missing"] else 0


def _pull(args: argparse.Namespace) -> int:
    from mlpjit.cli.cache import cache_store
    from mlpjit.jit.remote import pull

    remote = _usable_remote()
    data = pull(cache_store(), remote, args.prefixes or None)

    def lines() -> list[str]:
        out = [f"{r['key'][:12]}: REJECTED: {r['reason']}" for r in data["rejected"]]
        out += [f"{r['key'][:12]}: skipped ({r['reason']})" for r in data["skipped"]]
        out += [f"{k[:12]}: missing: not in the remote cache" for k in data["missing"]]
        out.append(
            f"pulled {len(data['pulled'])}, skipped {len(data['skipped'])}, rejected "
            f"{len(data['rejected'])}, missing {len(data['missing'])} from {data['remote']}"
        )
        return out

    output.emit(args.json, data, lines)
    if data["error"]:
        print(f"mlpjit: error: {output.one_line(str(data['error']))}", file=sys.stderr)
    return 1 if data["rejected"] or data["missing"] or data["error"] else 0
