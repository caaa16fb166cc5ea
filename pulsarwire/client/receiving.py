"""A consumer's per-message work for runs of messages, chosen once at import: the Cython twin
(client/_receiving.pyx) when the codec is the Cython one, else the pure-Python twin
(client/_receiving_py.py), so PULSARWIRE_PURE_PYTHON=1 selects both; same API and behaviour.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import codec

if TYPE_CHECKING:  # the twins have one API: type checkers read the pure one
    from . import _receiving_py as _impl
else:
    _impl = codec.follow_codec("pulsarwire.client._receiving", "pulsarwire.client._receiving_py",
                               "receiving helpers")

IMPLEMENTATION: str = _impl.IMPLEMENTATION

make_untracked = _impl.make_untracked
make_one_untracked = _impl.make_one_untracked
take_messages = _impl.take_messages
count_taken = _impl.count_taken
fold_acks = _impl.fold_acks

__all__ = ["IMPLEMENTATION", "make_untracked", "make_one_untracked", "take_messages", "count_taken", "fold_acks"]
