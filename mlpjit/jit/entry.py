"""A cache entry and the one check that makes bytes an entry (verify_manifest).

Every origin (the writable root, a read-only directory, the Redis tier, an imported
archive) hands its bytes to ``verify_manifest`` before anything is used: components that
hash to the key, the cubin's size and sha256, and launch_sha256 over every launch field.
Fields outside that checksum (times, compile_seconds) are read through clamps here.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlpjit.errors import CorruptEntryError
from mlpjit.jit.binary import KernelBinary, binary_from_fields, launch_sha256
from mlpjit.jit.bounds import clamped
from mlpjit.jit.key import FORMAT_VERSION, cache_key, short_key, spec_key
from mlpjit.jit.safe_read import loads_json

__all__ = ["MAX_TIMESTAMP", "Entry", "compile_seconds_of", "timestamp", "verify_manifest"]

# Manifest times outside the checksum are clamped to this (year ~4100): time.localtime and
# datetime cannot show 1e300.
MAX_TIMESTAMP = float(1 << 36)


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

    One check for every origin (the writable root, a read-only dir, the Redis tier, an
    imported archive): format and key fields, components that hash to ``key`` (and
    spec_key derived from them), the cubin's size and sha256, well-typed launch fields, and
    launch_sha256 over them, so no manifest change can make the cubin launch differently.
    CorruptEntryError with the reason otherwise.
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


def timestamp(value: object) -> float:
    """A manifest time (not under the checksum) as seconds in [0, MAX_TIMESTAMP], else 0.0."""
    return clamped(value, 0.0, MAX_TIMESTAMP, 0.0)


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
