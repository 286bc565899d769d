"""Every MLPJIT_* environment variable, typed and read at call time.

One reader per variable so the rest of the package never touches ``os.environ`` directly and
a bad value fails at the point of use with a ValueError that names the variable. Values are
read on every call (not cached at import) so tests and long-lived servers see changes.
"""

from __future__ import annotations

import math
import os
import re
import stat
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from mlpjit.jit.spec import check_arch

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_REMOTE_PREFIX",
    "DEFAULT_REMOTE_TIMEOUT",
    "ENV_VARS",
    "MAX_REMOTE_SECRET_BYTES",
    "MIN_REMOTE_SECRET_BYTES",
    "EnvVar",
    "arch_override",
    "cache_dir",
    "cache_path",
    "check_remote_url",
    "kernel_modules",
    "lock_timeout",
    "record_file",
    "redact_url",
    "remote_cache_url",
    "remote_prefix",
    "remote_key_file",
    "remote_secret",
    "remote_timeout",
    "remote_ttl",
]

DEFAULT_LOCK_TIMEOUT = 300.0
DEFAULT_REMOTE_PREFIX = "mlpjit:"
DEFAULT_REMOTE_TIMEOUT = 2.0  # seconds, for connecting to Redis and for every reply
MIN_REMOTE_SECRET_BYTES = 32  # the fleet key: as many bytes as the HMAC-SHA256 output
MAX_REMOTE_SECRET_BYTES = 4096  # a bigger file is not a key (and is not read whole)
_REMOTE_SCHEMES = ("redis", "rediss")
_MIN_SECONDS = 0.001  # Redis expiries are whole milliseconds


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
            "Prefix of every Redis key mlpjit writes (entries, aliases, compile locks and the "
            "fleet's hit counters), so several fleets can share one Redis database.",
        ),
        EnvVar(
            "MLPJIT_REMOTE_TTL",
            "(no expiry)",
            "Seconds an uploaded entry lives in Redis after its upload (float > 0).",
        ),
        EnvVar(
            "MLPJIT_REMOTE_TIMEOUT",
            "2",
            "Seconds for connecting to Redis and for each reply (float > 0). After a failure "
            "the remote is skipped for 30 s, with one warning.",
        ),
        EnvVar(
            "MLPJIT_REMOTE_KEY_FILE",
            "(unsigned)",
            "File holding the fleet cache's secret (at least 32 bytes, e.g. head -c 32 "
            "/dev/urandom; a regular file owned by you or root, mode 0600 or 0400; the same "
            "file on every node). Entries are signed with it (HMAC-SHA256) and a remote entry "
            "is used only if its signature verifies. Unset: entries are checked for integrity "
            "only, and anyone who can write the Redis keys can make nodes run their code.",
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


# --------------------------------------------------------------------- the fleet cache


def redact_url(url: str) -> str:
    """``url`` with its password (in the userinfo or a query option) replaced by ***.

    Every message that names a remote cache URL goes through this: a Redis password must
    not end up in logs, doctor reports or CI output.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        query = [(k, "***" if "pass" in k.lower() else v) for k, v in query]
        return urllib.parse.urlunsplit(
            (parts.scheme, netloc, parts.path, urllib.parse.urlencode(query), "")
        )
    except ValueError:
        return "<unparsable URL>"


def check_remote_url(url: str, what: str = "remote cache URL") -> str:
    """Return ``url`` if it is redis:// or rediss:// with a host and a numeric database (if
    any); ValueError naming ``what`` (password redacted) otherwise.

    redis-py silently uses database 0 for a path like "/cache": a typo must not make two
    fleets share a database.
    """
    if not isinstance(url, str):
        raise ValueError(f"{what} must be a str, got {type(url).__name__}")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError as err:
        raise ValueError(f"{what} {redact_url(url)!r} is malformed ({err})") from None
    if parts.scheme not in _REMOTE_SCHEMES or not parts.hostname:
        raise ValueError(
            f"{what} must be redis://[user:pass@]host:port/db or rediss://..., "
            f"got {redact_url(url)!r}"
        )
    if not re.fullmatch(r"/?|/[0-9]+/?", parts.path):
        raise ValueError(
            f"{what} {redact_url(url)!r}: the database must be a number, e.g. redis://host:6379/0"
        )
    return url


def _seconds(name: str, default: float | None) -> float | None:
    """A number of seconds (at least 1 ms) from variable ``name``, or ``default`` if unset."""
    value = _get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < _MIN_SECONDS:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return seconds


def remote_cache_url() -> str | None:
    """The fleet cache's Redis URL (MLPJIT_REMOTE_CACHE, checked), or None when unset."""
    value = _get("MLPJIT_REMOTE_CACHE")
    return None if value is None else check_remote_url(value.strip(), "MLPJIT_REMOTE_CACHE")


