"""pulsarwire: the Apache Pulsar binary protocol, fast."""
from __future__ import annotations

__version__ = "0.1.0"
