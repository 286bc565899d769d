"""Compile scratch dirs (CuTe DSL dump dirs) and their removal after a killed compile.

A compile writes its cubin through a ``tempfile.TemporaryDirectory`` in the temp dir
(``$TMPDIR``, else /tmp). A process killed mid-compile (kill -9, OOM killer) never runs its
cleanup, so the dir stays behind. The kernel modules name these dirs
``mlpjit-<kind>-<pid>-<random>`` (fp8_gemv: kind "cute", smoke: kind "cubin"; see
``scratch_prefix``) so that `mlpjit cache clear` and `prune` can tell a leftover (its pid is
gone) from the dir of a compile running right now, and remove only the former.

Pids are checked on this host: a temp dir shared with another pid namespace (a container
that mounts this /tmp) is not supported, its live compiles would look dead from here.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

__all__ = ["LEGACY_MIN_AGE", "KINDS", "pid_alive", "remove_dead_scratch", "scratch_prefix"]

KINDS = ("cute", "cubin")
# Dirs named before the pid was part of the name: their owner is unknown, so only an age
# far above any compile's duration marks them as leftovers.
LEGACY_MIN_AGE = 3600.0

# tempfile's random part is 8 of [a-z0-9_]: never a "-", so the optional pid is unambiguous.
_NAME_RE = re.compile(r"^mlpjit-(?:" + "|".join(KINDS) + r")-(?:(\d{1,10})-)?[a-z0-9_]+$")


def scratch_prefix(kind: str) -> str:
    """The TemporaryDirectory prefix of this process's compile scratch dirs of ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"scratch kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return f"mlpjit-{kind}-{os.getpid()}-"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (a zombie counts as alive)."""
    if pid <= 0:  # 0 and negatives address process groups, never one process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    except (OverflowError, OSError):
        return False
    return True


def _is_leftover(name: str, st: os.stat_result, now: float) -> bool | None:
    """True: a leftover; False: a dir in use (or maybe in use); None: not a scratch dir."""
    match = _NAME_RE.match(name)
    if match is None or not stat.S_ISDIR(st.st_mode):
        return None
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return None  # another user's: not ours to judge
    pid = match.group(1)
    if pid is None:
        return now - st.st_mtime >= LEGACY_MIN_AGE
    return not pid_alive(int(pid))


def remove_dead_scratch(base: Path | None = None, now: float | None = None) -> dict[str, int]:
    """Remove this user's compile scratch dirs under ``base`` (default: the temp dir) whose
    process is gone; returns {"removed": n, "kept": n} (kept: a compile still running)."""
    base = Path(tempfile.gettempdir()) if base is None else Path(base)
    now = time.time() if now is None else now
    removed = kept = 0
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return {"removed": 0, "kept": 0}
    for name in names:
        path = base / name
        try:
            st = os.lstat(path)  # lstat: a symlink is never followed, let alone removed
        except OSError:
            continue
        verdict = _is_leftover(name, st, now)
        if verdict is None:
            continue
        if not verdict:
            kept += 1
            continue
        # rmtree works on dir fds here (no symlink races, see shutil.rmtree.avoids_symlink_attacks).
        shutil.rmtree(path, ignore_errors=True)
        removed += not os.path.lexists(path)
    return {"removed": removed, "kept": kept}
