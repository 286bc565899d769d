"""mlpjit.jit.config: typed MLPJIT_* readers, read at call time, clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlpjit.jit import config
from mlpjit.jit.spec import check_arch


def test_every_reader_has_a_documented_variable():
    assert set(config.ENV_VARS) == {
        "MLPJIT_CACHE_DIR",
        "MLPJIT_CACHE_PATH",
        "MLPJIT_CACHE_WHEELS",
        "MLPJIT_LOCK_TIMEOUT",
        "MLPJIT_ARCH",
        "MLPJIT_RECORD",
        "MLPJIT_KERNEL_MODULES",
        "MLPJIT_REMOTE_CACHE",
        "MLPJIT_REMOTE_PREFIX",
        "MLPJIT_REMOTE_TTL",
        "MLPJIT_REMOTE_TIMEOUT",
        "MLPJIT_REMOTE_KEY_FILE",
    }
    for name, var in config.ENV_VARS.items():
        assert var.name == name and len(var.doc) > 20 and var.default


def test_cache_dir_from_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("MLPJIT_CACHE_DIR", str(tmp_path / "x"))
    assert config.cache_dir() == tmp_path / "x"
    monkeypatch.setenv("MLPJIT_CACHE_DIR", "")
    default = config.cache_dir()
    assert default.is_absolute() and "mlpjit" in default.parts[-1]


@pytest.mark.parametrize(
    "value, on", [(None, True), ("", True), ("1", True), ("on", True), ("0", False), ("OFF", False)]
)
def test_cache_wheels_is_on_unless_turned_off(monkeypatch, value, on: bool):
    if value is None:
        monkeypatch.delenv("MLPJIT_CACHE_WHEELS", raising=False)
    else:
        monkeypatch.setenv("MLPJIT_CACHE_WHEELS", value)
    assert config.cache_wheels() is on


def test_a_bad_cache_wheels_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("MLPJIT_CACHE_WHEELS", "maybe")
    with pytest.raises(ValueError, match="MLPJIT_CACHE_WHEELS must be 1 or 0.*'maybe'"):
        config.cache_wheels()


def test_cache_path_is_a_pathsep_list(monkeypatch):
    monkeypatch.setenv("MLPJIT_CACHE_PATH", os.pathsep.join(["/a", "", "/b/c"]))
    assert config.cache_path() == (Path("/a"), Path("/b/c"))
    monkeypatch.delenv("MLPJIT_CACHE_PATH")
    assert config.cache_path() == ()


def test_lock_timeout(monkeypatch):
    assert config.lock_timeout() == config.DEFAULT_LOCK_TIMEOUT
    monkeypatch.setenv("MLPJIT_LOCK_TIMEOUT", "2.5")
    assert config.lock_timeout() == 2.5
    lo, hi = config.LOCK_TIMEOUT_RANGE
    monkeypatch.setenv("MLPJIT_LOCK_TIMEOUT", str(hi))
    assert config.lock_timeout() == hi
    for bad in ("0", "-1", "abc", "nan", "inf", "1e308", "1e12", str(hi + 1), "9" * 5000):
        monkeypatch.setenv("MLPJIT_LOCK_TIMEOUT", bad)
        with pytest.raises(ValueError) as err:
            config.lock_timeout()
        message = str(err.value)
        assert message.startswith(f"MLPJIT_LOCK_TIMEOUT must be a number in [{lo:g}, {hi:g}]")
        assert "\n" not in message and len(message) < 200, message


def test_arch_override(monkeypatch):
    assert config.arch_override() is None
    monkeypatch.setenv("MLPJIT_ARCH", "sm_90a")
    assert config.arch_override() == "sm_90a"
    monkeypatch.setenv("MLPJIT_ARCH", "hopper")
    with pytest.raises(ValueError, match="MLPJIT_ARCH"):
        config.arch_override()


def test_check_arch():
    for good in ("sm_90a", "sm_100a", "sm_80", "sm_120f"):
        assert check_arch(good) == good
    for bad in ("sm90a", "SM_90A", "sm_9", "", None, "sm_90a "):
        with pytest.raises(ValueError, match="arch"):
            check_arch(bad)


def test_record_file(monkeypatch, tmp_path):
    assert config.record_file() is None
    monkeypatch.setenv("MLPJIT_RECORD", str(tmp_path / "r.jsonl"))
    assert config.record_file() == tmp_path / "r.jsonl"


def test_remote_settings_unset_are_the_defaults(monkeypatch):
    for name in (
        "MLPJIT_REMOTE_CACHE",
        "MLPJIT_REMOTE_PREFIX",
        "MLPJIT_REMOTE_TTL",
        "MLPJIT_REMOTE_TIMEOUT",
        "MLPJIT_REMOTE_KEY_FILE",
    ):
        monkeypatch.setenv(name, " ")  # blank means unset, as for every variable
    assert config.remote_cache_url() is None
    assert config.remote_secret() is None
    assert config.remote_prefix() == config.DEFAULT_REMOTE_PREFIX == "mlpjit:"
    assert config.remote_ttl() is None
    assert config.remote_timeout() == config.DEFAULT_REMOTE_TIMEOUT == 2.0


def test_remote_settings_are_typed(monkeypatch):
    monkeypatch.setenv("MLPJIT_REMOTE_CACHE", " rediss://u:pw@cache.internal:6380/2 ")
    assert config.remote_cache_url() == "rediss://u:pw@cache.internal:6380/2"
    monkeypatch.setenv("MLPJIT_REMOTE_PREFIX", "fleet-a:")
    assert config.remote_prefix() == "fleet-a:"
    monkeypatch.setenv("MLPJIT_REMOTE_TTL", "86400")
    assert config.remote_ttl() == 86400.0
    monkeypatch.setenv("MLPJIT_REMOTE_TIMEOUT", "0.25")
    assert config.remote_timeout() == 0.25


@pytest.mark.parametrize(
    ("name", "value", "reader"),
    [
        ("MLPJIT_REMOTE_CACHE", "http://cache:6379/0", config.remote_cache_url),
        ("MLPJIT_REMOTE_CACHE", "redis://cache:6379/cache", config.remote_cache_url),
        ("MLPJIT_REMOTE_CACHE", "redis://cache:port/0", config.remote_cache_url),
        ("MLPJIT_REMOTE_PREFIX", "two words", config.remote_prefix),
        ("MLPJIT_REMOTE_PREFIX", "tab\there", config.remote_prefix),
        ("MLPJIT_REMOTE_TTL", "0", config.remote_ttl),
        ("MLPJIT_REMOTE_TTL", "nan", config.remote_ttl),
        ("MLPJIT_REMOTE_TIMEOUT", "0.0001", config.remote_timeout),
        ("MLPJIT_REMOTE_TIMEOUT", "soon", config.remote_timeout),
        ("MLPJIT_REMOTE_TTL", "1e308", config.remote_ttl),
        ("MLPJIT_REMOTE_TTL", "1e12", config.remote_ttl),
        ("MLPJIT_REMOTE_TTL", "9" * 5000, config.remote_ttl),
        ("MLPJIT_REMOTE_TIMEOUT", "1e308", config.remote_timeout),
        ("MLPJIT_REMOTE_TIMEOUT", "1e12", config.remote_timeout),
        ("MLPJIT_REMOTE_TIMEOUT", "9" * 5000, config.remote_timeout),
    ],
    ids=lambda v: v[:24] if isinstance(v, str) else getattr(v, "__name__", None),
)
def test_a_bad_remote_setting_names_its_variable(monkeypatch, name, value, reader):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name) as info:
        reader()
    assert len(str(info.value)) < 300


def test_remote_ttl_and_timeout_take_their_documented_ranges(monkeypatch):
    """The ranges the README's table states are the ones the readers take."""
    for name, reader, (lo, hi) in (
        ("MLPJIT_REMOTE_TTL", config.remote_ttl, config.REMOTE_TTL_RANGE),
        ("MLPJIT_REMOTE_TIMEOUT", config.remote_timeout, config.REMOTE_TIMEOUT_RANGE),
    ):
        assert f"{lo:g} to {hi:g}" in config.ENV_VARS[name].doc
        for good in (lo, hi):
            monkeypatch.setenv(name, repr(good))
            assert reader() == good
        for bad in (lo / 2, hi * 2):
            monkeypatch.setenv(name, repr(bad))
            with pytest.raises(ValueError, match=f"{name} must be a number in"):
                reader()


