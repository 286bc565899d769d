"""The on-disk compile cache: layout, atomic publish, verification, quarantine, layers.

Layout under a root (the writable MLPJIT_CACHE_DIR, or a read-only MLPJIT_CACHE_PATH layer):

    v1/entries/<key[:2]>/<key>.cubin   the code
    v1/entries/<key[:2]>/<key>.json    the manifest; written last, so its presence commits
    v1/aliases/<spec_key>              full key of the latest entry for a toolchain-less spec
    v1/locks/<key>.lock                per-key compile locks (see locks.py)
    v1/quarantine/<key>.<ns>.<pid>/    entries that failed verification, with reason.txt
    v1/tmp/                            temp files of in-progress publishes

A cubin is code that will run in the caller's process (trust rules: docs/SERVER.md, Security model):

- Every load re-verifies the key, the cubin's sha256 and the manifest's launch_sha256 (over
  symbol, grid, block, shared memory, PDL, parameters, cluster), for the root and layers alike.
- Paths are resolved once, at construction. One rule for every tier (the writable root and
  each read-only layer): the tier and every directory from it down to an entry is a real
  directory (no symlink) owned by us or root and not writable by group/other, and no
  directory above it lets another user rename it away (each is owned by us or root and is
  not group/other writable unless sticky). A layer missing at construction is skipped for
  the store's lifetime: whoever creates it later is not trusted by this process.
- Entry files are read only if they are regular files (no symlink, FIFO or device) under a
  size cap, owned by a trusted user and not writable by group/other. A bad entry is
  quarantined in the writable root and skipped (with one warning) in a read-only layer.
- Anything unparsable, including JSON nested deep enough to raise RecursionError, is a
  corrupt entry, never a crash.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import math
import os
import re
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlpjit.errors import CacheDirError, CorruptEntryError
from mlpjit.jit import config
from mlpjit.jit.binary import KernelBinary, binary_from_fields, launch_fields, launch_sha256
from mlpjit.jit.bounds import clamped
from mlpjit.jit.key import FORMAT_VERSION, cache_key, canonical_json, short_key, spec_key
from mlpjit.jit.safe_fs import create_exclusive_at, opened_dir
from mlpjit.jit.safe_read import loads_json, read_regular

__all__ = [
    "compile_seconds_of",
    "is_key",
    "same_file",
    "tier_problem",
    "unsafe_dir_reason",
    "MAX_ALIAS_BYTES",
    "MAX_CUBIN_BYTES",
    "MAX_MANIFEST_BYTES",
    "CacheStore",
    "Entry",
    "check_key",
    "verify_manifest",
]

log = logging.getLogger(__name__)

# Read caps: a bigger file is a corrupt entry (real cubins are ~10 KB-1 MB, manifests ~2 KB).
MAX_CUBIN_BYTES = 256 << 20
MAX_MANIFEST_BYTES = 1 << 20
MAX_ALIAS_BYTES = 4096

_KEY_RE = re.compile(r"[0-9a-f]{64}")
_SHARD_RE = re.compile(r"[0-9a-f]{2}")
_AREAS = ("entries", "aliases", "locks", "quarantine", "tmp")
_UNSAFE_BITS = stat.S_IWGRP | stat.S_IWOTH
# Manifest times outside the checksum are clamped to this (year ~4100): time.localtime and
# datetime cannot show 1e300.
MAX_TIMESTAMP = float(1 << 36)


def is_key(text: object) -> bool:
    """Whether ``text`` is a full cache key: exactly 64 lowercase hex (fullmatch: "$" would
    let a trailing newline through, and keys become file names)."""
    return isinstance(text, str) and _KEY_RE.fullmatch(text) is not None


def check_key(key: str, what: str = "key") -> str:
    """Return ``key`` if it is a full cache key (64 lowercase hex); ValueError otherwise.

    Keys become file names, so this also keeps paths inside the cache dir.
    """
    if not is_key(key):
        raise ValueError(f"{what} must be 64 lowercase hex characters, got {key!r}")
    return key


@dataclass(frozen=True)
class Entry:
    """A verified cache entry (or a compile that could not be persisted: persisted=False)."""

    key: str
    manifest: dict[str, Any]
    cubin: bytes
    origin: Path
    persisted: bool = True

    def binary(self) -> KernelBinary:
        """The KernelBinary (cubin + launch facts) this entry describes."""
        return binary_from_fields(self.manifest, self.cubin)


def verify_manifest(key: str, raw: bytes, cubin: bytes) -> dict[str, Any]:
    """The manifest parsed from ``raw`` if it and ``cubin`` are a valid entry for ``key``.

    One check for every origin (the writable root, a read-only layer, an imported archive):
    format and key fields, components that hash to ``key`` (and spec_key derived from
    them), the cubin's size and sha256, well-typed launch fields, and launch_sha256 over
    them, so no manifest change can make the cubin launch differently. CorruptEntryError
    with the reason otherwise.
    """
    try:
        manifest = loads_json(raw)
    except ValueError as err:
        raise CorruptEntryError(f"manifest is unparsable: {err}") from None
    if not isinstance(manifest, dict):
        raise CorruptEntryError("manifest is not a JSON object")
    if manifest.get("format") != FORMAT_VERSION or manifest.get("key") != key:
        raise CorruptEntryError("manifest format or key field does not match")
    components = manifest.get("components")
    if not isinstance(components, dict):
        raise CorruptEntryError("manifest has no components object")
    try:
        actual = cache_key(components)
    except (TypeError, ValueError, RecursionError) as err:
        raise CorruptEntryError(f"manifest components are not canonical JSON ({err})") from None
    if actual != key:
        raise CorruptEntryError(
            f"manifest components (kernel {components.get('kernel')!r}, arch "
            f"{components.get('arch')!r}) hash to {short_key(actual)}, not to this key"
        )
    if manifest.get("spec_key") != spec_key(components):
        raise CorruptEntryError("manifest spec_key does not match its components")
    size, digest = manifest.get("cubin_bytes"), manifest.get("cubin_sha256")
    if len(cubin) != size:
        raise CorruptEntryError(f"cubin has {len(cubin)} bytes, manifest says {size!r}")
    if hashlib.sha256(cubin).hexdigest() != digest:
        raise CorruptEntryError("cubin sha256 does not match the manifest")
    try:
        binary = binary_from_fields(manifest, cubin)
    except ValueError as err:
        raise CorruptEntryError(str(err)) from None
    stored = manifest.get("launch_sha256")
    if stored is None:
        raise CorruptEntryError("manifest has no launch_sha256 (written by an older mlpjit)")
    if stored != launch_sha256(key, binary):
        raise CorruptEntryError(
            "manifest launch fields (symbol, grid, block, smem, pdl, params, cluster) do not "
            "match its launch_sha256"
        )
    return manifest


def _timestamp(value: object) -> float:
    """A manifest time (not under the checksum) as seconds in [0, MAX_TIMESTAMP], else 0.0."""
    return clamped(value, 0.0, MAX_TIMESTAMP, 0.0)


def _dir_problem(st: os.stat_result, owners: frozenset[int]) -> str:
    """Why a directory with this lstat may not hold cache entries ('' if it may)."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory (symlinks are refused)"
    if st.st_mode & _UNSAFE_BITS:
        return "writable by group or other users"
    if st.st_uid not in owners:
        return f"owned by uid {st.st_uid}, not by a trusted user"
    return ""


