"""MessageId's fast constructor (a receipt per message sent): the same value, hash, order,
immutability and pickling as the dataclass's own."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from pulsarwire.messages import MessageId, make_message_id


@pytest.mark.parametrize("fields", [(1, 2), (1, 2, 3, 4, 10, "persistent://public/default/t"), (-1, -1, -1, -1, 0, None)])
def test_make_message_id_is_the_dataclass_value(fields):
    made, built = make_message_id(*fields), MessageId(*fields)
    assert made == built and hash(made) == hash(built)
    assert repr(made) == repr(built) and str(made) == str(built)
    assert dataclasses.astuple(made) == dataclasses.astuple(built)
    assert pickle.loads(pickle.dumps(made)) == built
    assert not made < built and made <= built
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.ledger_id = 7  # type: ignore[misc]
