"""The `mlpjit` command: `mlpjit warm ...`, `mlpjit doctor` and `mlpjit cache path|ls|info|
stats|verify|prune|clear|export|import|push|pull`, each with --json where it prints data.

Exit status: 0 on success, 1 on a failure (a bad entry found, a rejected import or pull, a
push Redis did not take, a compile error, a warm that matches no kernel, a bad MLPJIT_*
setting, no usable fleet cache for push/pull), 2 on a usage error. An expected error
(mlpjit's own, a bad value, a file problem) is one line on stderr, "mlpjit: error: ...",
built from the error's fields; under --json also a JSON error object on stdout. A usage
error is argparse's message plus where the usage is. Anything else is a bug: its traceback
and a line asking for a report. A compile error names the file holding the compiler's full
output. CuTe DSL is imported only when `warm` has to compile; --help and --version import
neither torch nor cutlass.

One module per command group (warm, cache, fleet, doctor) parses its options and prints;
the work is in the library (mlpjit.planning, mlpjit.warm_pool, mlpjit.jit.maintenance,
archive and remote, mlpjit.doctor).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from mlpjit.cli.values import MAX_WARM_TOKENS, parse_age, parse_size, parse_tokens

__all__ = ["MAX_WARM_TOKENS", "main", "parse_age", "parse_size", "parse_tokens"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 failure, 2 usage error)."""
    from mlpjit.cli import output
    from mlpjit.cli.parser import build_parser
    from mlpjit.errors import MlpjitError

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(json_errors="--json" in argv).parse_args(argv)
    check = getattr(args, "check", None)
    if check is not None:
        check(args)
    as_json = getattr(args, "json", False)
    output.setup_logging(args.verbose)
    try:
        return args.func(args)
    except BrokenPipeError:
        # Output piped into e.g. `head`: stop quietly, and keep Python's exit-time flush quiet.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 1
    except KeyboardInterrupt:
        print("mlpjit: interrupted", file=sys.stderr)
        return 130
    except (MlpjitError, OSError) as err:  # expected: a value, a file, the environment
        output.print_error(err, as_json=as_json)
        return 1
    except Exception as err:  # noqa: BLE001 (a bug: keep its traceback, ask for a report)
        output.print_bug(err, as_json=as_json)
        return 1
