"""`mlpjit doctor`: is this machine set up to compile, cache and run mlpjit's kernels?

``run_doctor()`` runs independent checks, each ok / warn / fail with a one-line summary and
plain-JSON details; ``format_report`` prints them as text or JSON. Only a fail makes the exit
status non-zero: a warn is something that works but is degraded (e.g. no compiler installed
means a cache can serve hits but nothing new can be compiled).

Checks: the toolchain (torch, nvidia-cutlass-dsl*, cuda-python), the GPUs and the kernels'
target arch, MLPJIT_* settings, the writable cache dir (the store's safety rules: a cubin is
code, so a dir writable by group/other or owned by another user is refused), the read-only
cache dirs of MLPJIT_CACHE_PATH and of installed cubin wheels, the fleet cache when
MLPJIT_REMOTE_CACHE is set (reachable, login accepted, server version, entries, the fleet's
hits and rejects), lock files (stale
ones are harmless: flock locks die with their process), leftover temp files and quarantined
entries, and optionally a full re-verification
of every entry (``verify=True``; like `mlpjit cache verify` it quarantines bad entries of the
writable dir). Otherwise nothing here writes: no compile, no cache dir created, no cutlass.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlpjit.cli.output import human_size as _human_size
from mlpjit.jit.messages import error_line

__all__ = ["Check", "DoctorReport", "format_report", "main", "run_doctor"]

OK, WARN, FAIL = "ok", "warn", "fail"
_RANK = {OK: 0, WARN: 1, FAIL: 2}


@dataclass
class Check:
    """One check: name, status ("ok" | "warn" | "fail"), a one-line summary, details."""

    name: str
    status: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    hint: str = ""


@dataclass
class DoctorReport:
    """Every check, plus the list of capabilities this machine lacks."""

    checks: list[Check]
    missing: list[str]

    @property
    def status(self) -> str:
        """The worst status of any check."""
        return max((c.status for c in self.checks), key=_RANK.__getitem__, default=OK)

    @property
    def exit_status(self) -> int:
        """1 if any check failed, else 0 (warnings do not fail)."""
        return 1 if self.status == FAIL else 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data: status, missing, checks."""
        return {
            "status": self.status,
            "missing": list(self.missing),
            "checks": [asdict(c) for c in self.checks],
        }


# --------------------------------------------------------------------- lookups (patchable)


def _compiler_versions() -> dict[str, str]:
    """Installed nvidia-cutlass-dsl* distributions (the toolchain part of every cache key)."""
    from mlpjit.jit.key import toolchain

    return toolchain()


def _dist_version(*names: str) -> dict[str, str]:
    """Versions of those distributions that are installed."""
    from importlib import metadata

    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _gpus() -> list[dict[str, Any]]:
    """Visible CUDA devices: index, name, capability, kernel arch (None: stock path), SMs."""
    from mlpjit.device import visible_gpus

    return visible_gpus()


# --------------------------------------------------------------------- checks


def _check_torch() -> Check:
    try:
        import torch
    except ImportError as err:
        return Check("torch", FAIL, f"torch cannot be imported: {err}", hint="pip install torch")
    cuda = torch.version.cuda
    return Check(
        "torch",
        OK,
        f"torch {torch.__version__} ({f'CUDA {cuda}' if cuda else 'CPU-only build'})",
        {"version": torch.__version__, "cuda": cuda},
    )


def _check_compiler() -> Check:
    versions = _compiler_versions()
    if not versions:
        return Check(
            "compiler",
            WARN,
            "nvidia-cutlass-dsl is not installed: cache hits only (a kernel missing from the "
            "cache raises CompilerUnavailableError)",
            {"versions": {}},
            hint="pip install nvidia-cutlass-dsl, or ship a warmed cache (mlpjit cache export)",
        )
    text = ", ".join(f"{k} {v}" for k, v in versions.items())
    return Check("compiler", OK, text, {"versions": versions})


