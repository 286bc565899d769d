"""The `mlpjit` argument parser: the root options, and each command module's parsers.

Each command module adds its own parser (options, the function that runs it, and a
``check`` of options that only go together); this module only wires them.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from typing import Any, NoReturn

from mlpjit.cli import cache, doctor, fleet, warm
from mlpjit.cli.output import one_line

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line: the message, then where the usage is; with
    ``json_errors`` also a JSON error object on stdout (the command line has --json)."""

    def __init__(self, *args: Any, json_errors: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.json_errors = json_errors

    def error(self, message: str) -> NoReturn:
        text = f"{one_line(message)} (usage: {self.prog} --help)"
        if self.json_errors:
            error = {"type": "usage", "message": text}
            print(json.dumps({"error": error, "exit_status": 2}, indent=2, sort_keys=True))
        self.exit(2, f"{self.prog}: error: {text}\n")


def _sub(group: Any, name: str, func: Callable, help_text: str, json_flag: bool = True) -> Any:
    """A command's parser, running ``func``; with --json where it prints data."""
    p = group.add_parser(name, help=help_text, description=help_text)
    p.set_defaults(func=func, parser=p)
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON (errors too, on stdout)")
    return p


def build_parser(json_errors: bool = False) -> argparse.ArgumentParser:
    """The whole `mlpjit` parser (``json_errors``: usage errors also as JSON on stdout)."""
    from mlpjit import __version__

    parser_class = functools.partial(_Parser, json_errors=json_errors)
    parser = parser_class(
        prog="mlpjit", description="mlpjit compile cache: warm it, inspect it, ship it."
    )
    parser.add_argument("--version", action="version", version=f"mlpjit {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log INFO (-vv: DEBUG)")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=parser_class
    )
    warm.add_parser(commands, _sub)
    doctor.add_parser(commands, _sub)
    cache_parser = commands.add_parser(
        "cache", help="inspect and maintain the cache", description="inspect and maintain the cache"
    )
    group = cache_parser.add_subparsers(
        dest="cache_command", required=True, metavar="ACTION", parser_class=parser_class
    )
    cache.add_parsers(group, _sub)
    fleet.add_parsers(group, _sub)
    return parser
