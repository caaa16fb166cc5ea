"""Partition choice for keyed and unkeyed messages, as the Java client does it (and, with
`HashingScheme.BoostHash`, as the official C++ and Python clients hash keys)."""
from __future__ import annotations

import enum
import itertools

_INT31 = 0x7FFFFFFF


class HashingScheme(enum.Enum):
    JavaStringHash = "java_string_hash"
    Murmur3_32Hash = "murmur3_32"
    BoostHash = "boost_hash"


class RoutingMode(enum.Enum):
    RoundRobinPartition = "round_robin"
    SinglePartition = "single"


def java_string_hash(key: str) -> int:
    """Java's String.hashCode() over UTF-16 code units, made non-negative."""
    h = 0
    data = key.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h & _INT31


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit."""
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed & 0xFFFFFFFF
    length = len(data)
    rounded = length & ~3
    for i in range(0, rounded, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * c1) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        k = (k * c2) & 0xFFFFFFFF
        h ^= k
        h = ((h << 13) | (h >> 19)) & 0xFFFFFFFF
        h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    k = 0
    tail = length & 3
    if tail == 3:
        k ^= data[rounded + 2] << 16
    if tail >= 2:
        k ^= data[rounded + 1] << 8
    if tail >= 1:
        k ^= data[rounded]
        k = (k * c1) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        k = (k * c2) & 0xFFFFFFFF
        h ^= k
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def murmur3_32_hash(key: str) -> int:
    """Pulsar's Murmur3_32Hash: murmur3 of the UTF-8 bytes, made non-negative."""
    return murmur3_32(key.encode("utf-8")) & _INT31


_U64 = 0xFFFFFFFFFFFFFFFF


def _mulx(x: int, y: int) -> int:
    """The 128-bit product of two 64-bit words, folded: low word XOR high word."""
    product = x * y
    return (product & _U64) ^ (product >> 64)


def boost_hash(key: str) -> int:
    """The C++ client's BoostHash (its default): boost::hash of the UTF-8 bytes (Boost 1.81+, 64-bit),
    made non-negative. Checked against the official Python client's partition choices."""
    data = key.encode("utf-8")
    q, k = 0x9E3779B97F4A7C15, 0xDF442D22CE4859B9
    n = len(data)
    w = _mulx(q, k)  # seed 0
    h = w ^ n
    offset = 0
    while n - offset >= 8:
        w = (w + q) & _U64
        h ^= _mulx((int.from_bytes(data[offset:offset + 8], "little") + w) & _U64, k)
        offset += 8
    tail = data[offset:]
    size = len(tail)
    if size >= 4:
        word = (int.from_bytes(tail[size - 4:], "little") << ((size - 4) * 8)) | int.from_bytes(tail[:4], "little")
    elif size >= 1:
        x1, x2 = (size - 1) & 2, size >> 1
        word = (tail[x1] << (x1 * 8)) | (tail[x2] << (x2 * 8)) | tail[0]
    else:
        word = 0
    w = (w + q) & _U64
    h ^= _mulx((word + w) & _U64, k)
    return _mulx((h + w) & _U64, k) & _INT31


_HASHES = {HashingScheme.JavaStringHash: java_string_hash, HashingScheme.Murmur3_32Hash: murmur3_32_hash,
           HashingScheme.BoostHash: boost_hash}


class Router:
    """Chooses a partition: by key hash when a key is given, else round-robin."""

    def __init__(self, hashing: HashingScheme = HashingScheme.JavaStringHash,
                 mode: RoutingMode = RoutingMode.RoundRobinPartition, start: int = 0):
        self._hash = _HASHES[hashing]
        self._mode = mode
        self._counter = itertools.count(start)
        self._single = start

    @property
    def single_partition(self) -> bool:
        """Whether keyless messages all go to one partition (SinglePartition mode)."""
        return self._mode is RoutingMode.SinglePartition

    def partition(self, key: str | None, num_partitions: int) -> int:
        if key is not None:
            return self._hash(key) % num_partitions
        if self._mode is RoutingMode.SinglePartition:
            return self._single % num_partitions
        return next(self._counter) % num_partitions


class OutgoingMessage:
    """A message about to be sent, as a custom `message_router(message, num_partitions)` sees
    it (accessors named as on a received message)."""

    __slots__ = ("_content", "_options")

    def __init__(self, content: bytes, options: dict) -> None:
        self._content = content
        self._options = options

    def data(self) -> bytes:
        return bytes(self._content)

    def value(self) -> bytes:
        """The payload as it will be sent (schema-encoded), as the official router sees it."""
        return bytes(self._content)

    def partition_key(self) -> str | None:
        return self._options.get("partition_key")

    def ordering_key(self) -> bytes | None:
        return self._options.get("ordering_key")

    def properties(self) -> dict[str, str]:
        return dict(self._options.get("properties") or {})

    def event_timestamp(self) -> int:
        return self._options.get("event_timestamp") or 0

    def has_key(self) -> bool:
        return self._options.get("partition_key") is not None
