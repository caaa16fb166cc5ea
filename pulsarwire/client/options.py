"""What the client's parts share: the user-facing enums, token authentication,
broker addresses, topic naming, the retry backoff and the errors after which retrying is pointless."""
from __future__ import annotations

import enum
import re
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlparse

from .. import compression
from .._proto import PulsarApi_pb2 as pb
from ..errors import (
    AuthenticationError, AuthorizationError, IncompatibleSchemaError, NotAllowedError, ProducerFencedError,
    TopicNotFoundError, TopicTerminatedError,
)

DEFAULT_PORT = 6650
DEFAULT_TLS_PORT = 6651
# Errors after which retrying the same producer or consumer cannot succeed.
FATAL_ERRORS = (TopicTerminatedError, ProducerFencedError, NotAllowedError, AuthenticationError,
                AuthorizationError, TopicNotFoundError, IncompatibleSchemaError)


@dataclass(frozen=True, slots=True)
class Backoff:
    """The delay before retry `attempt` (0, 1, ...): `initial` seconds, doubling each attempt, at
    most `maximum`. Reconnecting producers and consumers, connects and lookups all wait this."""

    initial: float
    maximum: float

    def delay(self, attempt: int) -> float:
        return min(self.maximum, self.initial * (2 ** min(attempt, 20)))


class ConsumerType(enum.IntEnum):
    Exclusive = pb.CommandSubscribe.Exclusive
    Shared = pb.CommandSubscribe.Shared
    Failover = pb.CommandSubscribe.Failover
    KeyShared = pb.CommandSubscribe.Key_Shared


class InitialPosition(enum.IntEnum):
    Latest = pb.CommandSubscribe.Latest
    Earliest = pb.CommandSubscribe.Earliest


class ProducerAccessMode(enum.IntEnum):
    """Who may produce to a topic alongside this producer (as the official client names them)."""
    Shared = pb.Shared
    Exclusive = pb.Exclusive
    WaitForExclusive = pb.WaitForExclusive
    ExclusiveWithFencing = pb.ExclusiveWithFencing


class RegexSubscriptionMode(enum.IntEnum):
    """Which topics a pattern subscription considers (the broker's GetTopicsOfNamespace mode)."""
    PersistentOnly = pb.CommandGetTopicsOfNamespace.PERSISTENT
    NonPersistentOnly = pb.CommandGetTopicsOfNamespace.NON_PERSISTENT
    AllTopics = pb.CommandGetTopicsOfNamespace.ALL


class KeySharedMode(enum.IntEnum):
    AutoSplit = pb.AUTO_SPLIT
    Sticky = pb.STICKY


KEY_HASH_RANGE = 65536  # Key_Shared hashes keys (Murmur3) into 0..65535


class KeySharedPolicy:
    """How a Key_Shared subscription assigns keys to this consumer: AutoSplit (the broker splits
    the hash range among consumers) or Sticky (the consumer names its own inclusive hash ranges,
    `sticky_ranges=[(start, end), ...]` within 0..65535, which must not overlap another's)."""

    def __init__(self, key_shared_mode: KeySharedMode = KeySharedMode.AutoSplit,
                 allow_out_of_order_delivery: bool = False,
                 sticky_ranges: list[tuple[int, int]] | None = None) -> None:
        self.key_shared_mode = KeySharedMode(key_shared_mode)
        self.allow_out_of_order_delivery = bool(allow_out_of_order_delivery)
        ranges = [(int(start), int(end)) for start, end in (sticky_ranges or [])]
        if self.key_shared_mode == KeySharedMode.Sticky and not ranges:
            raise ValueError("a Sticky key-shared policy needs sticky_ranges")
        for start, end in ranges:
            if not 0 <= start <= end < KEY_HASH_RANGE:
                raise ValueError(f"hash range ({start}, {end}) is not within 0..{KEY_HASH_RANGE - 1}")
        ordered = sorted(ranges)
        for (_, end), (start, _) in zip(ordered, ordered[1:]):
            if start <= end:
                raise ValueError(f"sticky ranges overlap at {start}")
        self.sticky_ranges = ranges

    def to_proto(self) -> pb.KeySharedMeta:
        meta = pb.KeySharedMeta(keySharedMode=pb.STICKY if self.key_shared_mode == KeySharedMode.Sticky
                                else pb.AUTO_SPLIT,
                                allowOutOfOrderDelivery=self.allow_out_of_order_delivery)
        if self.key_shared_mode == KeySharedMode.Sticky:  # auto-split ignores ranges, as the official client
            meta.hashRanges.extend(pb.IntRange(start=start, end=end) for start, end in self.sticky_ranges)
        return meta

    def __repr__(self) -> str:
        return (f"KeySharedPolicy({self.key_shared_mode.name}, allow_out_of_order_delivery="
                f"{self.allow_out_of_order_delivery}, sticky_ranges={self.sticky_ranges})")


ConsumerKeySharedPolicy = KeySharedPolicy  # the official client's name for it


