"""Validation helpers every kernel's params share: one-line ValueErrors naming the field.

Plain Python (no cutlass): params dataclasses call these in __post_init__.
"""

from __future__ import annotations

from typing import Any

from mlpjit.jit.bounds import shown

__all__ = ["check_bool", "check_choice", "check_int"]


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` if it is an int (not a bool) in [low, high] (no upper bound: None)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {shown(value)}")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {allowed}, got {shown(value)}")
    return value


def check_bool(name: str, value: Any) -> None:
    """Nothing if ``value`` is a bool (0 and 1 are not)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def check_choice(name: str, value: Any, allowed: tuple[int, ...]) -> int:
    """``value`` if it is an int (not a bool, not a float) among ``allowed``."""
    if type(value) is not int or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {shown(value)}")
    return value
