"""Compressed cache archives: the compression a file name asks for, the one a file's first
bytes hold, compressing a stream, and decompressing one with a cap on what comes out.

Export compresses by the destination's suffix (gzip, xz or bzip2: the standard library's
three); import goes by the content's magic bytes, whatever the name (stdin has none). A
compressed archive is decompressed into an anonymous temp file, at most ``cap`` bytes of
output, so a decompression bomb costs at most that much disk and the time to write it; the
plain tar then goes through every check a plain archive does.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import tempfile
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from mlpjit.jit.messages import one_line

__all__ = [
    "COMPRESSIONS",
    "SUFFIXES",
    "compressed_writer",
    "compression_for_name",
    "compression_of",
    "decompress_capped",
]

COMPRESSIONS = ("gz", "xz", "bz2")
# Name endings -> compression, longest first (".tar.gz" before ".gz").
SUFFIXES = (
    (".tar.gz", "gz"),
    (".tgz", "gz"),
    (".gz", "gz"),
    (".tar.xz", "xz"),
    (".txz", "xz"),
    (".xz", "xz"),
    (".tar.bz2", "bz2"),
    (".tbz2", "bz2"),
    (".tbz", "bz2"),
    (".bz2", "bz2"),
)
# Compressed names mlpjit does not write: refused rather than written as a plain tar.
_OTHER_SUFFIXES = (".zst", ".tzst", ".zstd", ".lz4", ".lz", ".lzma", ".z", ".zip", ".7z")
_NAMES = {"gz": "gzip", "xz": "xz", "bz2": "bzip2", "zstd": "zstd"}
# Leading bytes of each compressed format.
_MAGIC = (
    (b"\x1f\x8b", "gz"),
    (b"BZh", "bz2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
_CHUNK = 1 << 20
# What a damaged stream raises: gzip BadGzipFile (an OSError) or EOFError when truncated,
# zlib.error for bad deflate data, lzma.LZMAError, bz2's OSError("Invalid data stream").
_STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)


def compression_for_name(name: str) -> str | None:
    """The compression the file name ``name`` asks for ("gz", "xz" or "bz2"), or None for a
    plain tar (any other name, and "-").

    ValueError (one line) for a compressed suffix mlpjit does not write (.zst, .zip, ...):
    writing a plain tar under such a name would be a lie.
    """
    lower = name.lower()
    for suffix, kind in SUFFIXES:
        if lower.endswith(suffix):
            return kind
    if lower.endswith(_OTHER_SUFFIXES):
        raise ValueError(
            f"{name!r} asks for a compression mlpjit does not write; name a .tar, .tar.gz "
            f"(.tgz), .tar.xz or .tar.bz2 file"
        )
    return None


def compression_of(head: bytes) -> str | None:
    """The compression whose magic bytes ``head`` (a file's first 8 bytes) starts with: "gz",
    "xz", "bz2", "zstd"; None for anything else (a plain tar, or garbage)."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    return None


@contextlib.contextmanager
def compressed_writer(out: BinaryIO, compression: str | None) -> Iterator[BinaryIO]:
    """A file object writing to ``out`` through ``compression`` (None: ``out`` itself).

    The output depends on the input bytes only: gzip gets mtime 0 and no file name, so the
    same cache exports to the same file. Closing the writer finishes the stream but leaves
    ``out`` open (the caller fsyncs and renames it).
    """
    if compression is None:
        yield out
        return
    with _writer(out, compression) as writer:
        yield writer


def _writer(out: BinaryIO, compression: str) -> BinaryIO:
    if compression == "gz":
        return gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0)
    if compression == "xz":
        return lzma.LZMAFile(out, "wb")
    if compression == "bz2":
        return bz2.BZ2File(out, "wb")
    raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")


def _reader(src: BinaryIO, compression: str) -> BinaryIO:
    if compression == "gz":
        return gzip.GzipFile(fileobj=src, mode="rb")
    if compression == "xz":
        return lzma.LZMAFile(src, "rb")
    if compression == "bz2":
        return bz2.BZ2File(src, "rb")
    raise ValueError(
        f"it is {_NAMES.get(compression, compression)}-compressed, which mlpjit does not read; "
        f"decompress it first, or export a .tar.gz, .tar.xz or .tar.bz2"
    )


def _write_all(out: io.FileIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[out.write(view) or 0 :]


def decompress_capped(src: BinaryIO, compression: str, cap: int) -> io.FileIO:
    """``src`` decompressed into an anonymous temp file (read-write, at offset 0).

    ValueError (one line, to follow "archive PATH rejected: ") when the stream is corrupt
    or truncated, when it would give more than ``cap`` bytes (the rest is never
    decompressed), or for a compression mlpjit does not read (zstd). The temp file has no
    name, so nothing is left behind, whatever happens.
    """
    reader = _reader(src, compression)
    out = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115 (returned open, or closed below)
    assert isinstance(out, io.FileIO)
    total = 0
    try:
        with reader:
            while True:
                try:
                    chunk = reader.read(min(_CHUNK, cap + 1 - total))
                except _STREAM_ERRORS as err:
                    raise ValueError(
                        f"its {_NAMES[compression]} stream is corrupt or truncated "
                        f"({one_line(err)})"
                    ) from None
                if not chunk:
                    break
                total += len(chunk)
                if total > cap:
                    raise ValueError(
                        f"it decompresses to more than {cap} bytes, the limit of an archive"
                    )
                _write_all(out, chunk)
        out.seek(0)
    except BaseException:
        out.close()
        raise
    return out
