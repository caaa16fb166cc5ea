"""The asyncio client, one module per concern:

- `options`: enums, token authentication, addresses, topic naming;
- `connection`: one broker connection (transport, keep-alive, event dispatch) and the pool
  that shares connections and looks topics up;
- `reconnect`: the reconnect loop producers and consumers share;
- `producer`, `consumer`, `reader`: the per-partition workers and the user-facing objects;
- `client`: the `Client` entry point.

Protocol state lives in `pulsarwire.session` (sans-IO). Names follow the official
Python client where it has one (`create_producer`, `subscribe`, `send_async`, ...).
"""
from __future__ import annotations

from .client import Client
from .connection import Connection, ConnectionPool
from .consumer import Consumer
from .options import (
    DEFAULT_PORT, DEFAULT_TLS_PORT, Address, AuthenticationToken, CompressionType, ConsumerType,
    InitialPosition, partition_name, topic_name,
)
from .producer import Producer
from .reader import Reader

# Names the one-module client offered from its own imports and that user code may take from
# here: the message and routing types in its signatures, and the errors it raises.
from ..errors import (
    AuthenticationError, AuthorizationError, CodecError, ConnectionClosedError, NotAllowedError,
    ProducerFencedError, ProducerQueueFullError, PulsarWireError, ServerError, TimeoutError,
    TopicNotFoundError, TopicTerminatedError,
)
from ..messages import Message, MessageId, MessageIds
from ..routing import HashingScheme, RoutingMode

__all__ = [
    "DEFAULT_PORT", "DEFAULT_TLS_PORT", "Address", "AuthenticationToken", "Client", "CompressionType",
    "Connection", "ConnectionPool", "Consumer", "ConsumerType", "InitialPosition", "Producer", "Reader",
    "partition_name", "topic_name",
    "AuthenticationError", "AuthorizationError", "CodecError", "ConnectionClosedError", "HashingScheme",
    "Message", "MessageId", "MessageIds", "NotAllowedError", "ProducerFencedError", "ProducerQueueFullError",
    "PulsarWireError", "RoutingMode", "ServerError", "TimeoutError", "TopicNotFoundError",
    "TopicTerminatedError",
]
