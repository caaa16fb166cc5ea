"""Offsets: boundaries between messages, and the arithmetic on them that needs no broker.

A boundary is written as canonical JSON, `{"<partition topic>": [ledgerId, entryId, batchIndex, side]}`,
side 1 meaning "just after that message" and 0 "just before it".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ..messages import MessageId
from .errors import PulsarSparkError

if TYPE_CHECKING:
    from ..client.entries import Entry

_WHOLE_ENTRY = 2**31 - 1  # a batch index past every message of an entry


@dataclass(frozen=True)
class Boundary:
    """A point between messages: just before or just after message (ledger, entry, batch)."""

    ledger: int
    entry: int
    batch: int
    after: bool

    @classmethod
    def before_everything(cls) -> "Boundary":
        return cls(-1, -1, -1, True)

    @property
    def position(self) -> Position:
        """The entry this boundary lies beside."""
        return Position(self.ledger, self.entry)

    def key(self) -> tuple[int, int, int, int]:
        return (self.ledger, self.entry, self.batch, 1 if self.after else 0)

    def precedes(self, mid: MessageId | tuple[int, int, int]) -> bool:
        """True when message `mid` (a MessageId or a (ledger, entry, batch) tuple) lies after this boundary."""
        position = mid if isinstance(mid, tuple) else (mid.ledger_id, mid.entry_id, mid.batch_index)
        mine = (self.ledger, self.entry, self.batch)
        return position > mine or (position == mine and not self.after)

    def to_json(self) -> list[int]:
        return [self.ledger, self.entry, self.batch, 1 if self.after else 0]

    @classmethod
    def from_json(cls, value: Any, what: str = "offset") -> "Boundary":
        if value == "earliest":
            return cls.before_everything()
        try:
            if isinstance(value, dict):  # a message id given by a user: start at (before) it
                unknown = set(value) - {"ledgerId", "entryId", "batchIndex"}
                if unknown or "ledgerId" not in value or "entryId" not in value:
                    raise ValueError
                return cls(int(value["ledgerId"]), int(value["entryId"]), int(value.get("batchIndex", -1)), False)
            if isinstance(value, list) and len(value) == 4 and value[3] in (0, 1):
                return cls(int(value[0]), int(value[1]), int(value[2]), bool(value[3]))
        except (TypeError, ValueError):
            pass
        raise PulsarSparkError(f"{what}: not a position: {value!r} (use 'earliest', 'latest', "
                               '{"ledgerId": L, "entryId": E[, "batchIndex": B]} or a checkpointed offset)')

    def start_entry(self) -> MessageId:
        """The entry a reader starts at (inclusive): the boundary's own entry, so that the reader
        sees that it is still there; or the earliest."""
        if self.ledger < 0:
            return MessageId.earliest
        return MessageId(self.ledger, max(self.entry, 0))


def canonical(offsets: dict[str, Boundary]) -> dict[str, list[int]]:
    return {topic: offsets[topic].to_json() for topic in sorted(offsets)}


class TopicPartition(NamedTuple):
    """A partition topic read, and its partition index (-1: a topic that is not partitioned)."""

    topic: str
    partition: int


def _partition_index(topic: str) -> int:
    marker = "-partition-"
    if marker in topic and topic.rsplit(marker, 1)[1].isdigit():
        return int(topic.rsplit(marker, 1)[1])
    return -1


class Position(NamedTuple):
    """Where an entry is: compared as a tuple, ledger first."""

    ledger: int
    entry: int

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}"


def _position(mid: MessageId | Entry) -> Position:
    return Position(mid.ledger_id, mid.entry_id)


def _where(position: Position) -> str:
    return str(position)


def _row_range(start: Boundary, end: Boundary, ledger: int, entry: int, count: int,
               batched: bool) -> tuple[int, int]:
    """Rows [lo, hi) of an entry's `count` rows that lie between the boundaries."""
    if not batched:
        position = (ledger, entry, -1)
        inside = start.precedes(position) and not end.precedes(position)
        return (0, 1) if inside else (0, 0)
    here = (ledger, entry)
    if here < (start.ledger, start.entry):
        lo = count
    elif here == (start.ledger, start.entry):
        lo = start.batch + 1 if start.after else start.batch
    else:
        lo = 0
    if here > (end.ledger, end.entry):
        hi = 0
    elif here == (end.ledger, end.entry):
        hi = end.batch + 1 if end.after else end.batch
    else:
        hi = count
    lo, hi = min(max(lo, 0), count), min(max(hi, 0), count)
    return lo, max(lo, hi)


def _first_unread_entry(s: Boundary) -> int:
    """The first entry that still has messages after boundary `s` (entries are counted from 0)."""
    if s.ledger < 0:
        return 0
    if s.after and s.batch in (_WHOLE_ENTRY, -1):
        return s.entry + 1
    return s.entry


def _first_unread_id(s: Boundary) -> MessageId:
    """Where a reader starts to read what follows boundary `s`: its first unread entry."""
    return MessageId(s.ledger, _first_unread_entry(s)) if s.ledger >= 0 else MessageId.earliest


def _entries_between(s: Boundary, e: Boundary) -> int | None:
    """Entries after `s` up to `e`: counted within one ledger, None (not known without asking
    the broker) across ledgers or from the earliest."""
    if e.ledger < 0 or e.key() <= s.key():
        return 0
    if s.ledger < 0 or s.ledger != e.ledger:
        return None
    return max(0, e.entry - _first_unread_entry(s) + 1)


def _admit(s: Boundary, e: Boundary, budget: int) -> Boundary:
    """The end boundary that admits at most `budget` entries after `s` (up to `e`), both in one ledger."""
    available = _entries_between(s, e)
    if available is None:
        raise ValueError("_admit counts entries within one ledger")
    if available <= budget:
        return e
    if budget <= 0:
        return s
    return Boundary(e.ledger, _first_unread_entry(s) + budget - 1, _WHOLE_ENTRY, True)


def _share(available: dict[str, int | None], budget: int, turn: int) -> dict[str, int]:
    """`budget` entries spread over partitions fairly (water-filling; None: a backlog of unknown
    size, at least the budget); when there are fewer entries to give than partitions with a
    backlog, the partitions served rotate with `turn`."""
    counts = {t: budget if n is None else n for t, n in available.items()}
    grant = {t: 0 for t in counts}
    waiting = sorted(t for t, n in counts.items() if n > 0)
    while budget > 0 and waiting:
        each = budget // len(waiting)
        if each == 0:
            rotated = waiting[turn % len(waiting):] + waiting[:turn % len(waiting)]
            for topic in rotated[:budget]:
                grant[topic] += 1
            break
        for topic in list(waiting):
            take = min(each, counts[topic] - grant[topic])
            grant[topic] += take
            budget -= take
            if grant[topic] >= counts[topic]:
                waiting.remove(topic)
    return grant


