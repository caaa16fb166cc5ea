"""Partition choice for keyed and unkeyed messages, as the Java client does it."""
from __future__ import annotations

import enum
import itertools

_INT31 = 0x7FFFFFFF


class HashingScheme(enum.Enum):
    JavaStringHash = "java_string_hash"
    Murmur3_32Hash = "murmur3_32"


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


class Router:
    """Chooses a partition: by key hash when a key is given, else round-robin."""

    def __init__(self, hashing: HashingScheme = HashingScheme.JavaStringHash,
                 mode: RoutingMode = RoutingMode.RoundRobinPartition, start: int = 0):
        self._hash = java_string_hash if hashing is HashingScheme.JavaStringHash else murmur3_32_hash
        self._mode = mode
        self._counter = itertools.count(start)
        self._single = start

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
