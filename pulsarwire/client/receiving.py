"""A consumer's per-message work for runs of messages, chosen once at import: the Cython twin
(client/_receiving.pyx) when the codec is the Cython one, else the pure-Python twin
(client/_receiving_py.py), so PULSARWIRE_PURE_PYTHON=1 selects both; same API and behaviour.
"""
from __future__ import annotations

import warnings

from .. import codec

if codec.IMPLEMENTATION != "cython":
    from . import _receiving_py as _impl
else:
    try:
        from . import _receiving as _impl  # type: ignore[attr-defined,no-redef,unused-ignore]
    except ImportError:  # the codec was built but not this
        warnings.warn("pulsarwire: Cython receiving helpers not built; using the pure-Python twin (slower)",
                      RuntimeWarning, stacklevel=2)
        from . import _receiving_py as _impl  # type: ignore[no-redef,unused-ignore]

IMPLEMENTATION: str = _impl.IMPLEMENTATION

make_untracked = _impl.make_untracked
make_one_untracked = _impl.make_one_untracked
take_messages = _impl.take_messages
count_taken = _impl.count_taken
fold_acks = _impl.fold_acks

__all__ = ["IMPLEMENTATION", "make_untracked", "make_one_untracked", "take_messages", "count_taken", "fold_acks"]
