"""`mlpjit doctor`: toolchain, GPU, cache dirs and locks (the checks are mlpjit.doctor's)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser"]


def add_parser(commands: Any, sub: Any) -> None:
    """Add `doctor` to the ``commands`` subparsers."""
    doctor = sub(commands, "doctor", _run, "check toolchain, GPU, cache dirs and locks")
    doctor.add_argument("--verify", action="store_true", help="also re-hash every cache entry")


def _run(args: argparse.Namespace) -> int:
    from mlpjit.cli.values import check_settings
    from mlpjit.doctor import format_report, run_doctor

    check_settings()  # a bad MLPJIT_LOCK_TIMEOUT is an error, before any check runs
    report = run_doctor(verify=args.verify)
    print(format_report(report, as_json=args.json))
    return report.exit_status