def _check_gpu(gpus: list[dict[str, Any]]) -> Check:
    from mlpjit.jit import config

    try:
        override = config.arch_override()
    except ValueError as err:
        return Check("gpu", FAIL, str(err), hint="unset MLPJIT_ARCH or set it to e.g. sm_90a")
    details = {"devices": gpus, "MLPJIT_ARCH": override}
    if not gpus:
        if override:
            return Check(
                "gpu", OK, f"no GPU visible; compiles for {override} (MLPJIT_ARCH)", details
            )
        return Check(
            "gpu",
            WARN,
            "no GPU visible: compile only, and `mlpjit warm` needs --arch",
            details,
            hint="set MLPJIT_ARCH=sm_90a on a CPU-only build machine",
        )
    from mlpjit.kernels.hopper import SMS

    names = "; ".join(
        f"cuda:{g['index']} {g['name']} (sm {g['capability']}, {g.get('sms', '?')} SMs, "
        f"{g['kernel_arch'] or 'no fp8_gemv kernels: stock path'})"
        for g in gpus
    )
    if all(g["kernel_arch"] is None for g in gpus):
        return Check("gpu", WARN, names, details, hint="the fused kernels need Hopper (sm_90a)")
    other = sorted({g["sms"] for g in gpus if g["kernel_arch"] and g.get("sms", SMS) != SMS})
    if other:
        counts = ", ".join(map(str, other))
        return Check(
            "gpu",
            OK,
            f"{names}; kernels planned for {counts} SMs (the measured configs are for "
            f"{SMS}, so its heuristic picks here); warm caches for this GPU elsewhere with "
            f"`mlpjit warm --sms {other[0]}`",
            details,
        )
    return Check("gpu", OK, names, details)


def _check_cuda_python(gpus: list[dict[str, Any]]) -> Check:
    versions = _dist_version("cuda-python", "cuda-bindings")
    if versions:
        return Check(
            "cuda-python", OK, ", ".join(f"{k} {v}" for k, v in versions.items()), versions
        )
    needed = any(g["kernel_arch"] for g in gpus)
    return Check(
        "cuda-python",
        FAIL if needed else WARN,
        "cuda-python is not installed: cubins cannot be loaded or launched"
        + (" on this machine's GPU" if needed else " (fine on a compile-only machine)"),
        hint="pip install cuda-python",
    )


def _check_settings() -> Check:
    from mlpjit.jit import config

    values: dict[str, Any] = {}
    problems = []
    for name, read in (
        ("MLPJIT_LOCK_TIMEOUT", config.lock_timeout),
        ("MLPJIT_RECORD", config.record_file),
    ):
        try:
            value = read()
        except ValueError as err:
            problems.append(str(err))
            continue
        values[name] = str(value) if isinstance(value, Path) else value
    record = config.record_file()
    if record is not None and not os.access(record.parent, os.W_OK):
        problems.append(f"MLPJIT_RECORD file {record}: its directory is not writable")
    if problems:
        return Check("settings", FAIL, "; ".join(problems), values)
    return Check("settings", OK, f"lock timeout {values['MLPJIT_LOCK_TIMEOUT']:g} s", values)


