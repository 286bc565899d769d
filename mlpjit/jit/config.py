"""Every MLPJIT_* environment variable, typed and read at call time.

One reader per variable so the rest of the package never touches ``os.environ`` directly and
a bad value fails at the point of use with a ValueError that names the variable. Values are
read on every call (not cached at import) so tests and long-lived servers see changes.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ENV_VARS",
    "EnvVar",
    "arch_override",
    "cache_dir",
    "cache_path",
    "check_arch",
    "lock_timeout",
    "record_file",
]

DEFAULT_LOCK_TIMEOUT = 300.0

# "sm_90a", "sm_100a", "sm_80", "sm_100f": what CuTe DSL accepts as a target name.
_ARCH_RE = re.compile(r"^sm_[0-9]{2,3}[af]?$")


@dataclass(frozen=True)
class EnvVar:
    """One documented environment variable (the README table is generated from these)."""

    name: str
    default: str
    doc: str


ENV_VARS: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar(
            "MLPJIT_CACHE_DIR",
            "platformdirs user cache dir for 'mlpjit'",
            "Writable compile cache root. Created 0700; refused if writable by group/other.",
        ),
        EnvVar(
            "MLPJIT_CACHE_PATH",
            "(none)",
            "os.pathsep-separated read-only cache roots (prebuilt caches), searched after "
            "MLPJIT_CACHE_DIR.",
        ),
        EnvVar(
            "MLPJIT_LOCK_TIMEOUT",
            str(int(DEFAULT_LOCK_TIMEOUT)),
            "Seconds a process waits for another one compiling the same kernel before it "
            "compiles and publishes the kernel itself (float > 0).",
        ),
        EnvVar(
            "MLPJIT_ARCH",
            "(the current GPU's arch)",
            "Target arch (e.g. sm_90a) used when no GPU is visible, e.g. to warm a cache on a "
            "CPU-only build machine.",
        ),
        EnvVar(
            "MLPJIT_RECORD",
            "(off)",
            "File to which every process appends one JSON line per distinct kernel it needed "
            "(kernel, params, arch): a list to warm a cache with.",
        ),
    )
}


def _get(name: str) -> str | None:
    """The variable's value, or None when unset or empty (empty means 'not set')."""
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value


def cache_dir() -> Path:
    """The writable cache root: MLPJIT_CACHE_DIR, else the user cache dir for 'mlpjit'."""
    value = _get("MLPJIT_CACHE_DIR")
    if value is not None:
        return Path(value).expanduser()
    # platformdirs is cheap, but only needed here; keep `import mlpjit` minimal.
    import platformdirs

    return Path(platformdirs.user_cache_dir("mlpjit", appauthor=False))


def cache_path() -> tuple[Path, ...]:
    """Read-only cache layers from MLPJIT_CACHE_PATH (os.pathsep list, empty items ignored)."""
    value = _get("MLPJIT_CACHE_PATH")
    if value is None:
        return ()
    return tuple(Path(p).expanduser() for p in value.split(os.pathsep) if p.strip())


def lock_timeout() -> float:
    """Seconds to wait on another process's compile (MLPJIT_LOCK_TIMEOUT, default 300)."""
    value = _get("MLPJIT_LOCK_TIMEOUT")
    if value is None:
        return DEFAULT_LOCK_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"MLPJIT_LOCK_TIMEOUT must be a positive number of seconds, got {value!r}")
    return seconds


def check_arch(arch: str, what: str = "arch") -> str:
    """Return ``arch`` if it looks like a CUDA target name (sm_90a, sm_100a, ...), else raise."""
    if not isinstance(arch, str) or not _ARCH_RE.match(arch):
        raise ValueError(
            f"{what} must be a CUDA target name like 'sm_90a' or 'sm_100a', got {arch!r}"
        )
    return arch


def arch_override() -> str | None:
    """The default target arch from MLPJIT_ARCH, or None when unset."""
    value = _get("MLPJIT_ARCH")
    if value is None:
        return None
    return check_arch(value.strip(), "MLPJIT_ARCH")


def record_file() -> Path | None:
    """Where to append the kernels this process needed (MLPJIT_RECORD), or None."""
    value = _get("MLPJIT_RECORD")
    return None if value is None else Path(value).expanduser()
