"""FleetSigner: HMAC-SHA256 signatures over fleet cache entries and aliases.

A cache key hashes public inputs, so integrity checks alone let anyone who can write the
Redis keys store a self-consistent entry with any cubin. With a fleet secret
(MLPJIT_REMOTE_KEY_FILE) every upload is signed, and a node uses a remote entry only if its
signature verifies: a writer without the secret can get entries rejected, not run code.

What is signed is a canonical encoding: a domain tag, then each field as its 8-byte
big-endian length and its bytes. The lengths make the split between fields unambiguous (no
two field lists encode alike); the tags keep an alias signature from passing as an
entry's. Signatures are stored as 64 lowercase hex characters.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from mlpjit.jit.config import MIN_REMOTE_SECRET_BYTES

__all__ = ["MAX_SIGNATURE_BYTES", "FleetSigner", "encode_fields"]

MAX_SIGNATURE_BYTES = 128  # a stored signature is 64; the server refuses a longer field
_ENTRY_TAG = b"mlpjit-fleet-entry-v1"
_ALIAS_TAG = b"mlpjit-fleet-alias-v1"


def encode_fields(fields: Sequence[bytes]) -> bytes:
    """``fields`` as one byte string, each prefixed by its length (8 bytes, big-endian)."""
    return b"".join(len(field).to_bytes(8, "big") + field for field in fields)


class FleetSigner:
    """Signs and checks entries and aliases with one fleet secret.

    The secret is held privately and never appears in a repr, message or report.
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        """``secret``: the fleet key's bytes (config.remote_secret); ValueError if it is
        shorter than MIN_REMOTE_SECRET_BYTES."""
        if not isinstance(secret, bytes) or len(secret) < MIN_REMOTE_SECRET_BYTES:
            raise ValueError(f"the fleet secret must be at least {MIN_REMOTE_SECRET_BYTES} bytes")
        self._secret = secret

    def __repr__(self) -> str:
        return "FleetSigner(<secret>)"

    def __reduce__(self) -> object:
        raise TypeError("a FleetSigner holds the fleet secret and is not pickled")

    def _mac(self, tag: bytes, fields: Sequence[bytes]) -> bytes:
        """The hex HMAC-SHA256 of ``tag`` and ``fields`` (canonically encoded)."""
        message = encode_fields([tag, *fields])
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest().encode("ascii")

    def sign_entry(self, key: str, manifest: bytes, cubin: bytes) -> bytes:
        """The signature of ``key``'s entry: its manifest bytes exactly as stored, and its
        cubin."""
        return self._mac(_ENTRY_TAG, [key.encode("ascii"), manifest, cubin])

    def sign_alias(self, spec_key: str, key: str) -> bytes:
        """The signature of the alias that names ``key`` for ``spec_key``."""
        return self._mac(_ALIAS_TAG, [spec_key.encode("ascii"), key.encode("ascii")])

    def entry_problem(
        self, key: str, manifest: bytes, cubin: bytes, sig: bytes | None
    ) -> str | None:
        """None if ``sig`` signs this entry, else why it is refused (a rejection reason)."""
        return _problem(sig, self.sign_entry(key, manifest, cubin))

    def alias_problem(self, spec_key: str, key: str, sig: bytes | None) -> str | None:
        """None if ``sig`` signs the alias naming ``key`` for ``spec_key``, else why not."""
        return _problem(sig, self.sign_alias(spec_key, key))


def _problem(sig: bytes | None, expected: bytes) -> str | None:
    """None if ``sig`` is ``expected`` (compared in constant time), else the reason."""
    if not sig:
        return "it is not signed, and this node requires signatures (MLPJIT_REMOTE_KEY_FILE)"
    if not hmac.compare_digest(sig, expected):
        return (
            "its signature does not verify with this node's MLPJIT_REMOTE_KEY_FILE (forged, "
            "or signed with another key)"
        )
    return None