BAD_URLS = {  # case -> (MLPJIT_REMOTE_CACHE, a word its one-line error must hold)
    "tls-option-without-tls": ("redis://cache:6379/0?ssl_ca_certs=/etc/ca.pem", "ssl_ca_certs"),
    "unknown-option": ("rediss://cache:6379/0?no_such_option=1", "allowed options"),
    "timeout-option": ("rediss://cache:6379/0?socket_timeout=1e308", "allowed options"),
    "db-option": ("redis://cache:6379/0?db=x", "allowed options"),  # the database is the path
    "100-kB-host": ("redis://" + "a" * 100_000 + ":6379/0", "253"),
    "bidi-control": ("redis://cache\u202e.internal:6379/0", "bidirectional"),
    "label-over-63": ("redis://" + "a" * 64 + ".internal:6379/0", "host"),
    "control-character": ("redis://ca\x01che:6379/0", "host"),
}


@pytest.mark.parametrize("case", sorted(BAD_URLS))
def test_a_remote_url_is_checked_when_it_is_read(monkeypatch, case):
    """Options redis-py would refuse at the first call (a TypeError) and hosts the resolver
    would refuse (an idna error naming nothing) are one line naming the variable."""
    url, word = BAD_URLS[case]
    monkeypatch.setenv("MLPJIT_REMOTE_CACHE", url)
    with pytest.raises(ValueError) as info:
        config.remote_cache_url()
    message = str(info.value)
    assert message.startswith("MLPJIT_REMOTE_CACHE") and word in message, message[:500]
    assert "\n" not in message and len(message) < 400, message[:500]
    assert "\u202e" not in message


