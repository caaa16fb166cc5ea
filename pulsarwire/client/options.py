"""What the client's parts share: the user-facing enums, token authentication,
broker addresses, topic naming and the errors after which retrying is pointless."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlparse

from .. import compression
from .._proto import PulsarApi_pb2 as pb
from ..errors import (
    AuthenticationError, AuthorizationError, NotAllowedError, ProducerFencedError, TopicNotFoundError,
    TopicTerminatedError,
)

DEFAULT_PORT = 6650
DEFAULT_TLS_PORT = 6651
# Errors after which retrying the same producer or consumer cannot succeed.
FATAL_ERRORS = (TopicTerminatedError, ProducerFencedError, NotAllowedError, AuthenticationError,
                AuthorizationError, TopicNotFoundError)


class ConsumerType(enum.IntEnum):
    Exclusive = pb.CommandSubscribe.Exclusive
    Shared = pb.CommandSubscribe.Shared
    Failover = pb.CommandSubscribe.Failover
    KeyShared = pb.CommandSubscribe.Key_Shared


class InitialPosition(enum.IntEnum):
    Latest = pb.CommandSubscribe.Latest
    Earliest = pb.CommandSubscribe.Earliest


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

    def auth_data(self) -> bytes:
        token = self._token() if callable(self._token) else self._token
        return token.encode()


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, url: str) -> "Address":
        parsed = urlparse(url)
        if parsed.scheme not in ("pulsar", "pulsar+ssl"):
            raise ValueError(f"service URL must be pulsar:// or pulsar+ssl://, got {url!r}")
        tls = parsed.scheme == "pulsar+ssl"
        if not parsed.hostname:
            raise ValueError(f"service URL has no host: {url!r}")
        return cls(parsed.hostname, parsed.port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT), tls)

    def url(self) -> str:
        return f"{'pulsar+ssl' if self.tls else 'pulsar'}://{self.host}:{self.port}"


def topic_name(topic: str) -> str:
    """Fully qualify a short topic name: `t` -> `persistent://public/default/t`; ValueError for a
    name that is not `topic`, `tenant/namespace/topic` or `scheme://tenant/namespace/topic`."""
    if "://" in topic:
        scheme, _, rest = topic.partition("://")
        parts = rest.split("/")
        # four parts: the older tenant/cluster/namespace/topic form
        if scheme in ("persistent", "non-persistent") and len(parts) in (3, 4) and all(parts):
            return topic
    else:
        parts = topic.split("/")
        if len(parts) == 1 and topic:
            return f"persistent://public/default/{topic}"
        if len(parts) == 3 and all(parts):
            return f"persistent://{topic}"
    raise ValueError(f"invalid topic name {topic!r}")


def partition_name(topic: str, index: int) -> str:
    return f"{topic}-partition-{index}"


def now_ms() -> int:
    return int(time.time() * 1000)
