"""A consumer's per-message work between the event loop and its callers, done for runs of
messages: making received messages (`make_untracked`, `make_one_untracked`), taking them off the receiver queue
(`take_messages`), counting what each partition handed out (`count_taken`) and folding
acknowledgements into runs of one entry (`fold_acks`).

Pure-Python twin of pulsarwire.client._receiving (same API, same behaviour, but for the
garbage collector's tracking: see make_untracked); client/receiving.py chooses one.
"""
from __future__ import annotations

import collections
from typing import Any

IMPLEMENTATION = "python"


def _check_slots_class(cls: Any, shared: Any) -> None:
    names = cls.__dict__.get("__slots__")
    if cls.__bases__ != (object,) or not isinstance(names, tuple) or not names \
            or "__init__" not in cls.__dict__ or cls.__new__ is not object.__new__:
        raise TypeError(f"make_untracked: {cls!r} is not a class of __slots__ alone")
    if shared is not None and len(names) < 2:
        raise TypeError(f"make_untracked: {cls!r} has no slot for the shared value")


def make_untracked(cls: Any, items: list[Any], shared: Any = None) -> list[Any]:
    """`[cls(item, shared) for item in items]` (`cls(item)` when shared is None). cls is a class
    of `__slots__` alone whose `__init__` sets them in order: to item, shared, then None. The
    Cython twin sets them without the call, and leaves each object out of the garbage
    collector's tracking (see there)."""
    _check_slots_class(cls, shared)
    if shared is None:
        return [cls(item) for item in items]
    return [cls(item, shared) for item in items]


def make_one_untracked(cls: Any, item: Any) -> Any:
    """`make_untracked(cls, [item])[0]`."""
    return make_untracked(cls, [item])[0]


def take_messages(items: collections.deque[Any], count: int, max_bytes: int, size: int,
                  have: bool) -> tuple[list[Any], int, bool]:
    """Up to `count` messages popped from the left of `items`, and the payload bytes then held
    (`size` before). With max_bytes > 0 it stops before the message that would go past it
    (put back first), unless none is held yet (`have` false, none taken); the third value
    says whether it stopped there. Each message is popped, then measured: other threads may
    pop concurrently (the caller holds the lock against anyone who adds to the left)."""
    out: list[Any] = []
    try:
        while len(out) < count:
            message = items.popleft()
            if max_bytes > 0:
                length = message._single.payload_size
                if (out or have) and size + length > max_bytes:
                    items.appendleft(message)
                    return out, size, True
                size += length
            out.append(message)
    except IndexError:
        pass
    return out, size, False


def count_taken(taken: list[Any]) -> list[tuple[Any, int, Any]]:
    """(owner, count, last message) for each run of `taken` (messages in order) from one
    owner (the partition consumer of each message's entry)."""
    runs: list[tuple[Any, int, Any]] = []
    owner, count, last = None, 0, None
    for message in taken:
        this = message._ack_unit.owner
        if this is not owner:
            if count:
                runs.append((owner, count, last))
            owner, count = this, 0
        count += 1
        last = message
    if count:
        runs.append((owner, count, last))
    return runs


def fold_acks(items: collections.deque[Any]) -> list[tuple[Any, ...]]:
    """Every item popped from the left of `items`, in order: a (function, argument) call as it
    is, and runs of messages to acknowledge as (entry, first, last): messages of one entry
    (their `_ack_unit`) whose batch indexes run first, first + 1, ..., last (-1, -1: not a
    batch). Only the caller's thread pops; others may append meanwhile."""
    out: list[tuple[Any, ...]] = []
    unit: Any = None
    first = last = -2
    while True:
        try:
            item = items.popleft()
        except IndexError:
            break
        if type(item) is tuple:
            if unit is not None:
                out.append((unit, first, last))
                unit = None
            out.append(item)
            continue
        this = item._ack_unit
        index = item._single.batch_index
        if this is unit and first >= 0 and index == last + 1:
            last = index
            continue
        if unit is not None:
            out.append((unit, first, last))
        unit, first, last = this, index, index
    if unit is not None:
        out.append((unit, first, last))
    return out