@pytest.mark.parametrize(
    "url",
    [
        "redis://cache.internal:6379/0",
        "redis://[::1]:6379/0",
        "redis://b\u00fccher.example:6379/0",  # IDNA
        "rediss://u:pw@cache:6380/2?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem",
        "rediss://cache:6380/0?ssl_cert_reqs=required&ssl_check_hostname=true",
    ],
)
def test_good_remote_urls_pass(url):
    assert config.check_remote_url(url) == url


def test_a_bad_remote_url_never_shows_its_password(monkeypatch):
    monkeypatch.setenv("MLPJIT_REMOTE_CACHE", "http://user:hunter2@cache:6379/0")
    with pytest.raises(ValueError) as info:
        config.remote_cache_url()
    assert "hunter2" not in str(info.value) and "user:***@cache" in str(info.value)
    redacted = config.redact_url("redis://:pw@h:1/0?password=pw&db=1")
    assert redacted.startswith("redis://:***@h:1/0?") and "pw" not in redacted


# --------------------------------------------------------------------- the fleet key file


def write_key_file(path: Path, secret: bytes | None = None, mode: int = 0o400) -> Path:
    """A key file (random 32 bytes unless ``secret`` is given) with ``mode``; its path.
    (tests/redis_server.py has the same for the fleet tests; this module needs no Redis.)"""
    path.write_bytes(os.urandom(32) if secret is None else secret)
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("mode", [0o400, 0o600], ids=["0400", "0600"])
def test_remote_secret_is_the_key_files_bytes(monkeypatch, tmp_path, mode):
    secret = os.urandom(31) + b"\n"  # every byte counts, a trailing newline too
    path = write_key_file(tmp_path / "fleet.key", secret, mode)
    monkeypatch.setenv("MLPJIT_REMOTE_KEY_FILE", f" {path} ")
    assert config.remote_secret() == secret
    monkeypatch.delenv("MLPJIT_REMOTE_KEY_FILE")
    assert config.remote_secret() is None


def _bad_key_file(tmp_path: Path, case: str) -> Path:
    """A key file that must be refused, for ``case``."""
    path = tmp_path / "fleet.key"
    if case == "missing":
        return path
    if case == "empty":
        return write_key_file(path, b"")
    if case == "too short":
        return write_key_file(path, b"x" * 31)
    if case == "too long":
        return write_key_file(path, b"x" * (config.MAX_REMOTE_SECRET_BYTES + 1))
    if case == "directory":
        path.mkdir(mode=0o700)
        return path
    if case == "fifo":
        os.mkfifo(path, 0o600)  # opening it for reading must not wait for a writer
        return path
    if case == "symlink":
        target = write_key_file(tmp_path / "real.key")
        path.symlink_to(target)
        return path
    good = write_key_file(path)
    if case == "group-readable":
        os.chmod(path, 0o640)
    elif case == "other-writable":
        os.chmod(path, 0o602)
    elif case == "another user's":
        os.chown(path, 12345, 12345)  # root only: the test is skipped otherwise
    return good


KEY_FILE_PROBLEMS = {  # case -> a word of the one-line error
    "missing": "no such file",
    "empty": "holds 0 bytes",
    "too short": "holds 31 bytes",
    "too long": "holds too many bytes",
    "directory": "not a regular file",
    "fifo": "not a regular file",
    "symlink": "is a symlink",
    "group-readable": "mode 0640",
    "other-writable": "mode 0602",
    "another user's": "owned by uid 12345",
}


@pytest.mark.parametrize("case", sorted(KEY_FILE_PROBLEMS))
def test_an_unsafe_key_file_is_one_line_naming_the_variable(monkeypatch, tmp_path, case):
    if case == "another user's" and os.geteuid() != 0:
        pytest.skip("os.chown to another user needs root")
    path = _bad_key_file(tmp_path, case)
    monkeypatch.setenv("MLPJIT_REMOTE_KEY_FILE", str(path))
    with pytest.raises(ValueError) as info:
        config.remote_secret()
    message = str(info.value)
    assert message.startswith(f"MLPJIT_REMOTE_KEY_FILE {path}") and "\n" not in message
    assert KEY_FILE_PROBLEMS[case] in message, message
    assert "xxxxxxxx" not in message  # what the file holds is never shown
