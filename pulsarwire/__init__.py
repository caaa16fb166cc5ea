"""pulsarwire: the Apache Pulsar binary protocol, fast."""
from __future__ import annotations

__version__ = "0.1.0"

from .client import (  # noqa: E402
    AuthenticationToken, Client, CompressionType, Consumer, ConsumerType, InitialPosition, Producer,
    Reader,
)
from .errors import *  # noqa: E402,F401,F403
from .messages import Message, MessageId, MessageIds  # noqa: E402
from .routing import HashingScheme, RoutingMode  # noqa: E402

__all__ = [
    "__version__", "AuthenticationToken", "Client", "CompressionType", "Consumer", "ConsumerType",
    "HashingScheme", "InitialPosition", "Message", "MessageId", "MessageIds", "Producer", "Reader", "RoutingMode",
]
