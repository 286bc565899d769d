"""One reader for every number that comes from outside: bounded, finite, never a crash.

Environment variables, CLI sizes, manifest fields outside the checksum, Redis values and
checkpoint configs are all untrusted text or JSON. ``int("9" * 5000)`` raises, ``float``
overflows to inf, ``10**400`` makes ``float()`` raise OverflowError and ``1e308`` seconds
overflows a timedelta; each of these must become a one-line error naming where the value
came from (``bounded``) or a safe fallback (``clamped``), never a traceback deep inside.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MAX_DIGITS", "bounded", "clamped", "shown"]

MAX_DIGITS = 40  # longer number strings are refused before int()/float() sees them


def _as_number(value: Any, integer: bool) -> float | int | None:
    """``value`` as a finite int or float, or None when it is not one (bool is not a number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text or len(text) > MAX_DIGITS:
            return None
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            if not integer:
                return None
            try:
                as_float = float(text)
            except ValueError:
                return None
            if not math.isfinite(as_float) or as_float != int(as_float):
                return None
            value = int(as_float)
    if isinstance(value, int):
        if abs(value) > 10**MAX_DIGITS:
            return None
        return value if integer else float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if integer:
            return int(value) if value == int(value) and abs(value) <= 10**MAX_DIGITS else None
        return value
    return None


def bounded(
    value: Any,
    name: str,
    lo: float,
    hi: float,
    *,
    integer: bool = False,
) -> float | int:
    """``value`` (number or numeric string) checked to lie in [lo, hi], else ValueError.

    The message is one line naming ``name`` (an env var, a CLI argument, a config key) and
    the allowed range.
    """
    number = _as_number(value, integer)
    kind = "an integer" if integer else "a number"
    if number is None or not lo <= number <= hi:
        raise ValueError(
            f"{name} must be {kind} in [{_limit(lo)}, {_limit(hi)}] (got {shown(value)})"
        )
    return number


def _limit(bound: float) -> str:
    """A range end for a message: integers in full (1048576, not 1.04858e+06) up to 12
    digits, others as %g."""
    if float(bound).is_integer() and abs(bound) < 10**12:
        return str(int(bound))
    return f"{bound:g}"


def shown(value: Any) -> str:
    """``value`` for an error message, at most 60 characters (an int of thousands of
    digits cannot even be turned into a string)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**60:
        return f"an integer of {value.bit_length()} bits"
    shown = str(value) if isinstance(value, int) else repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def clamped(value: Any, lo: float, hi: float, default: float, *, integer: bool = False):
    """``value`` as a number clamped to [lo, hi]; ``default`` where it is not a number."""
    number = _as_number(value, integer)
    if number is None:
        return default
    return min(max(number, lo), hi)