def _check_cache_dir() -> Check:
    from mlpjit.errors import CacheDirError
    from mlpjit.jit import cache_layout, config
    from mlpjit.jit.maintenance import cache_stats
    from mlpjit.jit.store import CacheStore
    from mlpjit.jit.trust import unsafe_dir_reason

    root = Path(os.path.realpath(config.cache_dir()))  # resolved once, as the store does
    details: dict[str, Any] = {"path": str(root)}
    if not root.exists():
        parent = next((p for p in root.parents if p.exists()), None)
        if parent is None or not os.access(parent, os.W_OK | os.X_OK):
            return Check(
                "cache dir",
                FAIL,
                f"{root} does not exist and cannot be created ({parent} is not writable)",
                details,
                hint="set MLPJIT_CACHE_DIR to a directory you can write",
            )
        return Check("cache dir", OK, f"{root} (created 0700 on first compile)", details)
    # Every directory of the layout, under the same rule the store applies on each access.
    v1 = cache_layout.version_dir(root)
    dirs = [root, *sorted(p for p in v1.rglob("*") if p.is_dir())]
    if v1.is_dir():
        dirs.insert(1, v1)
    bad = [reason for reason in (unsafe_dir_reason(p) for p in dirs) if reason]
    try:
        stats = cache_stats(CacheStore(root, read_only=()))
    except CacheDirError as err:
        bad.insert(0, str(err))
        stats = None
    if bad:
        details["problems"] = bad
        return Check(
            "cache dir",
            FAIL,
            f"refused by the store: {bad[0]}",
            details,
            hint=f"chmod -R go-w {root}, or point MLPJIT_CACHE_DIR at a private directory",
        )
    assert stats is not None
    details.update(entries=stats["entries"], bytes=stats["bytes"], kernels=stats["kernels"])
    summary = f"{root}: {stats['entries']} entries, {_human_size(stats['bytes'])}"
    if not os.access(root, os.W_OK | os.X_OK):
        return Check(
            "cache dir",
            WARN,
            summary + "; not writable: new compiles are kept in memory only",
            details,
            hint="make it writable, or list it in MLPJIT_CACHE_PATH as a read-only cache dir",
        )
    return Check("cache dir", OK, summary, details)


def _check_read_only_tiers() -> list[Check]:
    from mlpjit.jit import config

    return [_check_read_only_tier(f"read-only dir {p.absolute()}", p) for p in config.cache_path()]


def _check_wheels() -> list[Check]:
    """The installed cubin wheels (none: no check; MLPJIT_CACHE_WHEELS=0: one line)."""
    from mlpjit.jit import config
    from mlpjit.jit.installed import installed_caches

    if not config.cache_wheels():
        return [Check("cubin wheels", OK, "off (MLPJIT_CACHE_WHEELS=0)")]
    checks = []
    for wheel in installed_caches():
        name = f"cubin wheel {wheel.label()}"
        if wheel.path is None:
            checks.append(
                Check(name, WARN, f"skipped: {wheel.problem}", hint="reinstall or uninstall it")
            )
            continue
        checks.append(_check_read_only_tier(name, wheel.path))
    return checks


def _check_read_only_tier(name: str, tier: Path) -> Check:
    """One read-only tier (an MLPJIT_CACHE_PATH dir or a cubin wheel's) under the store's
    rule: there, trusted, readable, and how many entries it holds."""
    from mlpjit.jit import cache_layout
    from mlpjit.jit.trust import tier_problem

    tier = tier.absolute()
    if not tier.exists():
        return Check(name, WARN, "missing: skipped", {"path": str(tier)})
    reason = tier_problem(Path(os.path.realpath(tier)))  # resolved, as the store does
    if reason:
        return Check(
            name,
            WARN,
            f"skipped by the store: {reason}",
            {"path": str(tier)},
            hint="a read-only cache dir must be owned by you or root, and neither it nor "
            "a directory above it writable by other users (chmod go-w, or chmod +t above)",
        )
    entries_dir = cache_layout.area(tier, "entries")
    if not os.access(tier, os.R_OK | os.X_OK) or (
        entries_dir.exists() and not os.access(entries_dir, os.R_OK | os.X_OK)
    ):
        return Check(name, FAIL, "not readable by this user", {"path": str(tier)})
    try:
        count = sum(1 for _ in entries_dir.glob("*/*.json"))
    except OSError:
        count = 0
    status = OK if count else WARN
    summary = f"{count} entries" + ("" if count else " (empty?)")
    return Check(name, status, summary, {"path": str(tier), "entries": count})


def _remote_summary(report: dict[str, Any]) -> str:
    """'<url> (Redis 8.1.0, prefix mlpjit:, signed): 16 entries; fleet-wide 40 hits, ...'"""
    fleet = report["fleet"] or {}
    capped = "+" if report["entries_capped"] else ""
    signing = "signed" if report["signed"] else "unsigned"
    return (
        f"{report['url']} (Redis {report['server_version']}, prefix {report['prefix']}, "
        f"{signing}): "
        f"{report['entries']}{capped} entries; fleet-wide {fleet.get('hits', 0)} hits, "
        f"{fleet.get('rejected', 0)} rejected (failed verification), "
        f"{fleet.get('uploads', 0)} uploads"
    )


