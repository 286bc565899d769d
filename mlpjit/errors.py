"""Every exception mlpjit raises on purpose, in one module so callers can catch them.

Each takes a message and, keyword-only, the fields a caller may want without parsing the
message: ``argument`` (the option, env var or parameter at fault), ``value`` (what it was
given, already shortened for display), ``path`` (the file or directory) and ``key`` (the
cache key). The CLI builds its one error line, and its JSON error object, from them.

They pickle across worker processes with their fields (a compile error raised in a warm
job reaches the parent intact): the message is the only positional argument and the
fields travel in the instance dict, which is what BaseException's pickling carries.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MlpjitError",
    "UsageError",
    "CacheDirError",
    "CompilerUnavailableError",
    "CaptureError",
    "CorruptEntryError",
    "MissingDependencyError",
]

FIELDS = ("argument", "value", "path", "key")


class MlpjitError(RuntimeError):
    """Base class of mlpjit's own errors: a problem outside mlpjit's code (a bad value, a
    file, the environment), never a bug. The CLI prints these as one line."""

    def __init__(
        self,
        message: str = "",
        *,
        argument: str | None = None,
        value: Any = None,
        path: str | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.argument = argument
        self.value = value
        self.path = None if path is None else str(path)
        self.key = key

    def __str__(self) -> str:
        return self.message

    def fields(self) -> dict[str, Any]:
        """The fields that are set (argument, value, path, key), for a JSON error object."""
        return {name: getattr(self, name) for name in FIELDS if getattr(self, name) is not None}


class UsageError(MlpjitError, ValueError):
    """A value given from outside (a CLI argument, an MLPJIT_* variable, a request line, a
    checkpoint's config) that mlpjit does not take. Also a ValueError, so callers that
    catch ValueError keep working."""


class CacheDirError(MlpjitError):
    """The cache directory is unusable or unsafe (e.g. writable by other users)."""


class CompilerUnavailableError(MlpjitError):
    """A kernel is not in any cache and nvidia-cutlass-dsl is not installed to compile it."""


class CaptureError(MlpjitError):
    """A compile or module load was needed while a CUDA graph was being captured."""


class CorruptEntryError(MlpjitError):
    """A cache entry failed verification (hash, manifest or key mismatch)."""


class MissingDependencyError(MlpjitError, ImportError):
    """An optional dependency a feature needs is not installed; the message names the
    extra that installs it (e.g. ``pip install 'mlpjit[checkpoint]'``)."""
