"""Every MLPJIT_* environment variable, typed and read at call time.

One reader per variable so the rest of the package never touches ``os.environ`` directly and
a bad value fails at the point of use with a ValueError that names the variable. Values are
read on every call (not cached at import) so tests and long-lived servers see changes.
"""

from __future__ import annotations

import os
import re
import stat
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from mlpjit.jit.bounds import seconds
from mlpjit.jit.spec import check_arch

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_REMOTE_PREFIX",
    "DEFAULT_REMOTE_TIMEOUT",
    "ENV_VARS",
    "LOCK_TIMEOUT_RANGE",
    "REMOTE_TIMEOUT_RANGE",
    "REMOTE_TTL_RANGE",
    "REMOTE_URL_OPTIONS",
    "MAX_REMOTE_SECRET_BYTES",
    "MIN_REMOTE_SECRET_BYTES",
    "EnvVar",
    "arch_override",
    "cache_dir",
    "cache_path",
    "cache_wheels",
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
# Seconds a process waits for another one's compile (MLPJIT_LOCK_TIMEOUT): 10 ms to a day.
# A wait of 1e308 s overflows every timed wait (threading, filelock) with an OverflowError.
LOCK_TIMEOUT_RANGE = (0.01, 86400.0)
DEFAULT_REMOTE_PREFIX = "mlpjit:"
DEFAULT_REMOTE_TIMEOUT = 2.0  # seconds, for connecting to Redis and for every reply
MIN_REMOTE_SECRET_BYTES = 32  # the fleet key: as many bytes as the HMAC-SHA256 output
MAX_REMOTE_SECRET_BYTES = 4096  # a bigger file is not a key (and is not read whole)
_REMOTE_SCHEMES = ("redis", "rediss")
# Seconds an uploaded entry may live (MLPJIT_REMOTE_TTL): a second at least, about three
# years at most (Redis refuses an expiry past the end of its clock; a longer one means
# "no expiry", which is the default).
REMOTE_TTL_RANGE = (1.0, 1e8)
# Seconds for a Redis connect and each reply (MLPJIT_REMOTE_TIMEOUT): 10 ms to 5 minutes.
REMOTE_TIMEOUT_RANGE = (0.01, 300.0)


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
            "MLPJIT_CACHE_WHEELS",
            "1",
            "0 turns off the cubin wheels: installed Python distributions (written by `mlpjit "
            "cache export --wheel`) whose `mlpjit.cache_dirs` entry point names a read-only "
            "cache dir, searched after MLPJIT_CACHE_PATH with the same trust rules.",
        ),
        EnvVar(
            "MLPJIT_LOCK_TIMEOUT",
            str(int(DEFAULT_LOCK_TIMEOUT)),
            "Seconds a process waits for another one compiling the same kernel before it "
            "compiles and publishes the kernel itself (a number from "
            f"{LOCK_TIMEOUT_RANGE[0]:g} to {LOCK_TIMEOUT_RANGE[1]:g}, a day). With the fleet "
            "cache, a "
            "process's waits for other nodes add up to this at most, over all its kernels.",
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
            "Seconds an uploaded entry lives in Redis after its upload (a number from "
            f"{REMOTE_TTL_RANGE[0]:g} to {REMOTE_TTL_RANGE[1]:g}, about 3 years).",
        ),
        EnvVar(
            "MLPJIT_REMOTE_TIMEOUT",
            "2",
            "Seconds for connecting to Redis and for each reply (a number from "
            f"{REMOTE_TIMEOUT_RANGE[0]:g} to {REMOTE_TIMEOUT_RANGE[1]:g}). After a failure "
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
    """Read-only cache dirs from MLPJIT_CACHE_PATH (os.pathsep list, empty items ignored)."""
    value = _get("MLPJIT_CACHE_PATH")
    if value is None:
        return ()
    return tuple(Path(p).expanduser() for p in value.split(os.pathsep) if p.strip())


_FLAGS = {"1": True, "true": True, "yes": True, "on": True}
_FLAGS |= {"0": False, "false": False, "no": False, "off": False}


def cache_wheels() -> bool:
    """Whether installed cubin wheels are read-only cache tiers (MLPJIT_CACHE_WHEELS, default
    on; 0/false/no/off turn it off). ValueError naming the variable for another value."""
    value = _get("MLPJIT_CACHE_WHEELS")
    if value is None:
        return True
    flag = _FLAGS.get(value.strip().lower())
    if flag is None:
        raise ValueError(f"MLPJIT_CACHE_WHEELS must be 1 or 0 (on or off), got {_shown(value)}")
    return flag


def lock_timeout() -> float:
    """Seconds to wait on another process's compile (MLPJIT_LOCK_TIMEOUT, default 300),
    within LOCK_TIMEOUT_RANGE; ValueError naming the variable and the range otherwise."""
    seconds = _seconds("MLPJIT_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT, LOCK_TIMEOUT_RANGE)
    assert seconds is not None
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


# The URL query options mlpjit passes on to redis-py, by scheme. Any other option would
# either fail at the first Redis call (redis-py hands it to a connection class that does not
# take it: a TypeError) or override a setting mlpjit makes (socket_timeout over
# MLPJIT_REMOTE_TIMEOUT, db over the URL's path).
REMOTE_URL_OPTIONS = {
    "redis": (),
    "rediss": (
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_cert_reqs",
        "ssl_check_hostname",
    ),
}
MAX_HOST_CHARS = 253  # the longest DNS name
# Bidirectional controls (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069): a host shown
# in a message must read as it resolves.
_BIDI_RE = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _host_problem(host: str) -> str | None:
    """Why ``host`` cannot be a Redis host name, or None."""
    if len(host) > MAX_HOST_CHARS:
        return f"its host is {len(host)} characters long, over {MAX_HOST_CHARS}"
    if _BIDI_RE.search(host):
        return "its host holds a bidirectional control character"
    if not host.isprintable() or " " in host:
        return "its host holds a control character or a space"
    if host.isascii() and ":" in host:
        return None  # an IPv6 address, which is no DNS name
    try:
        encoded = host.encode("idna")
    except UnicodeError:
        return (
            "its host is not a valid host name (a label is empty, over 63 characters, or not IDNA)"
        )
    if len(encoded) > MAX_HOST_CHARS:
        return f"its host is over {MAX_HOST_CHARS} characters once IDNA-encoded"
    return None


def check_remote_url(url: str, what: str = "remote cache URL") -> str:
    """Return ``url`` if it is redis:// or rediss:// with a valid host (at most 253
    characters, printable, IDNA-encodable, no bidirectional controls), a numeric database
    (if any) and only the query options of REMOTE_URL_OPTIONS for its scheme; ValueError
    naming ``what`` (one line, password redacted) otherwise.

    Checked when the URL is read, so a bad value is one line naming the variable rather
    than a TypeError or an idna error from deep inside redis-py at the first call; and
    redis-py silently uses database 0 for a path like "/cache": a typo must not make two
    fleets share a database.
    """
    if not isinstance(url, str):
        raise ValueError(f"{what} must be a str, got {type(url).__name__}")
    shown = _shown_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
        options = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as err:
        raise ValueError(f"{what} {shown} is malformed ({_shown(str(err))})") from None
    if parts.scheme not in _REMOTE_SCHEMES or not parts.hostname:
        raise ValueError(
            f"{what} must be redis://[user:pass@]host:port/db or rediss://..., got {shown}"
        )
    problem = _host_problem(parts.hostname)
    if problem is not None:
        raise ValueError(f"{what} {shown}: {problem}")
    if not re.fullmatch(r"/?|/[0-9]+/?", parts.path):
        raise ValueError(f"{what} {shown}: the database must be a number, e.g. redis://host:6379/0")
    allowed = REMOTE_URL_OPTIONS[parts.scheme]
    for name, _ in options:
        if name not in allowed:
            listed = ", ".join(allowed) if allowed else "none (TLS options need rediss://)"
            raise ValueError(
                f"{what} {shown}: option {_shown(name)} does not apply; allowed options for "
                f"{parts.scheme}:// are {listed}"
            )
    return url


def _shown(text: str, limit: int = 80) -> str:
    """``text`` for a one-line message: repr'd (controls and bidi escaped), cut short."""
    text = ascii(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown_url(url: str) -> str:
    """A URL for a one-line message: password redacted, escaped, cut short."""
    return _shown(redact_url(url), 120)


def _seconds(name: str, default: float | None, bounds: tuple[float, float]) -> float | None:
    """A number of seconds in ``bounds`` from variable ``name`` (bounds.seconds), or
    ``default`` if unset."""
    value = _get(name)
    return default if value is None else seconds(value, name, bounds, text=True)


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
    return _seconds("MLPJIT_REMOTE_TTL", None, REMOTE_TTL_RANGE)


def remote_timeout() -> float:
    """Seconds for a Redis connect and for each reply (MLPJIT_REMOTE_TIMEOUT, default 2)."""
    seconds = _seconds("MLPJIT_REMOTE_TIMEOUT", DEFAULT_REMOTE_TIMEOUT, REMOTE_TIMEOUT_RANGE)
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
