"""Where things are on the broker: the partitions read, their ends, the entry at a position or a
time, how far a budget of entries reaches, and a subscription that holds what is unread."""
from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import TYPE_CHECKING

from ..errors import UnsupportedByBrokerError
from ..messages import MessageId
from .errors import PulsarSparkError
from .offsets import (
    _WHOLE_ENTRY, Boundary, Position, TopicPartition, _admit, _first_unread_id, _partition_index,
    _position, _where,
)
from .options import SourceOptions, _parse_offsets_spec

if TYPE_CHECKING:
    from ..client.client import Client
    from ..client.entries import Entry

log = logging.getLogger("pulsarwire.spark")

async def _topic_partitions(client: Client, opts: SourceOptions, missing_ok: bool = False) -> list[TopicPartition]:
    """The partition topics of every topic read, each partition once however it is named
    (a topic and one of its partitions), discovering a pattern. A topic that does not exist is
    an error, or with `missing_ok` (a stream under failOnDataLoss=false) logged and left out."""
    namespaces = {t.split("://", 1)[1].rsplit("/", 1)[0] for t in opts.topics}
    if opts.pattern:
        namespaces.add(opts.pattern.namespace)
    try:
        existing: set[str] | None = {topic for namespace in sorted(namespaces)
                                     for topic in await client.get_topics_of_namespace(namespace)}
    except UnsupportedByBrokerError as exc:
        if opts.pattern:
            raise PulsarSparkError(f"topicsPattern: {exc}") from None
        existing = None  # pulsar-lite: the topics named are taken as there (an absent one reads empty)
    if opts.pattern:
        assert existing is not None
        namespace, regex = opts.pattern
        prefix = f"persistent://{namespace}/"
        parents = {re.sub(r"-partition-\d+$", "", t) for t in existing if t.startswith(prefix)}
        topics = sorted(t for t in parents if regex.fullmatch(t[len(prefix):]))
    else:
        topics = opts.topics
    out: dict[str, int] = {}
    for topic in topics:
        names = await client.get_topic_partitions(topic)
        partitioned = len(names) > 1 or names[0] != topic
        if not partitioned and existing is not None and topic not in existing:
            if missing_ok:
                log.warning("topic %s does not exist (deleted?); left out until it is there again "
                            "(failOnDataLoss=false)", topic)
                continue
            raise PulsarSparkError(f"topic {topic} does not exist (the source does not create topics)")
        for index, name in enumerate(names):
            out.setdefault(name, index if partitioned else _partition_index(name))
    return [TopicPartition(topic, index) for topic, index in out.items()]


async def _latest_of(client: Client, topic: str) -> Boundary:
    """Just after the last entry of `topic` now (before everything when it is empty)."""
    reader = await client.create_entry_reader(topic, MessageId.latest, receiver_queue_size=2)
    try:
        mid = await reader.get_last_message_id()
    finally:
        await reader.close()
    if mid.entry_id < 0:
        return Boundary.before_everything()
    return Boundary(mid.ledger_id, mid.entry_id, _WHOLE_ENTRY, True)


async def _latest_all(client: Client, parts: list[TopicPartition]) -> dict[str, Boundary]:
    found = await asyncio.gather(*(_latest_of(client, p.topic) for p in parts))
    return dict(zip((p.topic for p in parts), found))


async def _first_at_or_after(client: Client, topic: str, start: MessageId, timeout: float) -> Entry | None:
    """The first entry at or after `start` (earliest: the first entry), or None when the broker
    would give none now.

    Pulsar places a reader at the next ledger's first entry when `start` is past the end of
    its ledger; the embedded broker numbers entries across ledgers and waits at an entry id
    past the last one instead. Where the two differ (an entry id past the last entry's, in an
    earlier ledger) this answers None rather than wait for an entry that may never come."""
    reader = await client.create_entry_reader(topic, start, receiver_queue_size=1, max_queued_bytes=1)
    try:
        last = await reader.get_last_message_id()
        if last.entry_id < 0:
            return None
        if start.ledger_id >= 0 and (_position(start) > _position(last) or start.entry_id > last.entry_id):
            return None
        if not await reader.wait(timeout):  # (not an OSError: retrying the whole plan would not help)
            raise RuntimeError(f"{topic}: no entry at or after {_where(_position(start))} within "
                               f"{timeout:g}s (read.timeout.seconds), though the topic ends at "
                               f"{_where(_position(last))}")
        return reader.take(1)[0]
    finally:
        await reader.close()


async def _entry_at_or_after(client: Client, topic: str, start: MessageId, timeout: float) -> Position | None:
    """The position of `_first_at_or_after`."""
    entry = await _first_at_or_after(client, topic, start, timeout)
    return None if entry is None else _position(entry)


async def _messages_per_entry(client: Client, topic: str, s: Boundary, timeout: float) -> int:
    """How many messages the first unread entry after `s` holds: a message budget becomes an
    entry budget at that rate (producers batch alike from one entry to the next)."""
    first = _first_unread_id(s)
    entry = await _first_at_or_after(client, topic, first, timeout)
    return 1 if entry is None else max(1, entry.num_messages)


