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

__all__ = [
    "DEFAULT_PORT", "DEFAULT_TLS_PORT", "Address", "AuthenticationToken", "Client", "CompressionType",
    "Connection", "ConnectionPool", "Consumer", "ConsumerType", "InitialPosition", "Producer", "Reader",
    "partition_name", "topic_name",
]