def _check_remote() -> list[Check]:
    """The fleet cache (MLPJIT_REMOTE_CACHE): no check at all when it is unset.

    Unreachable or refusing is a warning, not a failure: every process then works from its
    local cache (after one warning of its own). A malformed setting fails, since the
    compile manager refuses it.
    """
    from mlpjit.jit import config

    hint = "MLPJIT_REMOTE_CACHE=redis://[user:pass@]host:port/db, or rediss:// for TLS"
    try:
        if config.remote_cache_url() is None:
            return []
        from mlpjit.jit.remote import remote_from_env, remote_report

        remote = remote_from_env()
    except ValueError as err:
        fix = hint if "MLPJIT_REMOTE_CACHE" in str(err) else "see the README's environment table"
        return [Check("remote", FAIL, str(err), hint=fix)]
    except ImportError:
        return [
            Check(
                "remote",
                WARN,
                "MLPJIT_REMOTE_CACHE is set but redis-py is not installed: local cache only",
                hint="pip install 'mlpjit[redis]'",
            )
        ]
    assert remote is not None
    report = remote_report(remote)
    if report["auth_ok"] is False:
        summary = f"{remote.url} refused the login ({report['error']}): local cache only"
        return [Check("remote", WARN, summary, report, hint=hint)]
    if not report["reachable"]:
        summary = f"{remote.url} is unreachable ({report['error']}): local cache only"
        return [Check("remote", WARN, summary, report, hint="is Redis up? " + hint)]
    if not remote.signed:
        summary = f"{_remote_summary(report)}: entries are integrity-checked only"
        fix = "set MLPJIT_REMOTE_KEY_FILE on every node (docs/SERVER.md, Security model)"
        return [Check("remote", WARN, summary, report, hint=fix)]
    return [Check("remote", OK, _remote_summary(report), report)]


def _check_locks() -> Check:
    from mlpjit.jit import cache_layout, config
    from mlpjit.jit.locks import KeyLock

    locks = cache_layout.area(config.cache_dir().absolute(), "locks")
    if not locks.is_dir():
        return Check("locks", OK, "no lock files yet", {"path": str(locks), "files": 0})
    files = sorted(locks.glob(f"*{cache_layout.LOCK_SUFFIX}"))
    held = 0
    for path in files:
        lock = KeyLock(path)
        if lock.try_acquire():  # free: a leftover of a finished (or crashed) compile
            lock.release()
        else:
            held += 1
    details = {"path": str(locks), "files": len(files), "held": held}
    if not os.access(locks, os.W_OK | os.X_OK):
        return Check(
            "locks",
            WARN,
            "lock dir not writable: processes cannot share compiles (each compiles alone)",
            details,
        )
    return Check(
        "locks",
        OK,
        f"{len(files)} lock files, {held} held now by a compiling process "
        "(free ones are harmless: flock locks end with their process)",
        details,
    )


def _check_leftovers() -> Check:
    from mlpjit.jit import cache_layout, config

    root = config.cache_dir().absolute()

    def count(path: Path) -> int:
        try:
            return sum(1 for _ in path.iterdir())
        except OSError:
            return 0

    quarantine = cache_layout.area(root, "quarantine")
    tmp, quarantined = count(cache_layout.area(root, "tmp")), count(quarantine)
    details = {"temp_files": tmp, "quarantined": quarantined}
    if quarantined:
        return Check(
            "leftovers",
            WARN,
            f"{quarantined} quarantined entries (failed verification; recompiled on use), "
            f"{tmp} temp files",
            details,
            hint=f"reasons in {quarantine}/*/{cache_layout.QUARANTINE_REASON}; safe to delete",
        )
    return Check("leftovers", OK, f"{tmp} temp files, no quarantined entries", details)


