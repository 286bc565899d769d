"""mlpjit.cli.output: human sizes, ages and times, tables, and error lines and objects."""

from __future__ import annotations

import json

from mlpjit.cli import output
from mlpjit.errors import CacheDirError, UsageError


def test_human_size() -> None:
    assert output.human_size(812) == "812 B"
    assert output.human_size(1536) == "1.5 KiB"
    assert output.human_size(1544968) == "1.5 MiB"
    assert output.human_size(3 << 40) == "3072.0 GiB"
    assert output.human_size(None) == output.human_size(1.5) == output.human_size(True) == "?"


def test_human_age_and_local_time() -> None:
    now = 1_000_000.0
    ages = [(now - 5, "5s"), (now - 90, "1m"), (now - 7200, "2h"), (now - 3 * 86400, "3d")]
    assert [output.human_age(t, now) for t, _ in ages] == [a for _, a in ages]
    assert output.human_age(now - 15 * 86400, now) == "2w"
    assert output.human_age(now + 60, now) == "0s"  # a clock step back is not negative
    assert output.human_age("x") == output.human_age(True) == "?"
    assert len(output.local_time(now)) == 19 and output.local_time(None) == "?"
    assert output.local_time(1e300) == "?"  # no OverflowError from a bad manifest


def test_table_aligns_and_strips() -> None:
    assert output.table(["A", "BB"], [["xyz", ""], ["1", "2"]]) == ["A    BB", "xyz", "1    2"]


def test_error_line_names_the_argument_once() -> None:
    assert output.error_text(UsageError("tp must divide 12288, got 7", argument="--tp")) == (
        "tp must divide 12288, got 7"
    )
    assert output.error_text(UsageError("must be 1-8", argument="--tokens")) == (
        "--tokens: must be 1-8"
    )
    assert output.error_text(ValueError("two\nlines")) == "two lines"
    assert output.error_text(UsageError("no such file", argument="MLPJIT_X")) == "no such file"


def test_error_object_carries_the_fields(capsys) -> None:
    err = CacheDirError("cache dir /c is writable by others", path="/c")
    output.print_error(err, as_json=True)
    out, stderr = capsys.readouterr()
    assert json.loads(out) == {
        "error": {
            "type": "CacheDirError",
            "message": "cache dir /c is writable by others",
            "path": "/c",
        },
        "exit_status": 1,
    }
    assert stderr == "mlpjit: error: cache dir /c is writable by others\n"
    output.print_error(err, as_json=False)
    assert capsys.readouterr().out == ""
