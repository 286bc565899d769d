"""The on-disk compile cache: layout, atomic publish, verification, quarantine, layers.

Layout under a root (the writable MLPJIT_CACHE_DIR, or a read-only MLPJIT_CACHE_PATH layer):

    v1/entries/<key[:2]>/<key>.cubin   the code
    v1/entries/<key[:2]>/<key>.json    the manifest; written last, so its presence commits
    v1/aliases/<spec_key>              full key of the latest entry for a toolchain-less spec
    v1/locks/<key>.lock                per-key compile locks (see locks.py)
    v1/quarantine/<key>.<ns>.<pid>/    entries that failed verification, with reason.txt
    v1/tmp/                            temp files of in-progress publishes

A cubin is code that will run in the caller's process, so every load re-verifies the sha256
and the key, and a root writable by other users (or owned by another one) is refused.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
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
from mlpjit.jit.binary import KernelBinary, binary_from_fields, launch_fields
from mlpjit.jit.key import FORMAT_VERSION, cache_key, canonical_json, short_key, spec_key

__all__ = ["CacheStore", "Entry", "check_key"]

log = logging.getLogger(__name__)

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_UNSAFE_BITS = stat.S_IWGRP | stat.S_IWOTH


def check_key(key: str, what: str = "key") -> str:
    """Return ``key`` if it is a full cache key (64 lowercase hex); ValueError otherwise.

    Keys become file names, so this also keeps paths inside the cache dir.
    """
    if not isinstance(key, str) or not _KEY_RE.match(key):
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


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _same_file(path: Path, st: os.stat_result) -> bool:
    try:
        now = os.stat(path)
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
        self.root = Path(root if root is not None else config.cache_dir()).absolute()
        self.layers = tuple(
            Path(p).absolute() for p in (layers if layers is not None else config.cache_path())
        )
        self._mutex = threading.Lock()
        self._safe_dirs: set[Path] = set()
        self._skipped_layers: set[Path] = set()
        self._touched: set[str] = set()
        self._write_warned = False
        self.quarantined = 0  # entries this store moved to quarantine

    # ----------------------------------------------------------------- paths and safety

    @staticmethod
    def _v1(base: Path) -> Path:
        return base / "v1"

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

    def _check_dir(self, path: Path) -> bool:
        """True if ``path`` is a safe existing dir of the root, False if missing; else raise."""
        if path in self._safe_dirs:
            return True
        try:
            st = os.stat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            raise CacheDirError(f"mlpjit cache path {path} is not a directory")
        if st.st_mode & _UNSAFE_BITS:
            raise CacheDirError(
                f"mlpjit cache dir {path} is writable by group or other users; a cached cubin "
                f"is code, so it is refused. Fix: chmod go-w {path} (or chmod 700 {path}), or "
                f"set MLPJIT_CACHE_DIR to a private directory"
            )
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise CacheDirError(
                f"mlpjit cache dir {path} is owned by uid {st.st_uid}, not by this user "
                f"(uid {os.geteuid()}); refusing to run code from it. Fix: set MLPJIT_CACHE_DIR "
                f"to a directory you own, or list it in MLPJIT_CACHE_PATH as a read-only layer"
            )
        self._safe_dirs.add(path)
        return True

    def _root_dirs(self, *parts: str) -> bool:
        """Check the root, v1 and each nested part; False as soon as one is missing."""
        path = self.root
        if not self._check_dir(path):
            return False
        path = self._v1(path)
        if not self._check_dir(path):
            return False
        for part in parts:
            path = path / part
            if not self._check_dir(path):
                return False
        return True

    def _layer_ok(self, layer: Path) -> bool:
        """A read-only layer must exist and not be writable by group/other (else skipped)."""
        try:
            st = os.stat(layer)
        except OSError:
            return False
        if st.st_mode & _UNSAFE_BITS or not stat.S_ISDIR(st.st_mode):
            if layer not in self._skipped_layers:
                self._skipped_layers.add(layer)
                log.warning(
                    "mlpjit: skipping cache layer %s: not a directory or writable by group/other "
                    "(fix: chmod go-w %s)",
                    layer,
                    layer,
                )
            return False
        return True

    def _make_dirs(self, path: Path) -> None:
        """Create ``path`` (under the root) 0700, creating the root 0700 too; check safety."""
        if not self._check_dir(self.root):
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.root, 0o700)  # mkdir's mode is masked by umask only downward
            self._check_dir(self.root)
        rel = path.relative_to(self.root)
        current = self.root
        for part in rel.parts:
            current = current / part
            if not self._check_dir(current):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(current, 0o700)
                self._check_dir(current)

    def _origins(self) -> Iterator[tuple[Path, bool]]:
        """(base, writable) for the root (if present) and then each usable layer."""
        if self._root_dirs():
            yield self.root, True
        for layer in self.layers:
            if self._layer_ok(layer):
                yield layer, False

    # ----------------------------------------------------------------- reading

    def _parse(self, key: str, raw: bytes, cubin: bytes) -> dict[str, Any]:
        """Verify a manifest and its cubin against ``key``; CorruptEntryError with the reason."""
        try:
            manifest = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CorruptEntryError(f"manifest is not valid JSON ({err})") from None
        if not isinstance(manifest, dict):
            raise CorruptEntryError("manifest is not a JSON object")
        if manifest.get("format") != FORMAT_VERSION or manifest.get("key") != key:
            raise CorruptEntryError("manifest format or key field does not match")
        components = manifest.get("components")
        if not isinstance(components, dict):
            raise CorruptEntryError("manifest has no components object")
        try:
            actual = cache_key(components)
        except (TypeError, ValueError) as err:
            raise CorruptEntryError(f"manifest components are not canonical JSON ({err})") from None
        if actual != key:
            raise CorruptEntryError(
                f"manifest components (kernel {components.get('kernel')!r}, arch "
                f"{components.get('arch')!r}) hash to {short_key(actual)}, not to this key"
            )
        size, digest = manifest.get("cubin_bytes"), manifest.get("cubin_sha256")
        if len(cubin) != size:
            raise CorruptEntryError(f"cubin has {len(cubin)} bytes, manifest says {size!r}")
        if hashlib.sha256(cubin).hexdigest() != digest:
            raise CorruptEntryError("cubin sha256 does not match the manifest")
        try:
            binary_from_fields(manifest, cubin)
        except ValueError as err:
            raise CorruptEntryError(str(err)) from None
        return manifest

    def _load(self, base: Path, key: str, writable: bool) -> Entry | None:
        """The verified entry for ``key`` under ``base``, or None (quarantining a bad one)."""
        mpath, cpath = self._entry_paths(base, key)
        if writable and not self._root_dirs("entries", key[:2]):
            return None
        for _ in range(3):
            try:
                mstat = os.stat(mpath)
            except OSError:
                return None  # no manifest: not committed (or removed)
            try:
                raw = mpath.read_bytes()
                cubin = cpath.read_bytes()
                manifest = self._parse(key, raw, cubin)
            except (OSError, CorruptEntryError) as err:
                if not _same_file(mpath, mstat):
                    continue  # replaced or removed while we read it: look again
                reason = str(err) if isinstance(err, CorruptEntryError) else f"unreadable: {err}"
                if writable:
                    self._quarantine(key, reason, expect=mstat)
                else:
                    log.warning(
                        "mlpjit: skipping bad entry %s in read-only cache layer %s: %s",
                        short_key(key),
                        base,
                        reason,
                    )
                return None
            if writable:
                self._touch(key, mpath)
            manifest = dict(manifest)
            manifest["last_used"] = max(float(manifest.get("last_used") or 0), mstat.st_mtime)
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
            os.utime(mpath)

    def lookup(self, key: str) -> Entry | None:
        """The verified entry for ``key`` from the root or, failing that, a layer; else None."""
        check_key(key)
        for base, writable in self._origins():
            entry = self._load(base, key, writable)
            if entry is not None:
                return entry
        return None

    def lookup_alias(self, spec: str) -> Entry | None:
        """The entry an alias names for a toolchain-less spec key (for compiler-less hits)."""
        check_key(spec, "spec key")
        for base, writable in self._origins():
            path = self._v1(base) / "aliases" / spec
            if writable and not self._root_dirs("aliases"):
                continue
            try:
                key = path.read_text().strip()
            except (OSError, UnicodeDecodeError):
                continue
            if not _KEY_RE.match(key):
                continue
            entry = self._load(base, key, writable)
            if entry is not None and spec_key(entry.manifest["components"]) == spec:
                return entry
        return None

    def iter_manifests(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(key, manifest) for every committed entry, root first, each key once.

        Each manifest dict gets "origin" (the root it is in) and "last_used" from the
        manifest's mtime. A manifest that cannot be parsed is yielded as {"error": reason,
        "origin": ...} so callers such as `mlpjit cache verify` can report it; the cubin is
        not read here (use lookup to verify).
        """
        seen: set[str] = set()
        for base, _writable in self._origins():
            entries = self._v1(base) / "entries"
            try:
                shards = sorted(p for p in entries.iterdir() if p.is_dir())
            except OSError:
                continue
            for shard in shards:
                for mpath in sorted(shard.glob("*.json")):
                    key = mpath.stem
                    if not _KEY_RE.match(key) or key in seen:
                        continue
                    seen.add(key)
                    try:
                        mtime = mpath.stat().st_mtime
                        manifest = json.loads(mpath.read_bytes())
                        if not isinstance(manifest, dict):
                            raise ValueError("not a JSON object")
                    except (OSError, ValueError) as err:
                        yield key, {"error": f"unreadable manifest: {err}", "origin": str(base)}
                        continue
                    manifest["origin"] = str(base)
                    manifest["last_used"] = max(float(manifest.get("last_used") or 0), mtime)
                    yield key, manifest

    # ----------------------------------------------------------------- writing

    def _write_temp(self, data: bytes, durable: bool = True) -> Path:
        """A temp file in v1/tmp holding ``data``, fsync-ed if ``durable`` (removed on error)."""
        tmp_dir = self._v1(self.root) / "tmp"
        path = tmp_dir / f"{os.getpid()}.{threading.get_ident()}.{time.time_ns()}.tmp"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return path

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
        if expect is not None and not _same_file(mpath, expect):
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

    def remove(self, key: str) -> bool:
        """Delete the root's entry for ``key``; False if absent or being compiled right now.

        Takes the key's lock without waiting, so an entry is never removed halfway through
        a publish (that would leave a manifest without its cubin).
        """
        from mlpjit.jit.locks import KeyLock

        check_key(key)
        if not self._root_dirs("entries", key[:2]):
            return False
        mpath, cpath = self._entry_paths(self.root, key)
        lock = KeyLock(self.lock_path(key))
        if not lock.try_acquire():
            return False
        try:
            spec = None
            try:
                manifest = json.loads(mpath.read_bytes())
                spec = manifest.get("spec_key") if isinstance(manifest, dict) else None
            except (OSError, ValueError):
                pass
            removed = False
            for path in (mpath, cpath):  # manifest first: un-commit before deleting code
                try:
                    path.unlink()
                    removed = True
                except FileNotFoundError:
                    pass
            if isinstance(spec, str) and _KEY_RE.match(spec):
                alias = self._v1(self.root) / "aliases" / spec
                try:
                    if alias.read_text().strip() == key:
                        alias.unlink()
                except OSError:
                    pass
            return removed
        finally:
            lock.release()