def _check_verify() -> Check:
    from mlpjit.errors import CacheDirError
    from mlpjit.jit.maintenance import verify_cache
    from mlpjit.jit.store import CacheStore

    try:
        result = verify_cache(CacheStore())
    except CacheDirError as err:
        return Check("verify", FAIL, f"not verified: {err}")
    summary = f"{result['ok']} of {result['checked']} entries verify"
    if result["bad"]:
        return Check(
            "verify", FAIL, summary + f", {len(result['bad'])} bad (quarantined or skipped)", result
        )
    return Check("verify", OK, summary, result)


def _guarded(name: str, run: Callable[[], Check | list[Check]]) -> list[Check]:
    """Run one check; an unexpected error becomes a failed check, never a crash."""
    try:
        found = run()
    except Exception as err:  # noqa: BLE001 (the doctor must report, not crash)
        return [Check(name, FAIL, f"check crashed: {error_line(err)}")]
    return found if isinstance(found, list) else [found]


def run_doctor(verify: bool = False) -> DoctorReport:
    """Run every check (``verify``: also re-hash every cache entry) and return the report."""
    checks: list[Check] = []
    checks += _guarded("torch", _check_torch)
    checks += _guarded("compiler", _check_compiler)
    gpus: list[dict[str, Any]] = []
    try:
        gpus = _gpus()
    except Exception as err:  # noqa: BLE001 (a broken driver is a finding)
        checks.append(Check("gpu", FAIL, f"cannot query GPUs: {error_line(err)}"))
    else:
        checks += _guarded("gpu", lambda: _check_gpu(gpus))
    checks += _guarded("cuda-python", lambda: _check_cuda_python(gpus))
    checks += _guarded("settings", _check_settings)
    checks += _guarded("cache dir", _check_cache_dir)
    checks += _guarded("read-only dirs", _check_read_only_tiers)
    checks += _guarded("cubin wheels", _check_wheels)
    checks += _guarded("remote", _check_remote)
    checks += _guarded("locks", _check_locks)
    if verify:  # before leftovers: it may quarantine entries
        checks += _guarded("verify", _check_verify)
    checks += _guarded("leftovers", _check_leftovers)

    by_name = {c.name: c for c in checks}
    missing = []
    if by_name.get("compiler") and by_name["compiler"].status != OK:
        missing.append("compiler (nvidia-cutlass-dsl): cache hits only, no new compiles")
    if by_name.get("cuda-python") and by_name["cuda-python"].status != OK:
        missing.append("cuda-python: cubins cannot be loaded or launched")
    if not gpus:
        missing.append("GPU: compile-only machine")
    elif not any(g["kernel_arch"] for g in gpus):
        missing.append("a GPU the fused kernels support (sm_90a): stock path only")
    return DoctorReport(checks, missing)


def format_report(report: DoctorReport, as_json: bool = False) -> str:
    """The report as indented JSON, or as one line per check plus hints and a summary."""
    if as_json:
        return json.dumps(report.to_dict(), indent=2, default=str)
    lines = []
    for c in report.checks:
        lines.append(f"[{c.status:^4}] {c.name}: {c.summary}")
        if c.hint and c.status != OK:
            lines.append(f"       fix: {c.hint}")
    if report.missing:
        lines.append("missing: " + "; ".join(report.missing))
    counts = {s: sum(c.status == s for c in report.checks) for s in (OK, WARN, FAIL)}
    lines.append(f"doctor: {counts[OK]} ok, {counts[WARN]} warn, {counts[FAIL]} fail")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mlpjit.doctor [--json] [--verify]` (the CLI's `mlpjit doctor` does the same)."""
    import argparse

    parser = argparse.ArgumentParser(prog="mlpjit doctor", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--verify", action="store_true", help="also re-hash every cache entry")
    args = parser.parse_args(argv)
    report = run_doctor(verify=args.verify)
    print(format_report(report, as_json=args.json))
    return report.exit_status


if __name__ == "__main__":
    sys.exit(main())
