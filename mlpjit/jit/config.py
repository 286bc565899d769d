"""Every MLPJIT_* environment variable, typed and read at call time.

One reader per variable so the rest of the package never touches ``os.environ`` directly and
a bad value fails at the point of use with a ValueError that names the variable. Values are
read on every call (not cached at import) so tests and long-lived servers see changes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from mlpjit.jit.spec import check_arch

__all__ = [
    "ENV_VARS",
    "EnvVar",
    "arch_override",
    "cache_dir",
    "cache_path",
    "lock_timeout",
    "kernel_modules",
    "record_file",
]

DEFAULT_LOCK_TIMEOUT = 300.0



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
            "MLPJIT_KERNEL_MODULES",
            "(none)",
            "Comma-separated modules `mlpjit warm` imports besides mlpjit.kernels, each "
            "registering kernel specs (mlpjit.jit.spec.register): warm your own kernels, or "
            "mlpjit.testing.smoke in tests.",
        ),
        EnvVar(
            "MLPJIT_REMOTE_CACHE",
            "(off)",
            "Fleet compile cache on Redis: redis://[user:pass@]host:port/db, or rediss:// for "
            "TLS (a private CA as ?ssl_ca_certs=/path/ca.pem). Remote entries are verified "
            "like local ones. Needs pip install 'mlpjit[redis]'.",
        ),
        EnvVar(
            "MLPJIT_REMOTE_PREFIX",
            "mlpjit:",
            "Prefix of every Redis key mlpjit writes (entries and compile locks), so several "
            "fleets can share one Redis database.",
        ),
        EnvVar(
            "MLPJIT_REMOTE_TTL",
            "(no expiry)",
            "Seconds an uploaded entry lives in Redis (float > 0).",
        ),
        EnvVar(
            "MLPJIT_REMOTE_TIMEOUT",
            "2",
            "Seconds for connecting to Redis and for each reply (float > 0). After a failure "
            "the remote is skipped for 30 s, with one warning.",
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


def kernel_modules() -> tuple[str, ...]:
    """Extra kernel-spec modules the CLI imports (MLPJIT_KERNEL_MODULES, comma-separated)."""
    value = _get("MLPJIT_KERNEL_MODULES")
    if value is None:
        return ()
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"MLPJIT_KERNEL_MODULES must list module names, got {name!r}")
    return names
