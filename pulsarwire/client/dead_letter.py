"""Dead letters, retry letters and negative-ack backoff for a consumer.

A message redelivered `max_redeliver_count` times is, when negatively acknowledged (or not
acknowledged in time) once more, published to the dead letter topic and then acknowledged,
as the Java and C++ clients do. `reconsume_later` publishes a message to the retry letter
topic (which the consumer also subscribes to) with a delivery delay, then acknowledges it;
after `max_redeliver_count` reconsumes it goes to the dead letter topic instead.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Coroutine, Protocol

from ..errors import PulsarWireError
from ..messages import Message, MessageId

log = logging.getLogger("pulsarwire")

# Message properties, named as the Java client names them.
REAL_TOPIC = "REAL_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUME_TIMES = "RECONSUMETIMES"
DELAY_TIME = "DELAY_TIME"


class DeadLetterPolicy:
    """Where messages go after too many redeliveries (defaults: `<topic>-<subscription>-DLQ`,
    and `<topic>-<subscription>-RETRY` for `reconsume_later`)."""

    def __init__(self, max_redeliver_count: int, dead_letter_topic: str | None = None,
                 retry_letter_topic: str | None = None, initial_subscription_name: str | None = None) -> None:
        if not isinstance(max_redeliver_count, int) or max_redeliver_count < 1:
            raise ValueError("max_redeliver_count must be at least 1")
        self.max_redeliver_count = max_redeliver_count
        self.dead_letter_topic = dead_letter_topic
        self.retry_letter_topic = retry_letter_topic
        self.initial_subscription_name = initial_subscription_name

    def __repr__(self) -> str:
        return (f"DeadLetterPolicy(max_redeliver_count={self.max_redeliver_count}, "
                f"dead_letter_topic={self.dead_letter_topic!r}, retry_letter_topic={self.retry_letter_topic!r})")


class NegativeAckRedeliveryBackoff:
    """Negative-ack delay growing with the message's redelivery count:
    `min(max_delay_ms, min_delay_ms * multiplier ** redelivery_count)`."""

    def __init__(self, min_delay_ms: int = 1000, max_delay_ms: int = 60_000, multiplier: float = 2.0) -> None:
        if min_delay_ms < 0 or max_delay_ms < min_delay_ms or multiplier < 1:
            raise ValueError("need 0 <= min_delay_ms <= max_delay_ms and multiplier >= 1")
        self.min_delay_ms = min_delay_ms
        self.max_delay_ms = max_delay_ms
        self.multiplier = multiplier

    def next(self, redelivery_count: int) -> int:
        if redelivery_count <= 0:
            return self.min_delay_ms
        return int(min(self.max_delay_ms, self.min_delay_ms * self.multiplier ** min(redelivery_count, 64)))


def backoff_delay_ms(backoff: Any, redelivery_count: int) -> int:
    """The delay a backoff gives: an object with `next(count)` (ms) or a callable."""
    step = getattr(backoff, "next", None)
    delay = step(redelivery_count) if callable(step) else backoff(redelivery_count)
    return max(0, int(delay))


EntryKey = tuple[int, int]  # an entry's (ledger, entry)


class LetterOwner(Protocol):
    """The partition consumer that delivered an entry, as the router uses it."""

    topic: str  # its topic: a partition's own name

    def is_unacked(self, ledger_id: int, entry_id: int) -> bool: ...

    def redeliver_keys(self, keys: list[EntryKey]) -> None: ...

    def ack_in(self, unit: Any, batch_index: int) -> None: ...


class DeliveredEntry(Protocol):
    """A delivered entry's acknowledgement state (the consumer's AckUnit)."""

    @property
    def owner(self) -> LetterOwner: ...  # read-only here: a PartitionConsumer is one

    ledger_id: int
    entry_id: int
    batch_size: int
    remaining: int  # bitmask of batch indexes not yet acknowledged


class LetterProducer(Protocol):
    """A dead or retry letter producer, as the router uses it."""

    async def send(self, content: bytes, **options: Any) -> MessageId: ...

    async def close(self) -> None: ...


_OwnedKey = tuple[LetterOwner, int, int]  # (partition consumer, ledger, entry)


class DeadLetterRouter:
    """One consumer's dead letter and retry letter producers and the messages that may go there."""

    def __init__(self, policy: Any, retry_enable: bool, *, topic: str, subscription: str, receiver_queue_size: int,
                 acknowledge: Callable[[Message], None],
                 create_producer: Callable[..., Awaitable[LetterProducer]], diverts: bool = True) -> None:
        self._acknowledge = acknowledge  # the consumer's
        self._create_producer = create_producer  # the client's
        self._max_candidates = 4 * receiver_queue_size
        self.max_redeliver_count: int = policy.max_redeliver_count
        # whether redeliveries past the limit go to the dead letter topic: Shared and Key_Shared
        # subscriptions only, as in the official client (an Exclusive or Failover one goes on
        # redelivering; reconsume_later is the same for all)
        self.diverts = diverts
        self._subscription = subscription
        # None: `<topic>-<subscription>-DLQ`, per partition as the official client names it
        self._given_dead_letter_topic: str | None = getattr(policy, "dead_letter_topic", None)
        retry = getattr(policy, "retry_letter_topic", None)
        self.retry_letter_topic = retry or (f"{topic}-{subscription}-RETRY" if retry_enable else None)
        self.initial_subscription_name = getattr(policy, "initial_subscription_name", None)
        # delivered entries at or past the limit: (partition consumer, ledger, entry) -> (unit, messages)
        self._candidates: dict[_OwnedKey, tuple[DeliveredEntry, list[Message]]] = {}
        self._sending: set[_OwnedKey] = set()
        self._producers: dict[str, asyncio.Future[LetterProducer]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # called by the partition consumers

    def remember(self, unit: DeliveredEntry, message: Message) -> None:
        key = (unit.owner, unit.ledger_id, unit.entry_id)
        held = self._candidates.get(key)
        if held is None:
            if len(self._candidates) >= self._max_candidates:
                self._prune()
            self._candidates[key] = (unit, [message])
        else:
            held[1].append(message)

    def _prune(self) -> None:
        """Forget entries acknowledged meanwhile (the bound on what is remembered)."""
        for key, (unit, _) in list(self._candidates.items()):
            if not unit.owner.is_unacked(unit.ledger_id, unit.entry_id):
                del self._candidates[key]

    def divert(self, owner: LetterOwner, keys: list[EntryKey]) -> list[EntryKey]:
        """Of the entries about to be redelivered, send those past the limit to the dead letter
        topic instead; returns the keys still to redeliver."""
        kept: list[EntryKey] = []
        for key in keys:
            full_key: _OwnedKey = (owner, *key)
            if full_key in self._sending:
                continue  # already on its way to the dead letter topic
            held = self._candidates.pop(full_key, None)
            if held is None:
                kept.append(key)
                continue
            unit, messages = held
            pending = [m for m in messages if not unit.batch_size or (unit.remaining >> m._single.batch_index) & 1]
            if not pending:
                continue
            self._sending.add(full_key)
            self._spawn(self._dead_letter(owner, full_key, unit, pending))
        return kept

    async def _dead_letter(self, owner: LetterOwner, full_key: _OwnedKey, unit: DeliveredEntry,
                           messages: list[Message]) -> None:
        try:
            producer = await self._producer(self._dead_letter_topic_of(owner.topic), self.initial_subscription_name)
            await asyncio.gather(*(producer.send(m.data(), **_republish_options(m, dead=True)) for m in messages))
        except Exception as exc:  # noqa: BLE001 - the broker redelivers it instead
            log.warning("could not dead-letter %s: %s; redelivering", messages[0].message_id(), exc)
            self._sending.discard(full_key)
            owner.redeliver_keys([full_key[1:]])
            return
        self._sending.discard(full_key)
        unit.remaining = 0
        owner.ack_in(unit, -1)

    # reconsume_later

    async def reconsume_later(self, message: Message, delay_ms: int, properties: dict[str, str] | None) -> None:
        if self.retry_letter_topic is None:
            raise PulsarWireError("reconsume_later needs retry_enable=True or a dead_letter_policy "
                                  "with a retry_letter_topic")
        previous = message.properties()
        times = int(previous.get(RECONSUME_TIMES, "0")) + 1
        options = _republish_options(message)
        options["properties"].update(properties or {})
        if times > self.max_redeliver_count:
            origin = previous.get(REAL_TOPIC) or message.topic_name()  # read from the retry topic: where it began
            producer = await self._producer(self._dead_letter_topic_of(origin), self.initial_subscription_name)
        else:
            producer = await self._producer(self.retry_letter_topic, None)
            options["properties"][RECONSUME_TIMES] = str(times)
            options["properties"][DELAY_TIME] = str(int(delay_ms))
            if delay_ms > 0:
                options["deliver_after_ms"] = int(delay_ms)
        await producer.send(message.data(), **options)
        self._acknowledge(message)

    def _dead_letter_topic_of(self, topic: str) -> str:
        """The dead letter topic of messages from `topic` (a partition's own name, where it is one)."""
        return self._given_dead_letter_topic or f"{topic}-{self._subscription}-DLQ"

    # producers

    async def _producer(self, topic: str, initial_subscription: str | None) -> LetterProducer:
        pending = self._producers.get(topic)
        if pending is None or (pending.done() and pending.exception() is not None):
            pending = self._producers[topic] = asyncio.ensure_future(self._create_producer(
                topic, batching_enabled=False, initial_subscription_name=initial_subscription))
        return await asyncio.shield(pending)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for pending in self._producers.values():
            if pending.done() and pending.exception() is None:
                await pending.result().close()
            else:
                pending.cancel()
        self._candidates.clear()


def _republish_options(message: Message, dead: bool = False) -> dict:
    """Send options that keep a message's key and properties (and its event time, but for a dead
    letter: the official client's copy has none), and record where it came from (the partition's
    own name, as the official client's REAL_TOPIC)."""
    properties = dict(message.properties())
    properties.setdefault(REAL_TOPIC, message.topic_name())
    properties.setdefault(ORIGIN_MESSAGE_ID, str(message.message_id()))
    options: dict[str, Any] = {"properties": properties}
    if message.partition_key() is not None:
        options["partition_key"] = message.partition_key()
    if message.ordering_key() is not None:
        options["ordering_key"] = message.ordering_key()
    if message.event_timestamp() and not dead:
        options["event_timestamp"] = message.event_timestamp()
    return options