def compile_seconds_of(manifest: Mapping[str, Any]) -> float:
    """A manifest's compile_seconds if it is a finite number >= 0, else 0.0.

    The field is covered by no checksum (it decides nothing), so an imported or fetched
    manifest may hold anything there: 1e999 parses as inf, which a publish could not write
    (JSON has no inf), and float() of a 400-digit int overflows.
    """
    value = manifest.get("compile_seconds")
    if clamped(value, 0.0, math.inf, -1.0) < 0:
        return 0.0  # negative, or not a finite number
    return clamped(value, 0.0, math.inf, 0.0)


def unsafe_dir_reason(path: Path) -> str | None:
    """Why the store would refuse ``path`` as a directory of the writable root (the rule
    every access applies; for tools such as `mlpjit doctor`), or None if it would not."""
    try:
        st = os.lstat(path)
    except OSError as err:
        return f"{path} cannot be read ({err})"
    problem = _dir_problem(st, _trusted_owners())
    return f"{path} is {problem}" if problem else None


def _trusted_owners() -> frozenset[int]:
    """Who may own a cache directory or file: this user and root."""
    return frozenset({os.geteuid(), 0})


def _ancestor_problem(path: Path) -> tuple[Path, str] | None:
    """Why a directory above the tier ``path`` (resolved) lets another user swap the tier
    (None if none does): it became a symlink, is owned by someone else, or is writable by
    group/other without being sticky and ours or root's (like /tmp)."""
    owners = _trusted_owners()
    for parent in path.parents:
        try:
            st = os.lstat(parent)
        except OSError:
            continue  # not there yet: the writable root creates it
        if stat.S_ISLNK(st.st_mode):
            return parent, "became a symlink after the path was resolved"
        if not stat.S_ISDIR(st.st_mode):
            continue  # nothing can be created below it: the tier is missing
        if st.st_uid not in owners:
            return parent, f"is owned by uid {st.st_uid}, who could rename what is inside"
        if st.st_mode & _UNSAFE_BITS and not st.st_mode & stat.S_ISVTX:
            mode = stat.filemode(st.st_mode)
            return (
                parent,
                f"is writable by group or other users (mode {mode}) without the sticky bit",
            )
    return None


