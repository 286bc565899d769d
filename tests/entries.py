"""Hand-made cache entries and hostile-state helpers for the trust tests (a helper module,
not collected).

Entries are fabricated without compiling: a KernelBinary with a fake cubin is published
through the store, so every check a load does (key, sha256, launch_sha256) passes. "Another
user" is a real uid (nobody): the tests run as root, so files are chowned to it, and
``as_other_user`` runs a child process under it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mlpjit.jit.binary import KernelBinary, KernelParam
from mlpjit.jit.key import cache_key, key_components
from mlpjit.jit.store import CacheStore
from mlpjit.testing.smoke import SPEC as SMOKE

REPO = Path(__file__).resolve().parent.parent
OTHER_UID = 65534  # nobody
CHILD_TIMEOUT = 60
CHILD_MEMORY = 4 << 30


def made(i: int = 0) -> tuple[str, dict, KernelBinary]:
    """A hand-made entry (no compile) that uses every launch field, cluster included."""
    components = key_components(SMOKE, {"n": 1024 + i, "scale": 2.0, "block": 128}, "sm_90a")
    binary = KernelBinary(
        cubin=b"\x7fELF" + bytes([i % 256]) * 64 + os.urandom(8),
        symbol=f"kernel_{i}",
        grid=(8, 2, 1),
        block=(128, 1, 1),
        smem_bytes=4096,
        pdl=True,
        params=(KernelParam("out", "ptr"), KernelParam("n", "i32"), KernelParam("s", "f32")),
        cluster=(2, 1, 1),
    )
    return cache_key(components), components, binary


def publish(root: Path, i: int = 0) -> tuple[str, dict, KernelBinary]:
    """Publish hand-made entry ``i`` into the cache at ``root``."""
    entry = made(i)
    assert CacheStore(root=root, read_only=()).publish(*entry, 0.1).persisted
    return entry


def paths(root: Path, key: str) -> tuple[Path, Path]:
    """(manifest, cubin) of ``key`` under ``root``."""
    shard = root / "v1" / "entries" / key[:2]
    return shard / f"{key}.json", shard / f"{key}.cubin"


def limit_memory(limit: int = CHILD_MEMORY) -> None:
    """In a child: at most ``limit`` bytes of address space, so a runaway read fails fast."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that imports this checkout's mlpjit."""
    env = dict(os.environ)
    paths = (str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(extra)
    return env


_BECOME_OTHER = f"""
import os
def become_other_user():
    os.setgroups([])
    os.setgid({OTHER_UID})
    os.setuid({OTHER_UID})
"""


def as_other_user(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run Python ``code`` in a bounded child that calls ``become_other_user()`` (uid and gid
    nobody, a real other user) once it has imported what it needs (the interpreter may live
    where nobody can read it)."""
    return subprocess.run(
        [sys.executable, "-c", _BECOME_OTHER + code, *args],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        preexec_fn=limit_memory,
        env=child_env(),
        cwd="/",
        check=False,
    )


def world_dir(name: str) -> Path:
    """A fresh root-owned sticky dir (like /tmp) under /tmp that every user can reach."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=f"mlpjit-{name}-", dir="/tmp"))
    os.chmod(path, 0o1777)
    return path


def run_python(code: str, *args: str, timeout: float = CHILD_TIMEOUT, **env: str):
    """``python -c CODE ARGS`` in a bounded child process (timeout, RLIMIT_AS) whose
    environment adds ``env``; returns the CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit_memory,
        env=child_env(**env),
        check=False,
    )


def run_cli(cache: Path, *args: str, timeout: float = CHILD_TIMEOUT, **env: str):
    """`mlpjit ARGS` against the cache at ``cache`` in a bounded child process."""
    code = "import sys\nfrom mlpjit.cli import main\nsys.exit(main(sys.argv[1:]))"
    return run_python(code, *args, timeout=timeout, MLPJIT_CACHE_DIR=str(cache), **env)


def sentinel(base: Path) -> Path:
    """A directory outside the cache, with a subdirectory and files, that links point at."""
    path = base / "sentinel"
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "keep").write_text("keep")
    (path / "keep").write_text("keep")
    return path


def sentinel_intact(path: Path) -> bool:
    """Whether everything ``sentinel`` made is still there, unchanged."""
    return (path / "keep").read_text() == "keep" and (path / "sub" / "keep").read_text() == "keep"


def hostile_file(path: Path, how: str, target: Path | None = None) -> None:
    """Put at ``path`` what a careless or hostile user could: "symlink" (to ``target``,
    owned by nobody), "fifo", "dir", or an empty file of "other-owner" or "group-writable"."""
    if how == "symlink":
        assert target is not None
        path.symlink_to(target)
        os.lchown(path, OTHER_UID, OTHER_UID)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "dir":
        path.mkdir()
    else:
        path.write_text("")
        if how == "other-owner":
            os.chown(path, OTHER_UID, OTHER_UID)
        else:
            os.chmod(path, 0o620)
