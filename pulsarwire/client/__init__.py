"""The asyncio client, one module per concern:

- `options`: enums, token authentication, addresses, topic naming;
- `connection`: one broker connection (transport, keep-alive, event dispatch) and the pool
  that shares connections and looks topics up;
- `reconnect`: the reconnect loop producers and consumers share;
- `producer`, `consumer`, `reader`: the per-partition workers and the user-facing objects;
- `entries`: `EntryReader`, whole entries of one partition for bulk readers (the Spark source);
- `client`: the `Client` entry point.

Protocol state lives in `pulsarwire.session` (sans-IO). Names follow the official
Python client where it has one (`create_producer`, `subscribe`, `send_async`, ...).
"""
from __future__ import annotations

from .auth import AuthenticationBasic, AuthenticationOauth2, AuthenticationTLS
from .client import Client
from .connection import Connection, ConnectionPool
from .consumer import Consumer
from .dead_letter import DeadLetterPolicy, NegativeAckRedeliveryBackoff
from .entries import Entry, EntryReader
from .options import (
    DEFAULT_PORT, DEFAULT_TLS_PORT, Address, AuthenticationToken, CompressionType, ConsumerKeySharedPolicy,
    ConsumerType, InitialPosition, KeySharedMode, KeySharedPolicy, ProducerAccessMode, RegexSubscriptionMode,
    partition_name, topic_name,
)
from .producer import Producer
from .reader import Reader
from .table_view import TableView

# Names the one-module client offered from its own imports and that user code may take from
# here: the message and routing types in its signatures, and the errors it raises.
from ..errors import (
    AuthenticationError, AuthorizationError, CodecError, ConnectionClosedError, NotAllowedError,
    ProducerFencedError, ProducerQueueFullError, PulsarWireError, ServerError, TimeoutError,
    TopicNotFoundError, TopicTerminatedError,
)
from ..messages import Message, MessageId
from ..routing import HashingScheme, RoutingMode

__all__ = [
    "DEFAULT_PORT", "DEFAULT_TLS_PORT", "Address", "AuthenticationToken", "Client", "CompressionType",
    "AuthenticationBasic", "AuthenticationOauth2", "AuthenticationTLS", "DeadLetterPolicy",
    "NegativeAckRedeliveryBackoff", "TableView",
    "Connection", "ConnectionPool", "Consumer", "ConsumerKeySharedPolicy", "ConsumerType", "Entry", "EntryReader", "InitialPosition",
    "KeySharedMode", "KeySharedPolicy", "Producer", "ProducerAccessMode", "RegexSubscriptionMode", "Reader",
    "partition_name", "topic_name",
    "AuthenticationError", "AuthorizationError", "CodecError", "ConnectionClosedError", "HashingScheme",
    "Message", "MessageId", "NotAllowedError", "ProducerFencedError", "ProducerQueueFullError",
    "PulsarWireError", "RoutingMode", "ServerError", "TimeoutError", "TopicNotFoundError",
    "TopicTerminatedError",
]
