"""The broker's staging of runs of Send frames, chosen once at import: the Cython twin
(broker/_staging.pyx) when the codec is the Cython one, else the pure-Python twin
(broker/_staging_py.py). The Cython twin reads the Cython codec's SendFrame at C level, so it
follows the codec's choice (PULSARWIRE_PURE_PYTHON=1 included); both have the same API and
behaviour.
"""
from __future__ import annotations

import warnings

from .. import codec

if codec.IMPLEMENTATION != "cython":
    from . import _staging_py as _impl
else:
    try:
        from . import _staging as _impl  # type: ignore[attr-defined,no-redef,unused-ignore]
    except ImportError:  # the codec was built but not this: the pure twin reads its frames too
        warnings.warn("pulsarwire: Cython broker staging not built; using the pure-Python twin (slower)",
                      RuntimeWarning, stacklevel=2)
        from . import _staging_py as _impl  # type: ignore[no-redef,unused-ignore]

IMPLEMENTATION: str = _impl.IMPLEMENTATION

plan_send_run = _impl.plan_send_run
stage_entries = _impl.stage_entries
queue_send_receipts = _impl.queue_send_receipts

__all__ = ["IMPLEMENTATION", "plan_send_run", "stage_entries", "queue_send_receipts"]
