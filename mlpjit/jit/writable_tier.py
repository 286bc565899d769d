"""The writable tier (MLPJIT_CACHE_DIR): publish, verify, quarantine, remove, lock.

The root is created 0700 on the first publish. A directory of it that breaks the trust
rule (trust.py) raises CacheDirError on every access, with the fix; disk errors on
publish never raise (the entry is then served from memory, persisted=False). A publish
writes the cubin, then the manifest (the commit), then the alias, each through a temp file
renamed into place, so no reader sees half an entry.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlpjit.errors import CacheDirError
from mlpjit.jit import cache_layout, trust
from mlpjit.jit.binary import KernelBinary, launch_fields, launch_sha256
from mlpjit.jit.cache_layout import MAX_ALIAS_BYTES, MAX_MANIFEST_BYTES, is_key
from mlpjit.jit.directory_tier import DirectoryTier
from mlpjit.jit.entry import Entry
from mlpjit.jit.key import FORMAT_VERSION, cache_key, canonical_json, short_key, spec_key
from mlpjit.jit.safe_fs import create_exclusive_at, opened_dir
from mlpjit.jit.safe_read import loads_json, read_regular

if TYPE_CHECKING:
    from mlpjit.jit.locks import KeyLock

__all__ = ["WritableTier", "alias_file_key"]

log = logging.getLogger("mlpjit.jit.store")


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


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


class WritableTier(DirectoryTier):
    """The writable cache root (MLPJIT_CACHE_DIR): publish, verify, quarantine, remove.

    Created 0700 on the first publish. A directory of it that breaks the trust rule
    raises CacheDirError on every access; disk errors on publish never raise.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._safe_dirs: set[Path] = set()
        self._touched: set[str] = set()
        self._write_warned = False
        self.quarantined = 0  # entries this tier moved to quarantine

    # ----------------------------------------------------------------- directories

    def _check_root(self) -> bool:
        """True if the root exists and is safe (parents included), False if missing; else
        CacheDirError."""
        if self.path in self._safe_dirs:
            return True
        if not os.path.lexists(self.path):
            return False
        trust.refuse_root_parents(self.path)
        return self._check_dir(self.path)

    def _check_dir(self, path: Path) -> bool:
        """True if ``path`` is a safe existing dir of the root, False if missing; else raise."""
        if path in self._safe_dirs:
            return True
        try:
            st = os.lstat(path)
        except OSError:
            return False
        trust.refuse_root_dir(path, st, is_root=path == self.path)
        self._safe_dirs.add(path)
        return True

    def dirs_ok(self, *parts: str) -> bool:
        """Check the root, v1 and each nested part; False as soon as one is missing,
        CacheDirError for one that breaks the trust rule."""
        if not self._check_root():
            return False
        path = cache_layout.version_dir(self.path)
        if not self._check_dir(path):
            return False
        for part in parts:
            path = path / part
            if not self._check_dir(path):
                return False
        return True

    def _listable(self, *parts: str) -> bool:
        # Listing reads no entry: a bad directory inside is found by the get that follows.
        return self.dirs_ok()

    def usable(self, *parts: str) -> bool:
        """Whether v1/<parts...> exists and passes the checks (False instead of
        CacheDirError: maintenance leaves a bad one for `mlpjit cache clear` to repair)."""
        try:
            return self.dirs_ok(*parts)
        except CacheDirError:
            return False

    def _make_root(self) -> None:
        """Create the root 0700 (missing parents 0755 less umask) unless it exists; check it."""
        if self._check_root():
            return
        trust.refuse_root_parents(self.path)
        for parent in reversed(self.path.parents):
            if not os.path.lexists(parent):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(parent, 0o755)  # umask only removes bits: never writable by others
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.path, 0o700)
            os.chmod(self.path, 0o700)  # mkdir's mode is masked by umask only downward
        trust.refuse_root_parents(self.path)  # again: nobody may have slipped in a symlink
        self._check_dir(self.path)

    def make_dirs(self, path: Path) -> None:
        """Create ``path`` (under the root) 0700, creating the root 0700 too; check safety."""
        self._make_root()
        current = self.path
        for part in path.relative_to(self.path).parts:
            current = current / part
            if not self._check_dir(current):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(current, 0o700)
                self._check_dir(current)

    def layout_problems(self) -> list[tuple[Path, str]]:
        """(path, reason) for each directory of the layout (v1, its areas, the entry
        shards) that every access refuses; missing ones are no problem. CacheDirError if
        the root itself is refused."""
        if not self._check_root():
            return []
        v1 = cache_layout.version_dir(self.path)
        problems: list[tuple[Path, str]] = []
        for path in (v1, *(v1 / area for area in cache_layout.AREAS)):
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
            names = sorted(n for n in os.listdir(entries) if cache_layout.is_shard(n))
        except OSError:
            return []
        problems = []
        for name in names:
            try:
                self._check_dir(entries / name)
            except CacheDirError as err:
                problems.append((entries / name, str(err)))
        return problems

    # ----------------------------------------------------------------- locks

    def lock_path(self, key: str) -> Path:
        """Path of the key's lock file (its directory is created when possible)."""
        cache_layout.check_key(key)
        path = cache_layout.lock_path(self.path, key)
        # On failure the lock degrades to a no-op (see locks.py).
        with contextlib.suppress(OSError):
            self.make_dirs(path.parent)
        return path

    def lock(self, key: str) -> KeyLock:
        """The key's file lock (filelock is imported only here: a miss or maintenance)."""
        from mlpjit.jit.locks import KeyLock

        return KeyLock(self.lock_path(key))

    @contextlib.contextmanager
    def try_lock(self, key: str) -> Iterator[bool]:
        """The key's compile lock taken without waiting: yields whether it was taken (a
        holder is compiling or publishing the key right now), released on exit."""
        lock = self.lock(key)
        held = lock.try_acquire()
        try:
            yield held
        finally:
            lock.release()

    # ----------------------------------------------------------------- reading

    def _refuse(self, key: str, reason: str, mstat: os.stat_result) -> None:
        self._quarantine(key, reason, expect=mstat)

    def _record_use(self, key: str, mpath: Path) -> None:
        """Record use by the manifest's mtime, once per process and key (never rewrite it)."""
        with self._mutex:
            if key in self._touched:
                return
            self._touched.add(key)
        # A read-only root: last-used simply stays stale.
        with contextlib.suppress(OSError):
            os.utime(mpath, follow_symlinks=False)

    # ----------------------------------------------------------------- writing

    def _write_temp(self, data: bytes, durable: bool = True) -> Path:
        """A temp file in v1/tmp holding ``data``, fsync-ed if ``durable`` (removed on error).

        Created through an fd of v1/tmp (each directory opened without following a link)
        exclusively (O_EXCL | O_NOFOLLOW: never through a planted file or symlink), 0600,
        named by cache_layout.temp_prefix (maintenance tells a killed writer's leftovers by it).
        """
        with opened_dir(self.path, cache_layout.VERSION_DIR, "tmp") as dir_fd:
            fd, name = create_exclusive_at(dir_fd, cache_layout.temp_prefix())
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
        return cache_layout.area(self.path, "tmp") / name

    def _replace_with(self, data: bytes, dest: Path, durable: bool = True) -> None:
        tmp = self._write_temp(data, durable)
        try:
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _write_entry(self, key: str, manifest: Mapping[str, Any], cubin: bytes) -> None:
        mpath, cpath = cache_layout.entry_paths(self.path, key)
        self.make_dirs(mpath.parent)
        self.make_dirs(cache_layout.area(self.path, "tmp"))
        self.make_dirs(cache_layout.area(self.path, "aliases"))
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
        _fsync_dir(mpath.parent)
        try:
            alias = cache_layout.alias_path(self.path, manifest["spec_key"])
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
                self.path,
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
        tier. An unsafe root still raises CacheDirError.
        """
        cache_layout.check_key(key)
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
            return Entry(key, manifest, bytes(binary.cubin), self.path, persisted=False)
        with self._mutex:
            self._touched.add(key)
        return Entry(key, manifest, bytes(binary.cubin), self.path)

    # ----------------------------------------------------------------- removal

    def _quarantine(self, key: str, reason: str, expect: os.stat_result | None) -> bool:
        """Move the entry for ``key`` to v1/quarantine with a reason file.

        With ``expect``, only if the manifest is still that very file: a concurrent publish
        may have replaced the bad entry with a good one, which must not be moved.
        """
        mpath, cpath = cache_layout.entry_paths(self.path, key)
        if expect is not None and not trust.same_file(mpath, expect):
            return False
        qdir = cache_layout.quarantine_dir(self.path, key)
        try:
            self.make_dirs(qdir)
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
            (qdir / cache_layout.QUARANTINE_REASON).write_text(reason + "\n")
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
        """Move the entry for ``key`` (if any) to v1/quarantine/ with ``reason``."""
        cache_layout.check_key(key)
        if self.dirs_ok("entries", key[:2]):
            self._quarantine(key, reason, expect=None)

    def remove(self, key: str) -> bool:
        """Delete the entry for ``key``; False if absent or being compiled right now.

        Takes the key's lock without waiting, so an entry is never removed halfway through
        a publish (that would leave a manifest without its cubin), and removes the key's
        lock file while holding it (locks.remove_lock_file), so lock files do not pile up.
        """
        cache_layout.check_key(key)
        if not self.dirs_ok("entries", key[:2]):
            return False
        from mlpjit.jit.locks import remove_lock_file

        mpath, cpath = cache_layout.entry_paths(self.path, key)
        lock = self.lock(key)
        if not lock.try_acquire():
            return False
        try:
            spec = _spec_named_by(mpath)
            removed = False
            for path in (mpath, cpath):  # manifest first: un-commit before deleting code
                try:
                    path.unlink()
                    removed = True
                except FileNotFoundError:
                    pass
            if spec is not None and self.alias_names(spec, key):
                with contextlib.suppress(OSError):
                    cache_layout.alias_path(self.path, spec).unlink()
            remove_lock_file(lock)  # held, so nobody else holds it (see locks.py)
            return removed
        finally:
            lock.release()

    def alias_names(self, spec: str, key: str) -> bool:
        """Whether the alias file of ``spec`` names ``key``."""
        return alias_file_key(cache_layout.alias_path(self.path, spec)) == key


def alias_file_key(path: Path) -> str | None:
    """The key the alias file ``path`` names, or None if it names none (not a regular
    file, over the cap, not a key). Ownership is not checked: for removing, not serving."""
    try:
        key = read_regular(path, MAX_ALIAS_BYTES)[0].decode("ascii").strip()
    except (OSError, ValueError):  # a FIFO, device or link is refused unopened
        return None
    return key if is_key(key) else None


def _spec_named_by(mpath: Path) -> str | None:
    """The spec_key a manifest names (to find its alias), or None if it is unreadable or
    not a key."""
    try:
        manifest = loads_json(read_regular(mpath, MAX_MANIFEST_BYTES)[0])
    except (OSError, ValueError):
        return None
    spec = manifest.get("spec_key") if isinstance(manifest, dict) else None
    return spec if is_key(spec) else None
