"""pulsarwire: the Apache Pulsar binary protocol, fast."""
from __future__ import annotations

from ._version import __version__
from .client import (
    AuthenticationToken, Client, CompressionType, Consumer, ConsumerType, InitialPosition, Producer,
    Reader,
)
from .errors import *  # noqa: F401,F403
from .messages import Message, MessageId, MessageIds
from .routing import HashingScheme, RoutingMode

__all__ = [
    "__version__", "AuthenticationToken", "Client", "CompressionType", "Consumer", "ConsumerType",
    "HashingScheme", "InitialPosition", "Message", "MessageId", "MessageIds", "Producer", "Reader", "RoutingMode",
]
