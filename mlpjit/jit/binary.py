"""What a compile produces: the cubin plus the facts needed to launch it without CuTe DSL.

The launch facts travel in the cache manifest as plain JSON (no pickle), so
:func:`launch_fields` / :func:`binary_from_fields` convert both ways and validate types: a
manifest is untrusted input (it may be truncated, edited or from another version).
:func:`launch_sha256` binds those facts to the key and the cubin, so an edited manifest
cannot launch a cubin differently.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlpjit.jit.key import canonical_json

__all__ = [
    "PARAM_KINDS",
    "KernelBinary",
    "KernelParam",
    "binary_from_fields",
    "launch_fields",
    "launch_sha256",
]

PARAM_KINDS = ("ptr", "i32", "f32")


@dataclass(frozen=True)
class KernelParam:
    """One kernel parameter: its name and how the launcher packs it."""

    name: str
    kind: str  # "ptr" (8-byte device pointer) | "i32" | "f32"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"KernelParam name must be a non-empty str, got {self.name!r}")
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"KernelParam kind must be one of {PARAM_KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class KernelBinary:
    """A compiled kernel: cubin bytes, entry symbol and launch configuration."""

    cubin: bytes
    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    pdl: bool
    params: tuple[KernelParam, ...]
    # Thread block cluster shape (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION); (1, 1, 1): none.
    cluster: tuple[int, int, int] = (1, 1, 1)


def launch_fields(binary: KernelBinary) -> dict[str, Any]:
    """The launch facts of ``binary`` as a plain-JSON dict (everything except the cubin).

    "cluster" is written only for a cluster launch, so the manifests of other kernels stay
    as they were (and readable by versions that predate clusters).
    """
    fields = {
        "symbol": binary.symbol,
        "grid": list(binary.grid),
        "block": list(binary.block),
        "smem_bytes": binary.smem_bytes,
        "pdl": binary.pdl,
        "params": [{"name": p.name, "kind": p.kind} for p in binary.params],
    }
    if tuple(binary.cluster) != (1, 1, 1):
        fields["cluster"] = list(binary.cluster)
    return fields


def launch_sha256(key: str, binary: KernelBinary) -> str:
    """sha256 over everything that decides how ``binary`` is launched, bound to ``key``.

    Covers the canonical JSON of :func:`launch_fields` (symbol, grid, block, shared memory,
    PDL, parameter list, cluster), the cubin's sha256 and the cache key. The manifest stores
    it and every load recomputes it from the parsed fields, so a bit flip or an edit of any
    launch field is refused instead of launching the kernel with another configuration.
    """
    payload = {
        "key": key,
        "cubin_sha256": hashlib.sha256(binary.cubin).hexdigest(),
        "launch": launch_fields(binary),
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def _dim3(fields: Mapping[str, Any], name: str) -> tuple[int, int, int]:
    value = fields.get(name)
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(type(v) is int and v >= 1 for v in value)
    ):
        raise ValueError(
            f"manifest field {name!r} must be a list of 3 positive ints, got {value!r}"
        )
    return (value[0], value[1], value[2])


def binary_from_fields(fields: Mapping[str, Any], cubin: bytes) -> KernelBinary:
    """Rebuild a KernelBinary from :func:`launch_fields` output; ValueError if malformed."""
    symbol = fields.get("symbol")
    if not isinstance(symbol, str) or not symbol:
        raise ValueError(f"manifest field 'symbol' must be a non-empty str, got {symbol!r}")
    smem = fields.get("smem_bytes")
    if type(smem) is not int or smem < 0:
        raise ValueError(f"manifest field 'smem_bytes' must be an int >= 0, got {smem!r}")
    pdl = fields.get("pdl")
    if type(pdl) is not bool:
        raise ValueError(f"manifest field 'pdl' must be a bool, got {pdl!r}")
    raw_params = fields.get("params")
    if not isinstance(raw_params, list) or not all(isinstance(p, dict) for p in raw_params):
        raise ValueError(f"manifest field 'params' must be a list of objects, got {raw_params!r}")
    params = tuple(KernelParam(p.get("name"), p.get("kind")) for p in raw_params)
    cluster = _dim3(fields, "cluster") if "cluster" in fields else (1, 1, 1)
    grid = _dim3(fields, "grid")
    if any(g % c for g, c in zip(grid, cluster, strict=True)):
        raise ValueError(f"manifest field 'cluster' {list(cluster)} must divide grid {list(grid)}")
    return KernelBinary(
        cubin=bytes(cubin),
        symbol=symbol,
        grid=grid,
        block=_dim3(fields, "block"),
        smem_bytes=smem,
        pdl=pdl,
        params=params,
        cluster=cluster,
    )
