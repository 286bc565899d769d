"""Every exception mlpjit raises on purpose, in one module so callers can catch them.

All are plain subclasses with a single message argument, so they pickle across worker
processes (a compile error raised in a warm job reaches the parent intact).
"""

from __future__ import annotations

__all__ = [
    "MlpjitError",
    "CacheDirError",
    "CompilerUnavailableError",
    "CaptureError",
    "CorruptEntryError",
    "MissingDependencyError",
]


class MlpjitError(RuntimeError):
    """Base class of mlpjit's own errors."""


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
