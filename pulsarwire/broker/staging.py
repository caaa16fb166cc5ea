"""The broker's staging of runs of Send frames, chosen once at import: the Cython twin
(broker/_staging.pyx) when the codec is the Cython one, else the pure-Python twin
(broker/_staging_py.py). The Cython twin reads the Cython codec's SendFrame at C level, so it
follows the codec's choice (PULSARWIRE_PURE_PYTHON=1 included); both have the same API and
behaviour.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import codec

if TYPE_CHECKING:  # the twins have one API: type checkers read the pure one
    from . import _staging_py as _impl
else:
    _impl = codec.follow_codec("pulsarwire.broker._staging", "pulsarwire.broker._staging_py", "broker staging")

IMPLEMENTATION: str = _impl.IMPLEMENTATION

plan_send_run = _impl.plan_send_run
stage_entries = _impl.stage_entries
queue_send_receipts = _impl.queue_send_receipts

__all__ = ["IMPLEMENTATION", "plan_send_run", "stage_entries", "queue_send_receipts"]
