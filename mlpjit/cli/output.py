"""How the `mlpjit` command prints: JSON or text lines, tables, human sizes, ages and times,
one-line log records, and errors (one line, or a JSON object under --json)."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from mlpjit.errors import MlpjitError

__all__ = [
    "emit",
    "error_object",
    "error_text",
    "human_age",
    "human_size",
    "local_time",
    "note",
    "one_line",
    "params_text",
    "print_bug",
    "print_error",
    "setup_logging",
    "table",
]

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
BUG_LINE = "mlpjit: this is a bug, please report it with the traceback above"


def one_line(text: str) -> str:
    """``text`` as one line: colour codes dropped, lines joined (error messages, log lines)."""
    lines = (s.strip() for s in _ANSI_RE.sub("", text).splitlines())
    return " ".join(s for s in lines if s)


def human_size(size: Any) -> str:
    """Bytes as '812 B', '1.5 KiB', '3.2 MiB', '1.1 GiB'; '?' for a non-integer."""
    if type(size) is not int:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def _is_time(stamp: Any) -> bool:
    return isinstance(stamp, (int, float)) and not isinstance(stamp, bool)


def local_time(stamp: Any) -> str:
    """A Unix time as local 'YYYY-MM-DD HH:MM:SS'; '?' for anything else."""
    if not _is_time(stamp):
        return "?"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    except (OverflowError, OSError, ValueError):
        return "?"


def human_age(stamp: Any, now: float | None = None) -> str:
    """How long ago a Unix time was: '45s', '12m', '3h', '2d', '5w' ('?' if not a time)."""
    if not _is_time(stamp):
        return "?"
    seconds = max(0.0, (time.time() if now is None else now) - stamp)
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def params_text(params: Any) -> str:
    """A request's params as 'name=value name=value' ('?' if not a dict)."""
    if not isinstance(params, dict):
        return "?"
    return " ".join(f"{k}={v}" for k, v in params.items())


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, trailing blanks dropped."""
    every = [tuple(header), *(tuple(r) for r in rows)]
    widths = [max(len(row[i]) for row in every) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in every
    ]


def emit(as_json: bool, data: Any, lines: Callable[[], Sequence[str]]) -> None:
    """Print ``data`` as JSON with ``as_json``, else the text ``lines()``."""
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        for line in lines():
            print(line)


def error_object(err: BaseException, exit_status: int) -> dict[str, Any]:
    """The JSON printed for an error under --json: {"error": {type, message, fields...},
    "exit_status"}."""
    fields = err.fields() if isinstance(err, MlpjitError) else {}
    return {
        "error": {"type": type(err).__name__, "message": error_text(err), **fields},
        "exit_status": exit_status,
    }


def error_text(err: BaseException) -> str:
    """An error's one line: its message, prefixed by the command-line option it concerns
    (``argument`` "--name") where the message does not name that option already."""
    text = one_line(str(err)) or type(err).__name__
    argument = getattr(err, "argument", None)
    if argument and argument.startswith("-") and argument.lstrip("-") not in text:
        text = f"{argument}: {text}"
    return text


def print_error(err: BaseException, *, as_json: bool, exit_status: int = 1) -> None:
    """An expected error: "mlpjit: error: ..." on stderr, and the JSON error object on
    stdout under --json."""
    if as_json:
        print(json.dumps(error_object(err, exit_status), indent=2, sort_keys=True, default=str))
    print(f"mlpjit: error: {error_text(err)}", file=sys.stderr)


def print_bug(err: BaseException, *, as_json: bool) -> None:
    """An unexpected error (a bug): its traceback and the line asking for a report."""
    traceback.print_exception(type(err), err, err.__traceback__)
    if as_json:
        print(json.dumps(error_object(err, 1), indent=2, sort_keys=True, default=str))
    print(BUG_LINE, file=sys.stderr)


class _OneLineFormatter(logging.Formatter):
    """Log records (and warnings) as one line each: CuTe DSL's run to many lines."""

    def format(self, record: logging.LogRecord) -> str:
        return one_line(super().format(record))


def setup_logging(verbose: int) -> None:
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


def note(text: str) -> None:
    """One "mlpjit: note: ..." line on stderr (something the user may want to know)."""
    print(f"mlpjit: note: {one_line(text)}", file=sys.stderr)