async def _advance(client: Client, topic: str, s: Boundary, e: Boundary, budget: int, timeout: float) -> Boundary:
    """The end boundary after at most `budget` entries past `s`, never past `e`, and always on
    an entry that exists (the next batch starts there and checks that it is still there).

    Entry ids are consecutive within a ledger, so within one ledger this is arithmetic; across
    a ledger change (a rollover) the broker is asked where entries are: where the ledger of the
    next unread entry ends, the batch ends too."""
    if budget <= 0 or e.key() <= s.key():
        return s
    if s.ledger >= 0 and s.ledger == e.ledger:
        return _admit(s, e, budget)
    first = _first_unread_id(s)
    found = await _entry_at_or_after(client, topic, first, timeout)
    if found is None or found > e.position:
        return e
    ledger, entry = found
    if ledger == e.ledger:
        return e if e.entry - entry + 1 <= budget else Boundary(ledger, entry + budget - 1, _WHOLE_ENTRY, True)
    target = Position(ledger, entry + budget - 1)
    found = await _entry_at_or_after(client, topic, MessageId(*target), timeout)
    if found is None or found > e.position:
        # fewer than `budget` entries up to e (or, on a Pulsar broker whose newest ledger is
        # shorter than the budget reaches, possibly more: admitted rather than guessed)
        return e
    if found == target:
        return Boundary(ledger, target.entry, _WHOLE_ENTRY, True)
    return Boundary(found.ledger, found.entry, -1, False)  # the rest of the ledger: just before the next one's first


async def _at_time(client: Client, topic: str, when_ms: int, latest: Boundary) -> Boundary:
    """Just before the first message published at or after `when_ms` (or `latest` if none)."""
    from ..client import InitialPosition
    if latest.ledger < 0:
        return latest
    consumer = await client.subscribe(topic, f"pulsarwire-spark-time-{time.time_ns()}",
                                      initial_position=InitialPosition.Earliest, receiver_queue_size=1)
    try:
        await consumer.seek(when_ms)
        try:
            message = await consumer.receive(2000)
        except Exception:  # noqa: BLE001 - nothing published since: start at the end
            return latest
        mid = message.message_id()
        if _position(mid) > latest.position:
            return latest
        return Boundary(mid.ledger_id, mid.entry_id, -1, False)
    finally:
        await consumer.unsubscribe()


async def _resolve(client: Client, spec: str | None, when_ms: int | None, parts: list[TopicPartition],
                   default: str, what: str,
                   latest: dict[str, Boundary], timeout: float) -> dict[str, Boundary]:
    """Per partition topic: the boundary `spec` (or `when_ms`) names; a position given as JSON
    must be one the topic has (a clear error, never a silently empty read)."""
    if when_ms is not None:
        found = await asyncio.gather(*(_at_time(client, t, when_ms, latest[t]) for t, _ in parts))
        return dict(zip((t for t, _ in parts), found))
    parsed = _parse_offsets_spec(spec, what, allow_earliest=what == "startingOffsets") if spec else default
    if isinstance(parsed, str):
        given = {t: parsed for t, _ in parts}
    else:
        known = {t for t, _ in parts}
        parents = {re.sub(r"-partition-\d+$", "", t) for t in known if _partition_index(t) >= 0}
        for topic in parsed:
            if topic in parents:
                raise PulsarSparkError(f"{what}: {topic} is partitioned; give a position per partition "
                                       f"({topic}-partition-N)")
            if topic not in known:
                raise PulsarSparkError(f"{what}: {topic} is not one of the topics read ({', '.join(sorted(known))})")
        given = {t: parsed.get(t, default) for t, _ in parts}
    out: dict[str, Boundary] = {}
    for topic, value in given.items():
        if value == "latest":
            out[topic] = latest[topic]
        else:
            out[topic] = Boundary.from_json(value, what)
    await asyncio.gather(*(_check_position(client, t, out[t], latest[t], what, timeout)
                           for t, value in given.items() if value not in ("earliest", "latest")))
    return out


async def _check_position(client: Client, topic: str, given: Boundary, latest: Boundary, what: str,
                          timeout: float) -> None:
    """A position a user gave must name a message of the topic."""
    if given.ledger < 0:
        return
    position = given.position
    if latest.ledger < 0 or position > latest.position:
        raise PulsarSparkError(f"{what}: {topic} has no entry {_where(position)}: it is past the topic's last "
                               + (f"entry ({latest.ledger}:{latest.entry})" if latest.ledger >= 0 else "(the topic is empty)"))
    found = await _entry_at_or_after(client, topic, MessageId(*position), timeout)
    if found != position:
        raise PulsarSparkError(f"{what}: {topic} has no entry {_where(position)}"
                               + (f" (the next entry there is {_where(found)})" if found else "")
                               + ": a wrong ledger id, or data deleted")


async def _hold(client: Client, subscription: str, offsets: dict[str, Boundary]) -> None:
    """Make durable subscription `subscription` of every partition hold the data after `offsets`
    (the broker keeps what a subscription has not acknowledged, whatever retention says)."""
    from ..client import InitialPosition

    async def one(topic: str, boundary: Boundary) -> None:
        consumer = await client.subscribe(topic, subscription, initial_position=InitialPosition.Earliest,
                                          receiver_queue_size=1)
        try:
            if boundary.ledger >= 0:
                # everything before the boundary's entry is read: acknowledge up to just before it
                target = boundary.entry if not (boundary.after and boundary.batch in (_WHOLE_ENTRY, -1)) \
                    else boundary.entry + 1
                await consumer.seek(MessageId(boundary.ledger, target))
        finally:
            await consumer.close()
    await asyncio.gather(*(one(t, b) for t, b in offsets.items()))