def tier_problem(path: Path) -> str | None:
    """Why the cache tier at ``path`` (resolved; the writable root or a read-only layer) is
    not trusted, None if it is; "missing" if there is nothing there.

    The one rule for every tier: a real directory owned by this user or root, not writable
    by group/other, below directories that no other user can rename it out of.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return "missing"
    problem = _dir_problem(st, _trusted_owners())
    if problem:
        return f"{path} is {problem}"
    above = _ancestor_problem(path)
    return None if above is None else f"{above[0]} (above {path}) {above[1]}"


def _file_problem(st: os.stat_result, owners: frozenset[int]) -> str:
    """Why an entry file with this fstat may not be used ('' if it may)."""
    if st.st_mode & _UNSAFE_BITS:
        return "writable by group or other users"
    if st.st_uid not in owners:
        return f"owned by uid {st.st_uid}, not by a trusted user"
    return ""


def _read_trusted(path: Path, max_bytes: int, owners: frozenset[int]) -> bytes:
    """The bytes of entry file ``path`` if it is regular, capped and trusted.

    CorruptEntryError if it is not (a symlink, FIFO, device, too big, another user's or
    writable by others); OSError if it cannot be read (e.g. missing).
    """
    try:
        data, st = read_regular(path, max_bytes)
    except ValueError as err:
        raise CorruptEntryError(str(err)) from None
    problem = _file_problem(st, owners)
    if problem:
        raise CorruptEntryError(f"{path.name} is {problem}")
    return data


def _regular_size(path: Path) -> int:
    """The size of ``path`` if it is a regular file (not a symlink), else 0."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def _is_real_dir(path: Path) -> bool:
    """True if ``path`` is a directory and not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def same_file(path: Path, st: os.stat_result) -> bool:
    """True if ``path`` is still the file ``st`` (an lstat) describes: not replaced or
    removed meanwhile."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return (now.st_ino, now.st_dev, now.st_mtime_ns, now.st_size) == (
        st.st_ino,
        st.st_dev,
        st.st_mtime_ns,
        st.st_size,
    )


