"""The consumer's helpers for runs of received messages (client/receiving.py), each twin held
to the same answers; the suite's two passes run the rest of it against each."""
from __future__ import annotations

import collections
import gc
import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsarwire.client import _receiving_py, receiving

try:
    _cython = importlib.import_module("pulsarwire.client._receiving")
except ImportError:  # not built: the pure twin alone
    _cython = None

TWINS = [_receiving_py] + ([_cython] if _cython is not None else [])


class _Single:
    __slots__ = ("batch_index", "payload_size")

    def __init__(self, batch_index: int, payload_size: int = 1) -> None:
        self.batch_index = batch_index
        self.payload_size = payload_size


class _Unit:
    __slots__ = ("owner", "name")

    def __init__(self, owner: object, name: str) -> None:
        self.owner = owner
        self.name = name


class _Message:
    __slots__ = ("_single", "_ack_unit", "_id")

    def __init__(self, single: _Single, ack_unit: _Unit | None) -> None:
        self._single = single
        self._ack_unit = ack_unit
        self._id = None


class _One:
    __slots__ = ("_message", "_id")

    def __init__(self, message: object) -> None:
        self._message = message
        self._id = None


@pytest.mark.parametrize("twin", TWINS, ids=lambda t: t.IMPLEMENTATION)
def test_make_untracked_sets_the_slots_as_init_does(twin):
    unit = _Unit("owner", "u")
    singles = [_Single(i) for i in range(5)]
    made = twin.make_untracked(_Message, singles, unit)
    assert [(m._single, m._ack_unit, m._id) for m in made] == [(s, unit, None) for s in singles]
    wrapped = twin.make_untracked(_One, made)
    assert [(w._message, w._id) for w in wrapped] == [(m, None) for m in made]
    assert {gc.is_tracked(m) for m in made + wrapped} == {twin is _receiving_py}
    made[0]._id = "set later"  # the slots stay writable
    assert made[0]._id == "set later"
    gc.collect()
    assert made[4]._single is singles[4]


@pytest.mark.parametrize("twin", TWINS, ids=lambda t: t.IMPLEMENTATION)
def test_make_untracked_refuses_what_it_cannot_fill(twin):
    class WithDict:
        def __init__(self, item: object) -> None:
            self.item = item

    class Derived(_One):
        __slots__ = ()

    for cls in (WithDict, Derived, dict):
        with pytest.raises(TypeError, match="not a class of __slots__ alone"):
            twin.make_untracked(cls, [1])

    class Single:
        __slots__ = ("one",)

        def __init__(self, one: object) -> None:
            self.one = one

    with pytest.raises(TypeError, match="no slot for the shared value"):
        twin.make_untracked(Single, [1], "shared")
    assert twin.make_untracked(Single, []) == []


def _queue(sizes: list[int]) -> collections.deque:
    return collections.deque(_Message(_Single(i, size), None) for i, size in enumerate(sizes))


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), max_size=30), count=st.integers(0, 40),
       max_bytes=st.integers(0, 200), size=st.integers(0, 100), have=st.booleans())
def test_take_messages_twins_agree(sizes, count, max_bytes, size, have):
    answers = []
    for twin in TWINS:
        items = _queue(sizes)
        out, held, full = twin.take_messages(items, count, max_bytes, size, have)
        answers.append(([m._single.batch_index for m in out], held, full, [m._single.batch_index for m in items]))
    assert all(a == answers[0] for a in answers)
    taken, held, full, left = answers[0]
    assert taken + left == list(range(len(sizes)))  # in order, nothing lost
    assert len(taken) <= count
    if max_bytes > 0:
        assert held == size + sum(sizes[i] for i in taken)
        assert not taken or held <= max_bytes or (len(taken) == 1 and not have)
        assert full == (bool(left) and len(taken) < count)


def test_count_taken_gives_one_count_per_run_of_one_owner():
    a, b = object(), object()
    units = {a: _Unit(a, "a"), b: _Unit(b, "b")}
    owners = [a, a, b, b, b, a]
    taken = [_Message(_Single(i), units[o]) for i, o in enumerate(owners)]
    for twin in TWINS:
        assert twin.count_taken(taken) == [(a, 2, taken[1]), (b, 3, taken[4]), (a, 1, taken[5])]
        assert twin.count_taken([]) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.sampled_from("xyz"), st.integers(-1, 6)), st.just("call")), max_size=30))
def test_fold_acks_keeps_every_ack_in_order(plan):
    units = {name: _Unit(None, name) for name in "xyz"}
    def items():
        out = collections.deque()
        for n, step in enumerate(plan):
            if step == "call":
                out.append((print, n))
            else:
                out.append(_Message(_Single(step[1]), units[step[0]]))
        return out
    folded = []
    for twin in TWINS:
        queue = items()
        runs = twin.fold_acks(queue)
        assert not queue
        folded.append([(r[0].name, r[1], r[2]) if len(r) == 3 else r for r in runs])
    assert all(f == folded[0] for f in folded)
    # unfolded, the runs give back every acknowledgement in its order
    expanded = []
    for run in folded[0]:
        if len(run) == 2:
            expanded.append("call")
            continue
        name, first, last = run
        assert first == last or 0 <= first < last
        expanded.extend((name, i) for i in range(first, last + 1))
    assert expanded == plan


def test_the_chosen_twin_follows_the_codec():
    from pulsarwire import codec
    assert receiving.IMPLEMENTATION == codec.IMPLEMENTATION