class CompressionType(enum.IntEnum):
    NONE = compression.NONE
    LZ4 = compression.LZ4
    ZLIB = compression.ZLIB
    ZSTD = compression.ZSTD
    SNAPPY = compression.SNAPPY


class AuthenticationToken:
    """Token auth; `token` is the token string or a callable returning it (refresh)."""

    method_name = "token"

    def __init__(self, token: str | Callable[[], str]) -> None:
        self._token = token
        self._supplied: str | None = None  # what prepare() got, for the CONNECT that follows

    def _supply(self) -> str:
        if not callable(self._token):
            return self._token
        try:
            token = self._token()
        except Exception as exc:  # noqa: BLE001 - any failure of the user's supplier is the answer
            raise AuthenticationError(f"the token supplier failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(token, str):
            raise AuthenticationError(f"the token supplier returned {type(token).__name__}, not str")
        return token

    async def prepare(self) -> None:
        """Called before each connect: a failing supplier fails the operation at once with
        AuthenticationError (as the official client does), not after connect retries."""
        self._supplied = self._supply()

    def auth_data(self) -> bytes:
        token, self._supplied = self._supplied, None
        return (token if token is not None else self._supply()).encode()


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int
    tls: bool
    http: bool = False  # an http(s):// service URL: lookups over HTTP (client/http_lookup.py)

    @classmethod
    def parse(cls, url: str) -> "Address":
        parsed = urlparse(url)
        if parsed.scheme not in ("pulsar", "pulsar+ssl"):
            raise ValueError(f"service URL must be pulsar:// or pulsar+ssl://, got {url!r}")
        tls = parsed.scheme == "pulsar+ssl"
        if not parsed.hostname:
            raise ValueError(f"service URL has no host: {url!r}")
        return cls(parsed.hostname, parsed.port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT), tls)

    @classmethod
    def parse_service_url(cls, url: str) -> "list[Address]":
        """The hosts of a service URL, which may list several (`pulsar://host1:6650,host2:6650`):
        the client uses the first and moves to the next when it cannot connect."""
        scheme, separator, rest = url.partition("://")
        if not separator:
            return [cls.parse(url)]  # raises: no scheme
        if scheme in ("http", "https"):  # an admin URL: one host, lookups over HTTP
            parsed = urlparse(url)
            if not parsed.hostname:
                raise ValueError(f"service URL has no host: {url!r}")
            tls = scheme == "https"
            return [cls(parsed.hostname, parsed.port or (443 if tls else 80), tls, http=True)]
        hosts = rest.split("/", 1)[0]
        return [cls.parse(f"{scheme}://{host}") for host in hosts.split(",")]

    def url(self) -> str:
        if self.http:
            return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"
        return f"{'pulsar+ssl' if self.tls else 'pulsar'}://{self.host}:{self.port}"


def topic_name(topic: str) -> str:
    """Fully qualify a short topic name: `t` -> `persistent://public/default/t`; ValueError for a
    name that is not `topic`, `tenant/namespace/topic` or `scheme://tenant/namespace/topic`."""
    if "://" in topic:
        scheme, _, rest = topic.partition("://")
        parts = rest.split("/")
        # four parts: the older tenant/cluster/namespace/topic form; more: a local name holding
        # '/' (`persistent://t/ns/a/b/c`), which the official client accepts as well
        if scheme in ("persistent", "non-persistent") and len(parts) >= 3 and all(parts):
            return topic
    else:
        parts = topic.split("/")
        if len(parts) == 1 and topic:
            return f"persistent://public/default/{topic}"
        if len(parts) == 3 and all(parts):
            return f"persistent://{topic}"
    raise ValueError(f"invalid topic name {topic!r}")


@dataclass(frozen=True)
class TopicsPattern:
    """A regex subscription's pattern: the namespace it lists and the regex topic names
    (scheme aside) must match in full, as Pulsar matches them."""
    namespace: str
    regex: "re.Pattern[str]"
    text: str  # the full pattern as sent to the broker: persistent://tenant/ns/regex

    @classmethod
    def parse(cls, pattern: "str | re.Pattern[str]") -> "TopicsPattern":
        regex_text, flags = (pattern.pattern, pattern.flags) if isinstance(pattern, re.Pattern) else (pattern, 0)
        if "://" not in regex_text:
            regex_text = f"persistent://{regex_text}" if regex_text.count("/") >= 2 else \
                f"persistent://public/default/{regex_text}"
        scheme, rest = regex_text.split("://", 1)
        parts = rest.split("/", 2)
        if len(parts) < 3 or not parts[2]:
            raise ValueError(f"a topics pattern needs tenant/namespace/regex, got {regex_text!r}")
        return cls(f"{parts[0]}/{parts[1]}", re.compile(rest, flags), regex_text)

    def matches(self, topic: str) -> bool:
        return self.regex.fullmatch(topic.split("://", 1)[-1]) is not None


def partition_name(topic: str, index: int) -> str:
    return f"{topic}-partition-{index}"


def now_ms() -> int:
    return int(time.time() * 1000)