def remote_prefix() -> str:
    """The prefix of every Redis key mlpjit writes (MLPJIT_REMOTE_PREFIX, default "mlpjit:").

    Printable ASCII without spaces: the prefix is also a SCAN pattern and appears in logs.
    """
    value = _get("MLPJIT_REMOTE_PREFIX")
    if value is None:
        return DEFAULT_REMOTE_PREFIX
    prefix = value.strip()
    if not all("!" <= c <= "~" for c in prefix):
        raise ValueError(
            f"MLPJIT_REMOTE_PREFIX must be printable ASCII without spaces, got {value!r}"
        )
    return prefix


def remote_ttl() -> float | None:
    """Seconds an uploaded entry lives in Redis (MLPJIT_REMOTE_TTL), or None: no expiry."""
    return _seconds("MLPJIT_REMOTE_TTL", None)


def remote_timeout() -> float:
    """Seconds for a Redis connect and for each reply (MLPJIT_REMOTE_TIMEOUT, default 2)."""
    seconds = _seconds("MLPJIT_REMOTE_TIMEOUT", DEFAULT_REMOTE_TIMEOUT)
    assert seconds is not None
    return seconds


def _key_file_problem(path: Path, st: os.stat_result) -> str | None:
    """Why the opened key file ``st`` cannot hold the fleet's secret, or None.

    A secret that another user can read lets them sign entries; one they can write lets
    them pick it; one they own they can chmod either way.
    """
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {st.st_uid}, not by this user or root"
    if st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode)
        return f"has mode {mode:04o}: group/other may access it (chmod 0400 {path})"
    return None


def _read_secret(path: Path) -> bytes:
    """The bytes of the key file at ``path``; ValueError (one line) if it cannot be the key.

    O_NOFOLLOW: the path itself must not be a symlink (whoever can repoint it picks the
    key); O_NONBLOCK: a FIFO there fails the regular-file check instead of hanging.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ValueError(f"MLPJIT_REMOTE_KEY_FILE {path}: no such file") from None
    except OSError as err:
        why = "is a symlink" if path.is_symlink() else f"cannot be opened ({err.strerror})"
        raise ValueError(f"MLPJIT_REMOTE_KEY_FILE {path} {why}") from None
    try:
        problem = _key_file_problem(path, os.fstat(fd))
        if problem is not None:
            raise ValueError(f"MLPJIT_REMOTE_KEY_FILE {path} {problem}")
        chunks, size = [], 0
        while size <= MAX_REMOTE_SECRET_BYTES and (chunk := os.read(fd, 4096)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise ValueError(f"MLPJIT_REMOTE_KEY_FILE {path} cannot be read ({err.strerror})") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def remote_key_file() -> Path | None:
    """The path MLPJIT_REMOTE_KEY_FILE names, or None (read the secret with remote_secret)."""
    value = _get("MLPJIT_REMOTE_KEY_FILE")
    return None if value is None else Path(value.strip()).expanduser()


def remote_secret() -> bytes | None:
    """The fleet cache's signing secret: the bytes of the file MLPJIT_REMOTE_KEY_FILE names
    (all of them, a trailing newline included), or None when the variable is unset.

    The file must be a regular file (not a symlink), owned by this user or root, without
    group/other permissions, holding MIN_REMOTE_SECRET_BYTES to MAX_REMOTE_SECRET_BYTES
    bytes; else ValueError naming the variable and the problem. The secret itself is never
    part of a message.
    """
    path = remote_key_file()
    if path is None:
        return None
    secret = _read_secret(path)
    if len(secret) < MIN_REMOTE_SECRET_BYTES or len(secret) > MAX_REMOTE_SECRET_BYTES:
        size = len(secret) if len(secret) < MIN_REMOTE_SECRET_BYTES else "too many"
        raise ValueError(
            f"MLPJIT_REMOTE_KEY_FILE {path} holds {size} bytes; a fleet key is "
            f"{MIN_REMOTE_SECRET_BYTES} to {MAX_REMOTE_SECRET_BYTES} bytes "
            f"(head -c 32 /dev/urandom > {path})"
        )
    return secret
