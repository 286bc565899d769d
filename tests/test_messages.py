"""mlpjit.jit.messages: every error shown is one line."""

from __future__ import annotations

from mlpjit.jit.messages import error_line, one_line, strip_ansi


def test_one_line_collapses_whitespace():
    assert one_line("a\n  b\tc ") == "a b c"
    assert strip_ansi("\x1b[31mred\x1b[0m") == "red"


def test_error_line():
    err = RuntimeError("\n\x1b[1merror:\x1b[0m ptxas died\nmore\nand more")
    assert error_line(err) == "RuntimeError: error: ptxas died more and more"
    assert error_line(err, first_line=True) == "RuntimeError: error: ptxas died"
    assert error_line(err, first_line=True, max_chars=10) == "RuntimeError: error: ..."
    assert error_line(ValueError()) == "ValueError"
