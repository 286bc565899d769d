"""A real redis-server for the fleet-cache tests (a helper module, not collected), and the
fleet key files (MLPJIT_REMOTE_KEY_FILE) they sign entries with.

Each server is Debian's redis-server on 127.0.0.1 with a random free port and a temp dir (no
persistence), killed by the test that started it; nothing is mocked and nothing on the wire
is hand-made. TLS uses the test-only certificate in tests/data/redis-tls. Without
redis-server on PATH the tests fail with the command that installs it (.ci/run runs it):
they never skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import redis
except ImportError:  # a collection error that says what to install, not a skip
    pytest.fail("redis-py is not installed: pip install -e '.[test]'", pytrace=False)

REPO = Path(__file__).resolve().parent.parent
TLS_DIR = REPO / "tests" / "data" / "redis-tls"
PASSWORD = "s3cret-test-pass"
START_TIMEOUT = 10.0
KEY_BYTES = 32


def write_key_file(path: Path, secret: bytes | None = None, mode: int = 0o400) -> Path:
    """A fleet key file at ``path`` as docs/SERVER.md says to make one (random bytes unless
    ``secret`` is given, mode 0400); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(KEY_BYTES) if secret is None else secret)
    os.chmod(path, mode)
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RedisServer:
    """One redis-server process started by a test."""

    port: int
    proc: subprocess.Popen
    password: str | None = None
    tls: bool = False
    paused: bool = False

    def url(self, db: int = 0, password: str | None = None, trust: bool = True) -> str:
        """A URL for this server; ``password`` defaults to the server's own."""
        password = self.password if password is None else password
        auth = f":{password}@" if password else ""
        scheme = "rediss" if self.tls else "redis"
        query = f"?ssl_ca_certs={TLS_DIR / 'cert.pem'}" if self.tls and trust else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/{db}{query}"

    def client(self) -> redis.Redis:
        """A plain redis-py client, to set up and inspect what the tests expect."""
        return redis.Redis.from_url(self.url(), socket_timeout=5)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): it accepts connections and never answers."""
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL the server (a crash) and reap it."""
        if self.paused:
            self.resume()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def _server_args(workdir: Path, port: int, password: str | None, tls: bool) -> list[str]:
    args = ["--bind", "127.0.0.1", "--dir", str(workdir), "--save", "", "--appendonly", "no"]
    args += ["--logfile", str(workdir / "redis.log")]
    if tls:
        cert, key = TLS_DIR / "cert.pem", TLS_DIR / "key.pem"
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert)]
        args += ["--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)]
        args += ["--tls-auth-clients", "no"]
    else:
        args += ["--port", str(port)]
    if password:
        args += ["--requirepass", password]
    return args


def _ready(server: RedisServer) -> bool:
    """Wait until the server answers PING (False if it exited, e.g. its port was taken)."""
    deadline = time.monotonic() + START_TIMEOUT
    client = server.client()
    try:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                return False
            try:
                return bool(client.ping())
            except redis.RedisError:
                time.sleep(0.05)
        return False
    finally:
        client.close()


def start_redis(workdir: Path, password: str | None = None, tls: bool = False) -> RedisServer:
    """Start redis-server on a random free port of 127.0.0.1, data in ``workdir``."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not on PATH; the remote cache tests need a real one. Install it: "
            "apt-get update && apt-get install -y redis-server (.ci/run does)",
            pytrace=False,
        )
    workdir.mkdir(parents=True, exist_ok=True)
    for _ in range(5):  # another process may take the free port before redis binds it
        port = free_port()
        proc = subprocess.Popen(
            [binary, *_server_args(workdir, port, password, tls)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        server = RedisServer(port, proc, password, tls)
        if _ready(server):
            return server
        server.kill()
    pytest.fail(f"redis-server did not start; see {workdir / 'redis.log'}", pytrace=False)
