"""Payload compression as the Pulsar clients do it.

LZ4 and SNAPPY are raw *block* formats (no frame, no stored size): the size
comes from MessageMetadata.uncompressed_size. ZLIB is a zlib stream with its
header; ZSTD is one zstd frame.
"""
from __future__ import annotations

import threading
import zlib

import cramjam
import lz4.block
import zstandard

from .errors import DecompressionError

BytesLike = bytes | bytearray | memoryview

NONE, LZ4, ZLIB, ZSTD, SNAPPY = 0, 1, 2, 3, 4
NAMES = {NONE: "NONE", LZ4: "LZ4", ZLIB: "ZLIB", ZSTD: "ZSTD", SNAPPY: "SNAPPY"}
BY_NAME = {name: value for value, name in NAMES.items()}

#: Default cap on a batch's declared uncompressed size, so that a hostile
#: uncompressed_size cannot make us allocate without bound.
DEFAULT_MAX_UNCOMPRESSED_SIZE = 64 * 1024 * 1024

# zstandard's (de)compressor objects must not be used by two threads at once (the broker
# decompresses on a worker thread while clients in the same process use their own), so
# each thread gets its own pair.
_zstd = threading.local()


def _zstd_compressor() -> zstandard.ZstdCompressor:
    compressor = getattr(_zstd, "compressor", None)
    if compressor is None:
        compressor = _zstd.compressor = zstandard.ZstdCompressor(level=3)
    return compressor


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    decompressor = getattr(_zstd, "decompressor", None)
    if decompressor is None:
        decompressor = _zstd.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def compression_type(value: int | str) -> int:
    """Accept a CompressionType number or name (any case) and return the number."""
    if isinstance(value, str):
        try:
            return BY_NAME[value.upper()]
        except KeyError:
            raise ValueError(f"unknown compression type {value!r}") from None
    if value not in NAMES:
        raise ValueError(f"unknown compression type {value!r}")
    return value


def compress(kind: int, data: BytesLike) -> bytes:
    """Compress `data` (any bytes-like) with the codec numbered `kind`."""
    if kind == NONE:
        return bytes(data)
    if kind == LZ4:
        return lz4.block.compress(data, store_size=False)
    if kind == ZLIB:
        return zlib.compress(data)
    if kind == ZSTD:
        return _zstd_compressor().compress(data)
    if kind == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    raise ValueError(f"unknown compression type {kind!r}")


class WhereItPays:
    """A producer's codec used only where it pays: a batch that it shrinks by less than an
    eighth (payloads already compressed, random, encrypted) goes uncompressed, as do the next
    15 batches without trying, then 31, 63 ... up to 255 while tries keep failing (a try costs
    about 3 us a KiB on such data: one in 256 batches is lost in the noise); a try that pays
    starts over at 15. Each batch says in its metadata whether it is compressed, so readers
    need nothing to follow."""

    __slots__ = ("kind", "_skip", "_next_skip")

    FIRST_SKIP, MOST_SKIP = 15, 255

    def __init__(self, kind: int) -> None:
        if kind == NONE:
            raise ValueError("compressing where it pays needs a compression type")
        self.kind = kind
        self._skip = 0
        self._next_skip = self.FIRST_SKIP

    def compress(self, data: BytesLike) -> tuple[int, BytesLike]:
        """(the codec used, its output) or (NONE, `data` itself)."""
        if self._skip:
            self._skip -= 1
            return NONE, data
        packed = compress(self.kind, data)
        if len(packed) > len(data) - (len(data) >> 3):
            self._skip = self._next_skip
            self._next_skip = min(2 * self._next_skip + 1, self.MOST_SKIP)
            return NONE, data
        self._next_skip = self.FIRST_SKIP
        return self.kind, packed


def decompress(kind: int, data: BytesLike, uncompressed_size: int,
               max_uncompressed_size: int = DEFAULT_MAX_UNCOMPRESSED_SIZE) -> BytesLike:
    """Decompress `data` and check it yields exactly `uncompressed_size` bytes.

    NONE returns `data` itself (no copy). Every failure is a DecompressionError.
    """
    if kind == NONE:
        return data
    if uncompressed_size < 0 or uncompressed_size > max_uncompressed_size:
        raise DecompressionError(
            f"declared uncompressed_size {uncompressed_size} is outside 0..{max_uncompressed_size}")
    try:
        if kind == LZ4:
            out = lz4.block.decompress(data, uncompressed_size=uncompressed_size)
        elif kind == ZLIB:
            d = zlib.decompressobj()
            out = d.decompress(data, uncompressed_size + 1)
            if not d.eof:
                raise DecompressionError("zlib stream is incomplete or longer than uncompressed_size")
        elif kind == ZSTD:
            # The frame header may declare its own size; refuse before allocating it.
            declared = zstandard.frame_content_size(data)
            if declared >= 0 and declared != uncompressed_size:
                raise DecompressionError(
                    f"ZSTD frame declares {declared} bytes, metadata says {uncompressed_size}")
            out = _zstd_decompressor().decompress(data, max_output_size=uncompressed_size + 1)
        elif kind == SNAPPY:
            declared = _snappy_declared_size(data)
            if declared != uncompressed_size:
                raise DecompressionError(
                    f"SNAPPY block declares {declared} bytes, metadata says {uncompressed_size}")
            out = bytes(cramjam.snappy.decompress_raw(data))
        else:
            raise DecompressionError(f"unknown compression type {kind}")
    except DecompressionError:
        raise
    except Exception as exc:  # each library raises its own types
        raise DecompressionError(f"{NAMES.get(kind, kind)} payload does not decompress: {exc}") from exc
    if len(out) != uncompressed_size:
        raise DecompressionError(
            f"{NAMES[kind]} payload gave {len(out)} bytes, metadata says {uncompressed_size}")
    return out


def _snappy_declared_size(data: BytesLike) -> int:
    """The uncompressed length a raw snappy block starts with (a varint)."""
    view = memoryview(data)
    result = shift = 0
    for pos in range(min(len(view), 5)):
        byte = view[pos]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result
        shift += 7
    raise DecompressionError("SNAPPY block has no valid length header")
