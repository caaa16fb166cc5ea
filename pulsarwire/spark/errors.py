"""The data source's own errors."""
from __future__ import annotations

class PulsarSparkError(ValueError):
    """A bad option or offset given to the data source."""


class PulsarDataLossError(RuntimeError):
    """Data a query was due to read is gone (deleted, or the topic re-created); see failOnDataLoss."""

