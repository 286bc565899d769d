"""Option values of the `mlpjit` command: text -> checked value, or a one-line UsageError
(a ValueError) naming the option and what it takes. ``arg_type`` turns one of these into an
argparse type, so a bad value is a usage error (exit status 2). ``check_settings`` checks
the MLPJIT_* settings a command relies on before it starts."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any

from mlpjit.errors import UsageError
from mlpjit.jit.bounds import MAX_DIGITS, bounded

__all__ = [
    "MAX_SIZE",
    "MAX_WARM_TOKENS",
    "arg_type",
    "bounded_int",
    "check_settings",
    "parse_age",
    "parse_size",
    "parse_tokens",
]

# Largest token count `warm --tokens` takes. The kernels take 1-8 tokens and larger counts
# run the stock path (no kernel to warm), so this only bounds typos such as 1-99999999.
MAX_WARM_TOKENS = 1024
MAX_SIZE = 1 << 60  # --max-size: 1 EiB, far above any disk
_INT_RE = re.compile(r"[+-]?\d+")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smhdw])\s*$", re.IGNORECASE)
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str, what: str = "--max-size") -> int:
    """'500M', '2G', '1.5GiB', '4096' -> bytes (binary multiples) in [0, MAX_SIZE];
    UsageError naming ``what`` and the allowed range otherwise."""
    match = _SIZE_RE.match(text)
    if not match:
        raise UsageError(
            f"{what} must look like 4096, 500K, 500M, 2G or 1T, got {text!r}",
            argument=what,
            value=text,
        )
    scale = 1024 ** " kmgt".index(match.group(2).lower() or " ")
    try:
        number = bounded(match.group(1), what, 0, MAX_SIZE / scale)
    except ValueError:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise UsageError(
            f"{what} must be a size from 0 to {MAX_SIZE >> 40}T, got {shown!r}",
            argument=what,
            value=shown,
        ) from None
    return min(int(number * scale), MAX_SIZE)


def parse_age(text: str, what: str = "--older-than") -> float:
    """'7d', '12h', '30m', '45s', '2w' -> seconds; UsageError otherwise."""
    match = _AGE_RE.match(text)
    if not match:
        raise UsageError(
            f"age must look like 45s, 30m, 12h, 7d or 2w, got {text!r}", argument=what, value=text
        )
    return float(match.group(1)) * _AGE_UNITS[match.group(2).lower()]


def parse_tokens(text: str) -> list[int]:
    """'1-8', '1,2,4', '1-4,8' -> sorted distinct token counts in 1..MAX_WARM_TOKENS."""
    counts: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise UsageError(
                f"tokens must look like 1-8 or 1,2,4, got {text!r}", argument="--tokens", value=text
            ) from None
        if first < 1 or last < first:
            raise UsageError(
                f"tokens must be positive ranges like 1-8, got {text!r}",
                argument="--tokens",
                value=text,
            )
        if last > MAX_WARM_TOKENS:  # checked before the range is built: no huge lists
            raise UsageError(
                f"--tokens must be within 1-{MAX_WARM_TOKENS} (the kernels take 1-8 tokens; "
                f"more run the stock path and need no kernel), got {text!r}",
                argument="--tokens",
                value=text,
            )
        counts.update(range(first, last + 1))
    return sorted(counts)


def scalar(text: str, name: str) -> int | float | bool | str | None:
    """A value of option ``name``: int, float, true/false, none, else the string itself.
    What reads as a number goes through jit.bounds (finite, at most MAX_DIGITS long), so
    1e999, nan and 5000 digits are a one-line error naming the option, not inf or a crash."""
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        float(stripped)  # every number form Python reads, inf, nan and 5000 digits included
    except ValueError:
        return text
    integer = _INT_RE.fullmatch(stripped) is not None
    high = 10**MAX_DIGITS if integer else sys.float_info.max  # any finite float
    return bounded(stripped, name, -high, high, integer=integer)


def param_arg(text: str, max_values: int) -> tuple[str, list[Any]]:
    """'name=value' or 'name=v1,v2' (each value list multiplies the requests; at most
    ``max_values`` values)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise UsageError(f"--param must be name=value, got {text!r:.80}", argument="--param")
    name = name.strip()
    values = value.split(",")
    if len(values) > max_values:
        raise UsageError(
            f"--param {name} lists {len(values)} values; the --param lists may multiply into "
            f"at most {max_values} requests",
            argument="--param",
        )
    return name, [scalar(v, f"--param {name}") for v in values]


def bounded_int(name: str, low: int, high: int) -> Callable[[str], int]:
    """A parser of an int option in [low, high] (jit.bounds), named ``name``."""

    def parse(text: str) -> int:
        return int(bounded(text, name, low, high, integer=True))

    parse.__name__ = name.lstrip("-")
    return parse


def limit_arg(text: str) -> float:
    """--limit: a finite BF16 number > 0 (as DenseMlp takes it)."""
    from mlpjit.kernels.fp8_gemv.params import check_limit

    return check_limit(scalar(text, "--limit"), "--limit")


def layers_arg(text: str) -> tuple[str, ...]:
    """'dense,shared' -> the --model layers to warm, in models.LAYERS order."""
    from mlpjit.models import LAYERS

    items = [s.strip() for s in text.split(",")]
    if not all(item in LAYERS for item in items):
        raise UsageError(
            f"layers must be a comma list of {' and/or '.join(LAYERS)}, got {text!r}",
            argument="--layers",
            value=text,
        )
    return tuple(layer for layer in LAYERS if layer in items)


def key_prefix_arg(text: str) -> str:
    """A cache key prefix: 1-64 hex characters, lowercased."""
    from mlpjit.jit.remote.fleet import check_prefixes

    return check_prefixes([text])[0]


def arch_arg(text: str) -> str:
    """--arch: a CUDA arch name such as sm_90a."""
    from mlpjit.jit.spec import check_arch

    return check_arch(text, "--arch")


def arg_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Turn a ValueError of ``parse`` into an argparse usage error (exit status 2)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = parse.__name__.lstrip("_").removesuffix("_arg")  # argparse shows it
    return convert


def check_settings() -> None:
    """Read the MLPJIT_* settings a command relies on, so a bad value fails before any work
    (UsageError naming the variable) instead of on the rare lock wait that reads it."""
    from mlpjit.jit import config

    for name, read in (
        ("MLPJIT_LOCK_TIMEOUT", config.lock_timeout),
        ("MLPJIT_CACHE_WHEELS", config.cache_wheels),
    ):
        try:
            read()
        except ValueError as err:
            raise UsageError(str(err), argument=name) from None
