"""argparse value types and options the benchmark, sweep and demo command lines share.

Each type raises argparse.ArgumentTypeError with a one-line message naming what is allowed, so
argparse exits 2 with "argument --NAME: <message>".
"""

from __future__ import annotations

import argparse

__all__ = ["add_norm_between", "add_rounds", "positive_int", "token_list"]


def positive_int(text: str) -> int:
    """``text`` as an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return value


def token_list(text: str, most: int | None = None) -> list[int]:
    """Token counts as ``mlpjit warm --tokens`` reads them ("1-8", "1,2,4"), sorted, each
    at most ``most`` (None: no bound)."""
    from mlpjit.cli import parse_tokens

    try:
        counts = parse_tokens(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if most is not None and counts[-1] > most:
        raise argparse.ArgumentTypeError(
            f"token counts must be in 1..{most} (the decode sizes the kernels take), got {text!r}"
        )
    return counts


def add_rounds(parser: argparse.ArgumentParser) -> None:
    """The sweeps' ``--rounds`` (mlpjit.testing.layers.graph_rounds): a positive int,
    default 2."""
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=2,
        help="time every variant once per round, odd rounds in reverse order; a variant's "
        "time is the mean of its rounds' medians (default 2)",
    )


def add_norm_between(parser: argparse.ArgumentParser) -> None:
    """The layer sweeps' ``--norm-between`` (mlpjit.testing.layers.norm_between)."""
    parser.add_argument(
        "--norm-between",
        action="store_true",
        help="before every layer, one torch elementwise kernel on x launched without PDL, "
        "as a server's norm is: each gate_up then starts once the previous layer is done "
        "instead of streaming during its down; rows also get that kernel's own time per "
        "layer (norm_us)",
    )