class CacheStore:
    """The writable cache root plus read-only layers searched after it."""

    def __init__(self, root: Path | None = None, layers: Sequence[Path] | None = None) -> None:
        # As configured (absolute), for display and for comparing configurations.
        self.configured_root = Path(root if root is not None else config.cache_dir()).absolute()
        self.configured_layers = tuple(
            Path(p).absolute() for p in (layers if layers is not None else config.cache_path())
        )
        # Symlinks are resolved once, here: every check and every file operation uses these
        # paths, so re-pointing a symlink later cannot redirect the store to an unchecked dir.
        self.root = Path(os.path.realpath(self.configured_root))
        self.layers = tuple(Path(os.path.realpath(p)) for p in self.configured_layers)
        self._mutex = threading.Lock()
        self._euid = os.geteuid()
        self._trusted = _trusted_owners()
        # Each layer is judged once: a missing one stays skipped even if someone creates it
        # later, and a checked one is not re-resolved.
        self._layer_verdicts: dict[Path, bool] = {
            layer: False for layer in self.layers if not os.path.lexists(layer)
        }
        self._safe_dirs: set[Path] = set()  # checked dirs of the writable root
        self._safe_layer_dirs: set[Path] = set()  # checked dirs below each layer's root
        self._warned: set[object] = set()
        self._touched: set[str] = set()
        self._write_warned = False
        self.quarantined = 0  # entries this store moved to quarantine

    # ----------------------------------------------------------------- paths and safety

    @staticmethod
    def _v1(base: Path) -> Path:
        return base / "v1"

    def area(self, name: str) -> Path:
        """The writable root's v1/<name> directory (entries, aliases, locks, quarantine, tmp);
        not created or checked here."""
        if name not in _AREAS:
            raise ValueError(f"no cache area {name!r}")
        return self._v1(self.root) / name

    @contextlib.contextmanager
    def try_lock(self, key: str) -> Iterator[bool]:
        """The key's compile lock taken without waiting: yields whether it was taken (a
        holder is compiling or publishing the key right now), released on exit."""
        from mlpjit.jit.locks import KeyLock  # filelock is only needed here

        lock = KeyLock(self.lock_path(key))
        held = lock.try_acquire()
        try:
            yield held
        finally:
            lock.release()

    def _entry_paths(self, base: Path, key: str) -> tuple[Path, Path]:
        shard = self._v1(base) / "entries" / key[:2]
        return shard / f"{key}.json", shard / f"{key}.cubin"

    def lock_path(self, key: str) -> Path:
        """Path of the key's lock file (its directory is created when possible)."""
        check_key(key)
        locks = self._v1(self.root) / "locks"
        # On failure the lock degrades to a no-op (see locks.py).
        with contextlib.suppress(OSError):
            self._make_dirs(locks)
        return locks / f"{key}.lock"

    def _warn_once(self, token: object, message: str, *args: object) -> None:
        """Log a WARNING the first time ``token`` is seen by this store (debug afterwards)."""
        with self._mutex:
            first = token not in self._warned
            self._warned.add(token)
        log.log(logging.WARNING if first else logging.DEBUG, message, *args)

    def _check_parents(self) -> None:
        """Refuse a root that another user could rename away and replace with their own
        (the directories above it: see tier_problem)."""
        above = _ancestor_problem(self.root)
        if above:
            parent, problem = above
            raise CacheDirError(
                f"mlpjit cache dir {self.root} is inside {parent}, which {problem}: another user "
                f"could rename the cache away and plant their own cubins. Fix: chmod go-w "
                f"{parent} (or chmod +t {parent}, if it is yours or root's), or set "
                f"MLPJIT_CACHE_DIR to a private directory"
            )

    def _check_root(self) -> bool:
        """True if the root exists and is safe (parents included), False if missing; else raise."""
        if self.root in self._safe_dirs:
            return True
        if not os.path.lexists(self.root):
            return False
        self._check_parents()
        return self._check_dir(self.root)

    def _check_dir(self, path: Path) -> bool:
        """True if ``path`` is a safe existing dir of the root, False if missing; else raise."""
        if path in self._safe_dirs:
            return True
        try:
            st = os.lstat(path)
        except OSError:
            return False
        repair = "; `mlpjit cache clear` repairs it" if path != self.root else ""
        if not stat.S_ISDIR(st.st_mode):
            raise CacheDirError(
                f"mlpjit cache path {path} is not a directory (a symlink is refused too: it "
                f"could point the cache anywhere){repair}"
            )
        if st.st_mode & _UNSAFE_BITS:
            raise CacheDirError(
                f"mlpjit cache dir {path} is writable by group or other users; a cached cubin "
                f"is code, so it is refused. Fix: chmod go-w {path} (or chmod 700 {path}), or "
                f"set MLPJIT_CACHE_DIR to a private directory"
            )
        if st.st_uid not in self._trusted:
            raise CacheDirError(
                f"mlpjit cache dir {path} is owned by uid {st.st_uid}, not by this user "
                f"(uid {self._euid}) or root; refusing to run code from it. Fix: set "
                f"MLPJIT_CACHE_DIR to a directory you own"
            )
        self._safe_dirs.add(path)
        return True

    def _root_dirs(self, *parts: str) -> bool:
        """Check the root, v1 and each nested part; False as soon as one is missing."""
        if not self._check_root():
            return False
        path = self._v1(self.root)
        if not self._check_dir(path):
            return False
        for part in parts:
            path = path / part
            if not self._check_dir(path):
                return False
        return True

    def _layer_ok(self, layer: Path) -> bool:
        """Whether the read-only layer passes the tier rule (tier_problem), judged once per
        store; a missing or unsafe one is skipped (an unsafe one with one warning)."""
        with self._mutex:
            verdict = self._layer_verdicts.get(layer)
        if verdict is not None:
            return verdict
        problem = tier_problem(layer)
        if problem and problem != "missing":
            self._warn_once(
                ("layer", layer),
                "mlpjit: skipping cache layer %s: %s (a layer must be owned by you or root, "
                "with no directory from / down to it writable by other users)",
                layer,
                problem,
            )
        with self._mutex:
            self._layer_verdicts[layer] = problem is None
        return problem is None

    def _layer_dirs(self, layer: Path, *parts: str) -> bool:
        """Check a layer's v1 and each nested part; False if one is missing or unsafe.

        An unsafe one (not a real directory, writable by group/other, or owned by an
        untrusted user) is skipped with one warning: someone else could have put any cubin
        there.
        """
        owners = self._trusted
        dirs = [self._v1(layer)]
        for part in parts:
            dirs.append(dirs[-1] / part)
        for path in dirs:
            if path in self._safe_layer_dirs:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                return False
            problem = _dir_problem(st, owners)
            if problem:
                self._warn_once(
                    ("layer-dir", path),
                    "mlpjit: skipping %s in read-only cache layer %s: it is %s (fix: chmod go-w, "
                    "or chown it to the layer's owner)",
                    path,
                    layer,
                    problem,
                )
                return False
            self._safe_layer_dirs.add(path)
        return True

    def _entry_dirs(self, base: Path, writable: bool, *parts: str) -> bool:
        """Check the directories from ``base`` down to v1/<parts>, by the rules of its kind."""
        return self._root_dirs(*parts) if writable else self._layer_dirs(base, *parts)

    def _owners(self, base: Path, writable: bool) -> frozenset[int]:
        """Who may own files under ``base``: us and root, in every tier."""
        return self._trusted

    def _make_root(self) -> None:
        """Create the root 0700 (missing parents 0755 less umask) unless it exists; check it."""
        if self._check_root():
            return
        self._check_parents()
        for parent in reversed(self.root.parents):
            if not os.path.lexists(parent):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(parent, 0o755)  # umask only removes bits: never writable by others
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root, 0o700)
            os.chmod(self.root, 0o700)  # mkdir's mode is masked by umask only downward
        self._check_parents()  # again: nobody may have slipped in a symlink meanwhile
        self._check_dir(self.root)

    def _make_dirs(self, path: Path) -> None:
        """Create ``path`` (under the root) 0700, creating the root 0700 too; check safety."""
        self._make_root()
        rel = path.relative_to(self.root)
        current = self.root
        for part in rel.parts:
            current = current / part
            if not self._check_dir(current):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(current, 0o700)
                self._check_dir(current)

    def layout_problems(self) -> list[tuple[Path, str]]:
        """(path, reason) for each directory of the writable root's layout (v1, its areas,
        the entry shards) that every access refuses (a symlink, another owner, group/other
        write): what `mlpjit cache verify` reports and `mlpjit cache clear` repairs.

        Missing directories are no problem; CacheDirError if the root itself is refused.
        """
        if not self._check_root():
            return []
        v1 = self._v1(self.root)
        problems: list[tuple[Path, str]] = []
        for path in (v1, *(v1 / area for area in _AREAS)):
            try:
                present = self._check_dir(path)
            except CacheDirError as err:
                problems.append((path, str(err)))
                if path == v1:
                    return problems
                continue
            if path.name == "entries" and present:
                problems += self._shard_problems(path)
        return problems

    def _shard_problems(self, entries: Path) -> list[tuple[Path, str]]:
        try:
            names = sorted(n for n in os.listdir(entries) if _SHARD_RE.fullmatch(n))
        except OSError:
            return []
        problems = []
        for name in names:
            try:
                self._check_dir(entries / name)
            except CacheDirError as err:
                problems.append((entries / name, str(err)))
        return problems

    def _origins(self) -> Iterator[tuple[Path, bool]]:
        """(base, writable) for the root (if present) and then each usable layer."""
        if self._root_dirs():
            yield self.root, True
        for layer in self.layers:
            if self._layer_ok(layer):
                yield layer, False

    # ----------------------------------------------------------------- reading

    def _load(self, base: Path, key: str, writable: bool, use: bool = False) -> Entry | None:
        """The verified entry for ``key`` under ``base``, or None (quarantining a bad one);
        ``use``: record the load as a use (see lookup)."""
        if not self._entry_dirs(base, writable, "entries", key[:2]):
            return None
        owners = self._owners(base, writable)
        mpath, cpath = self._entry_paths(base, key)
        for _ in range(3):
            try:
                mstat = os.lstat(mpath)
            except OSError:
                return None  # no manifest: not committed (or removed)
            try:
                raw = _read_trusted(mpath, MAX_MANIFEST_BYTES, owners)
                cubin = _read_trusted(cpath, MAX_CUBIN_BYTES, owners)
                manifest = verify_manifest(key, raw, cubin)
            except (OSError, CorruptEntryError) as err:
                if not same_file(mpath, mstat):
                    continue  # replaced or removed while we read it: look again
                reason = str(err) if isinstance(err, CorruptEntryError) else f"unreadable: {err}"
                if writable:
                    self._quarantine(key, reason, expect=mstat)
                else:
                    self._warn_once(
                        ("entry", base, key, reason),
                        "mlpjit: skipping bad entry %s in read-only cache layer %s: %s",
                        short_key(key),
                        base,
                        reason,
                    )
                return None
            if writable and use:
                self._touch(key, mpath)
            manifest = dict(manifest)
            manifest["last_used"] = max(_timestamp(manifest.get("last_used")), mstat.st_mtime)
            return Entry(key=key, manifest=manifest, cubin=cubin, origin=base)
        return None

    def _touch(self, key: str, mpath: Path) -> None:
        """Record use by the manifest's mtime, once per process and key (never rewrite it)."""
        with self._mutex:
            if key in self._touched:
                return
            self._touched.add(key)
        # A read-only root: last-used simply stays stale.
        with contextlib.suppress(OSError):
            os.utime(mpath, follow_symlinks=False)

    def lookup(self, key: str, *, use: bool = False) -> Entry | None:
        """The verified entry for ``key`` from the root or, failing that, a layer; else None.

        ``use``: the entry is loaded to be launched (the compile manager's loads), which sets
        its last_used; ``cache prune`` removes the least recently used first. Every other
        read (verify, export, push, import's check) leaves last_used alone, or reading the
        whole cache would make every entry look just used.
        """
        check_key(key)
        for base, writable in self._origins():
            entry = self._load(base, key, writable, use)
            if entry is not None:
                return entry
        return None

    def _read_alias(self, base: Path, writable: bool, spec: str) -> str | None:
        """The full key the alias file for ``spec`` under ``base`` names, or None."""
        if not self._entry_dirs(base, writable, "aliases"):
            return None
        path = self._v1(base) / "aliases" / spec
        try:
            raw = _read_trusted(path, MAX_ALIAS_BYTES, self._owners(base, writable))
        except FileNotFoundError:
            return None
        except (OSError, CorruptEntryError) as err:
            self._warn_once(("alias", path), "mlpjit: ignoring cache alias %s: %s", path, err)
            return None
        key = raw.decode("ascii", errors="replace").strip()
        return key if is_key(key) else None

    def lookup_alias(self, spec: str, *, use: bool = False) -> Entry | None:
        """The entry an alias names for a toolchain-less spec key (for compiler-less hits);
        ``use`` as for lookup."""
        check_key(spec, "spec key")
        for base, writable in self._origins():
            key = self._read_alias(base, writable, spec)
            if key is None:
                continue
            entry = self._load(base, key, writable, use)
            if entry is not None and spec_key(entry.manifest["components"]) == spec:
                return entry
        return None

    def _shards(self, base: Path, writable: bool) -> list[Path]:
        """The shard directories of ``base``'s entries (for a layer, only trusted ones).

        Only what lookup would use: real directories named like a key's first two digits.
        """
        if not writable and not self._layer_dirs(base, "entries"):
            return []
        entries = self._v1(base) / "entries"
        try:
            shards = sorted(
                p for p in entries.iterdir() if _SHARD_RE.fullmatch(p.name) and _is_real_dir(p)
            )
        except OSError:
            return []
        return [s for s in shards if writable or self._layer_dirs(base, "entries", s.name)]

    def iter_manifests(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(key, manifest) for every committed entry, root first, each key once.

        Each manifest dict gets "origin" (the root it is in), "last_used" from the
        manifest's mtime and "cubin_bytes" from the cubin file's size (0 if it is missing or
        not a regular file); "created" is clamped to a showable time. A manifest that cannot
        be read or parsed (not a regular file, too big, not a JSON object, nested too
        deeply) is yielded as {"error": reason, "origin":
        ...} so callers such as `mlpjit cache verify` can report it; the cubin is not read
        here (use lookup to verify).
        """
        seen: set[str] = set()
        for base, writable in self._origins():
            for shard in self._shards(base, writable):
                for mpath in sorted(shard.glob("*.json")):
                    key = mpath.stem
                    if not is_key(key) or key[:2] != shard.name or key in seen:
                        continue
                    seen.add(key)
                    try:
                        raw, st = read_regular(mpath, MAX_MANIFEST_BYTES)
                        manifest = loads_json(raw)
                        if not isinstance(manifest, dict):
                            raise ValueError("not a JSON object")
                    except (OSError, ValueError) as err:
                        yield key, {"error": f"unreadable manifest: {err}", "origin": str(base)}
                        continue
                    manifest["origin"] = str(base)
                    # Not under the checksum: sizes come from the file, times are clamped.
                    manifest["cubin_bytes"] = _regular_size(mpath.with_suffix(".cubin"))
                    manifest["created"] = _timestamp(manifest.get("created"))
                    manifest["last_used"] = max(_timestamp(manifest.get("last_used")), st.st_mtime)
                    yield key, manifest

    # ----------------------------------------------------------------- writing

    def _write_temp(self, data: bytes, durable: bool = True) -> Path:
        """A temp file in v1/tmp holding ``data``, fsync-ed if ``durable`` (removed on error).

        Created through an fd of v1/tmp (each directory opened without following a link)
        exclusively (O_EXCL | O_NOFOLLOW: never through a planted file or symlink), 0600,
        with a random name that starts with our pid (see maintenance: leftovers).
        """
        with opened_dir(self.root, "v1", "tmp") as dir_fd:
            fd, name = create_exclusive_at(dir_fd, f"{os.getpid()}.")
            try:
                _write_all(fd, data)
                if durable:
                    os.fsync(fd)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
                raise
            os.close(fd)
        return self._v1(self.root) / "tmp" / name

    def _replace_with(self, data: bytes, dest: Path, durable: bool = True) -> None:
        tmp = self._write_temp(data, durable)
        try:
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _write_entry(self, key: str, manifest: Mapping[str, Any], cubin: bytes) -> None:
        mpath, cpath = self._entry_paths(self.root, key)
        self._make_dirs(mpath.parent)
        self._make_dirs(self._v1(self.root) / "tmp")
        self._make_dirs(self._v1(self.root) / "aliases")
        # Un-commit whatever was there first, so no reader pairs an old manifest with the
        # new cubin between the two renames below.
        mpath.unlink(missing_ok=True)
        wrote_cubin = False
        try:
            self._replace_with(cubin, cpath)
            wrote_cubin = True
            self._replace_with(canonical_json(dict(manifest)).encode(), mpath)  # the commit
        except BaseException:
            if wrote_cubin:
                cpath.unlink(missing_ok=True)  # no cubin without a manifest left behind
            raise
        self._fsync_dir(mpath.parent)
        try:
            alias = self._v1(self.root) / "aliases" / manifest["spec_key"]
            # Not fsync-ed: a lost alias only costs a compiler-less hit after a power loss.
            self._replace_with(f"{key}\n".encode(), alias, durable=False)
        except OSError as err:
            log.debug("mlpjit: could not write alias for %s: %s", short_key(key), err)

    def _warn_unwritable(self, err: OSError) -> None:
        with self._mutex:
            first = not self._write_warned
            self._write_warned = True
        reason = errno.errorcode.get(err.errno or 0, type(err).__name__)
        if first:
            log.warning(
                "mlpjit: cannot write the compile cache at %s (%s: %s); kernels compiled by "
                "this process are kept in memory only. Fix: make MLPJIT_CACHE_DIR a writable "
                "directory with free space",
                self.root,
                reason,
                err,
            )
        else:
            log.debug("mlpjit: cache write failed again (%s: %s)", reason, err)

    def publish(
        self,
        key: str,
        components: Mapping[str, Any],
        binary: KernelBinary,
        compile_seconds: float,
    ) -> Entry:
        """Store a compile atomically (cubin, then manifest, then alias) and return its Entry.

        Disk problems (read-only dir, missing parent, ENOSPC, ...) do not raise: the entry is
        returned with persisted=False, nothing partial is left, and one WARNING is logged per
        store. An unsafe root still raises CacheDirError.
        """
        check_key(key)
        components = dict(components)
        if cache_key(components) != key:
            raise ValueError("publish: key is not the cache_key of components")
        now = time.time()
        manifest = {
            "format": FORMAT_VERSION,
            "key": key,
            "spec_key": spec_key(components),
            "components": components,
            **launch_fields(binary),
            "cubin_sha256": hashlib.sha256(binary.cubin).hexdigest(),
            "cubin_bytes": len(binary.cubin),
            "launch_sha256": launch_sha256(key, binary),
            "compile_seconds": round(float(compile_seconds), 6),
            "created": now,
            "last_used": now,
        }
        try:
            self._write_entry(key, manifest, binary.cubin)
        except CacheDirError:
            raise
        except OSError as err:
            self._warn_unwritable(err)
            return Entry(key, manifest, bytes(binary.cubin), self.root, persisted=False)
        with self._mutex:
            self._touched.add(key)
        return Entry(key, manifest, bytes(binary.cubin), self.root)

    # ----------------------------------------------------------------- removal

    def _quarantine(self, key: str, reason: str, expect: os.stat_result | None) -> bool:
        """Move the root's entry for ``key`` to v1/quarantine with a reason file.

        With ``expect``, only if the manifest is still that very file: a concurrent publish
        may have replaced the bad entry with a good one, which must not be moved.
        """
        mpath, cpath = self._entry_paths(self.root, key)
        if expect is not None and not same_file(mpath, expect):
            return False
        qdir = self._v1(self.root) / "quarantine" / f"{key}.{time.time_ns()}.{os.getpid()}"
        try:
            self._make_dirs(qdir)
            os.replace(mpath, qdir / mpath.name)  # un-commit first
        except FileNotFoundError:
            return False
        except OSError as err:
            log.warning(
                "mlpjit: bad cache entry %s (%s) could not be quarantined: %s",
                short_key(key),
                reason,
                err,
            )
            return False
        # A missing cubin may be the very reason.
        with contextlib.suppress(OSError):
            os.replace(cpath, qdir / cpath.name)
        with contextlib.suppress(OSError):
            (qdir / "reason.txt").write_text(reason + "\n")
        with self._mutex:
            self.quarantined += 1
        log.warning(
            "mlpjit: quarantined cache entry %s (%s) to %s; it will be recompiled",
            short_key(key),
            reason,
            qdir,
        )
        return True

    def quarantine(self, key: str, reason: str) -> None:
        """Move the root's entry for ``key`` (if any) to v1/quarantine/ with ``reason``."""
        check_key(key)
        if self._root_dirs("entries", key[:2]):
            self._quarantine(key, reason, expect=None)

    @staticmethod
    def _spec_of(mpath: Path) -> str | None:
        """The spec_key a manifest names (to find its alias), or None if it is unreadable."""
        try:
            manifest = loads_json(read_regular(mpath, MAX_MANIFEST_BYTES)[0])
        except (OSError, ValueError):
            return None
        spec = manifest.get("spec_key") if isinstance(manifest, dict) else None
        return spec if isinstance(spec, str) else None

    def remove(self, key: str) -> bool:
        """Delete the root's entry for ``key``; False if absent or being compiled right now.

        Takes the key's lock without waiting, so an entry is never removed halfway through
        a publish (that would leave a manifest without its cubin), and removes the key's
        lock file while holding it (locks.remove_lock_file), so lock files do not pile up.
        """
        check_key(key)
        if not self._root_dirs("entries", key[:2]):
            return False
        from mlpjit.jit.locks import KeyLock, remove_lock_file

        mpath, cpath = self._entry_paths(self.root, key)
        lock = KeyLock(self.lock_path(key))
        if not lock.try_acquire():
            return False
        try:
            spec = self._spec_of(mpath)
            removed = False
            for path in (mpath, cpath):  # manifest first: un-commit before deleting code
                try:
                    path.unlink()
                    removed = True
                except FileNotFoundError:
                    pass
            if isinstance(spec, str) and is_key(spec):
                alias = self._v1(self.root) / "aliases" / spec
                try:
                    if read_regular(alias, MAX_ALIAS_BYTES)[0].strip() == key.encode():
                        alias.unlink()
                except (OSError, ValueError):
                    pass
            remove_lock_file(lock)  # held, so nobody else holds it (see locks.py)
            return removed
        finally:
            lock.release()
