"""mlpjit.jit.binary: launch facts to and from plain JSON (clusters included), launch_sha256."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mlpjit.jit.binary import (
    KernelBinary,
    KernelParam,
    binary_from_fields,
    launch_fields,
    launch_sha256,
)

BINARY = KernelBinary(
    cubin=b"\x7fELF" + bytes(16),
    symbol="kernel",
    grid=(132, 1, 1),
    block=(384, 1, 1),
    smem_bytes=200_000,
    pdl=True,
    params=(KernelParam("out", "ptr"), KernelParam("n", "i32")),
)


def _roundtrip(binary: KernelBinary) -> KernelBinary:
    fields = json.loads(json.dumps(launch_fields(binary)))
    return binary_from_fields(fields, binary.cubin)


def test_plain_launch_has_no_cluster_field() -> None:
    """Manifests of kernels without clusters stay as they were before clusters existed."""
    fields = launch_fields(BINARY)
    assert "cluster" not in fields
    assert _roundtrip(BINARY) == BINARY
    assert _roundtrip(BINARY).cluster == (1, 1, 1)


def test_cluster_roundtrips() -> None:
    clustered = replace(BINARY, cluster=(2, 1, 1))
    assert launch_fields(clustered)["cluster"] == [2, 1, 1]
    assert _roundtrip(clustered) == clustered


@pytest.mark.parametrize("bad", [[2, 1], [0, 1, 1], "2,1,1", [2.0, 1, 1], [True, 1, 1]])
def test_malformed_cluster_is_rejected(bad: object) -> None:
    fields = launch_fields(BINARY)
    fields["cluster"] = bad
    with pytest.raises(ValueError, match="'cluster'"):
        binary_from_fields(fields, BINARY.cubin)


def test_cluster_must_divide_the_grid() -> None:
    fields = launch_fields(replace(BINARY, grid=(130, 1, 1)))
    fields["cluster"] = [4, 1, 1]
    with pytest.raises(ValueError, match="must divide grid"):
        binary_from_fields(fields, BINARY.cubin)


KEY = "ab" * 32


def test_launch_sha256_is_stable_and_bound_to_key_and_cubin() -> None:
    digest = launch_sha256(KEY, BINARY)
    assert digest == launch_sha256(KEY, _roundtrip(BINARY))
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert launch_sha256("cd" * 32, BINARY) != digest
    assert launch_sha256(KEY, replace(BINARY, cubin=BINARY.cubin + b"\x00")) != digest


@pytest.mark.parametrize(
    "change",
    [
        {"symbol": "other"},
        {"grid": (133, 1, 1)},
        {"block": (256, 1, 1)},
        {"smem_bytes": 199_999},
        {"pdl": False},
        {"params": (KernelParam("out", "ptr"), KernelParam("n", "f32"))},
        {"params": (KernelParam("n", "i32"), KernelParam("out", "ptr"))},
        {"cluster": (2, 1, 1)},
    ],
    ids=lambda change: next(iter(change)),
)
def test_launch_sha256_covers_every_launch_field(change: dict) -> None:
    assert launch_sha256(KEY, replace(BINARY, **change)) != launch_sha256(KEY, BINARY)
