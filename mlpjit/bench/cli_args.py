"""argparse value types the benchmark and demo command lines share.

Each raises argparse.ArgumentTypeError with a one-line message naming what is allowed, so
argparse exits 2 with "argument --NAME: <message>".
"""

from __future__ import annotations

import argparse

__all__ = ["positive_int", "token_list"]


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
