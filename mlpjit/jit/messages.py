"""One-line messages: every error mlpjit shows is one line, whatever it wraps.

Compiler errors (ptxas, NVVM, MLIR) run to pages with terminal colours, redis-py's and
tarfile's messages may hold newlines; a CLI prints one line per failure, so each is reduced
here, the same way everywhere.
"""

from __future__ import annotations

import re

__all__ = ["error_line", "one_line", "strip_ansi"]

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes."""
    return _ANSI_RE.sub("", text)


def one_line(text: object) -> str:
    """``text`` with its whitespace runs (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


def error_line(err: BaseException, *, first_line: bool = False, max_chars: int = 0) -> str:
    """'Type: message' on one line, colours stripped (just 'Type' for an empty message).

    ``first_line``: keep only the first non-blank line (a compiler's pages of errors);
    ``max_chars``: cut the message to that many characters, ending in "..." (0: no cap).
    """
    text = strip_ansi(str(err))
    if first_line:
        text = next((s for s in text.splitlines() if s.strip()), "")
    line = one_line(text)
    if max_chars and len(line) > max_chars:
        line = line[: max_chars - 3] + "..."
    return f"{type(err).__name__}: {line}" if line else type(err).__name__
