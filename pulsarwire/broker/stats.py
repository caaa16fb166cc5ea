"""Topic and subscription statistics in Pulsar's shapes (the admin API's `stats` and
`internalStats`, and the figures `/metrics` exports), and the rates behind them.

Rates are what the counters gained over the last sampling interval, as Pulsar's stats are
(its interval is a minute; the embedded broker's is `RateSampler.interval`). Everything here
reads in-memory state only: no disk.
"""
from __future__ import annotations

import asyncio
import time

from .._proto import PulsarApi_pb2 as pb
from .policies import CLUSTER, namespace_of
from .subscription import Subscription
from .topic import Topic

SUBSCRIPTION_TYPES: dict[int, str] = {pb.CommandSubscribe.Exclusive: "Exclusive", pb.CommandSubscribe.Shared: "Shared",
                      pb.CommandSubscribe.Failover: "Failover", pb.CommandSubscribe.Key_Shared: "Key_Shared"}


def backlog_entries(subscription: Subscription) -> int:
    """Entries not yet acknowledged (Pulsar's msgBacklog counts entries too), without a walk."""
    cursor = subscription.cursor
    return max(0, subscription.topic.log.next_entry_id - cursor.mark_delete - 1 - len(cursor.acked))


def backlog_bytes(topic: Topic, entries: int) -> int:
    """The bytes of the last `entries` entries, estimated from the log's average entry size."""
    stored = topic.log.next_entry_id - topic.log.first_entry_id
    return topic.log.size_bytes * min(entries, stored) // stored if stored > 0 else 0


def position(topic: Topic, entry_id: int) -> str:
    """`ledgerId:entryId`, as Pulsar's internal stats write positions."""
    return f"{topic.ledger_of(max(entry_id, 0))}:{entry_id}"


class RateSampler:
    """Per-second rates of each topic's and subscription's counters over the last interval."""

    def __init__(self, topics: dict[str, Topic], interval: float = 5.0) -> None:
        self.topics = topics
        self.interval = interval
        self._last: dict[tuple, tuple[int, int]] = {}
        self._last_time = time.monotonic()
        self.rates: dict[tuple, tuple[float, float]] = {}  # key -> (messages/s, bytes/s)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.interval)
                self.sample()
        except asyncio.CancelledError:
            pass

    def sample(self) -> None:
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-3)
        counters: dict[tuple, tuple[int, int]] = {}
        for name, topic in list(self.topics.items()):
            counters[(name, "in")] = (topic.messages_in, topic.bytes_in)
            for sub_name, subscription in topic.subscriptions.items():
                counters[(name, sub_name)] = (subscription.messages_out, subscription.bytes_out)
        rates = {}
        for key, (messages, size) in counters.items():
            before = self._last.get(key, (0, 0))
            if messages < before[0]:  # the topic was reopened (deleted, unloaded): counted afresh
                before = (0, 0)
            rates[key] = ((messages - before[0]) / elapsed, (size - before[1]) / elapsed)
        self._last, self._last_time, self.rates = counters, now, rates

    def topic_in(self, name: str) -> tuple[float, float]:
        return self.rates.get((name, "in"), (0.0, 0.0))

    def subscription_out(self, topic: str, subscription: str) -> tuple[float, float]:
        return self.rates.get((topic, subscription), (0.0, 0.0))


def topic_stats(topic: Topic, rates: RateSampler, deduplication: bool) -> dict:
    """`GET .../stats`: Pulsar's TopicStats."""
    rate_in, throughput_in = rates.topic_in(topic.name)
    subscriptions = {name: subscription_stats(sub, rates) for name, sub in topic.subscriptions.items()}
    storage = topic.log.size_bytes
    publishers: list[dict] = []
    for producer in list(topic.producers.values()):
        conn = getattr(producer, "conn", None)
        publishers.append({
            "accessMode": "Exclusive" if producer is topic.exclusive_producer else "Shared",
            "msgRateIn": 0.0, "msgThroughputIn": 0.0, "averageMsgSize": 0.0,
            "producerId": getattr(producer, "producer_id", 0), "producerName": producer.name,
            "address": _address(conn), "connectedSince": "", "clientVersion": "", "metadata": {},
            "supportsPartialProducer": False})
    return {
        "msgRateIn": rate_in, "msgThroughputIn": throughput_in,
        "msgRateOut": sum(s["msgRateOut"] for s in subscriptions.values()),
        "msgThroughputOut": sum(s["msgThroughputOut"] for s in subscriptions.values()),
        "bytesInCounter": topic.bytes_in, "msgInCounter": topic.messages_in,
        "bytesOutCounter": sum(s["bytesOutCounter"] for s in subscriptions.values()),
        "msgOutCounter": sum(s["msgOutCounter"] for s in subscriptions.values()),
        "averageMsgSize": throughput_in / rate_in if rate_in else 0.0,
        "msgChunkPublished": False, "storageSize": storage,
        "backlogSize": backlog_bytes(topic, max((s["msgBacklog"] for s in subscriptions.values()), default=0)),
        "earliestMsgPublishTimeInBacklogs": 0, "offloadedStorageSize": 0, "waitingPublishers":
        len(topic.waiting_producers), "publishRateLimitedTimes": 0, "nonContiguousDeletedMessagesRanges": 0,
        "nonContiguousDeletedMessagesRangesSerializedSize": 0, "topicEpoch": topic.epoch or None,
        "publishers": publishers, "subscriptions": subscriptions, "replication": {},
        "deduplicationStatus": "Enabled" if deduplication else "Disabled",
        "compaction": {"lastCompactionRemovedEventCount": 0, "lastCompactionSucceedTimestamp": 0,
                       "lastCompactionFailedTimestamp": 0, "lastCompactionDurationTimeInMills": 0},
    }


def subscription_stats(subscription: Subscription, rates: RateSampler) -> dict:
    rate_out, throughput_out = rates.subscription_out(subscription.topic.name, subscription.name)
    consumers = [{
        "consumerName": consumer.name, "availablePermits": consumer.permits,
        "unackedMessages": consumer.unacked_messages, "blockedConsumerOnUnackedMsgs": consumer.blocked,
        "msgRateOut": 0.0, "msgThroughputOut": 0.0, "msgRateRedeliver": 0.0, "bytesOutCounter": 0,
        "msgOutCounter": 0, "address": _address(getattr(consumer, "conn", None)), "connectedSince": "",
        "clientVersion": "", "metadata": {}} for consumer in subscription.consumers]
    backlog = backlog_entries(subscription)
    return {
        "msgRateOut": rate_out, "msgThroughputOut": throughput_out,
        "bytesOutCounter": subscription.bytes_out, "msgOutCounter": subscription.messages_out,
        "msgRateRedeliver": 0.0, "msgRateExpired": 0.0, "msgBacklog": backlog, "msgBacklogNoDelayed": backlog,
        "backlogSize": 0, "msgDelayed": len(subscription._delayed),
        "unackedMessages": sum(c.unacked_messages for c in subscription.consumers),
        "blockedSubscriptionOnUnackedMsgs": False,
        "type": SUBSCRIPTION_TYPES.get(subscription.type, "Exclusive"),
        "activeConsumerName": subscription.active.name if subscription.active is not None else None,
        "isDurable": subscription.durable, "isReplicated": False, "replicated": False,
        "consumers": consumers, "consumersAfterMarkDeletePosition": {},
        "nonContiguousDeletedMessagesRanges": len(subscription.cursor.acked),
        "nonContiguousDeletedMessagesRangesSerializedSize": 0, "subscriptionProperties": {},
        "readCompacted": subscription.read_compacted,
    }


def internal_stats(topic: Topic) -> dict:
    """`GET .../internalStats`: Pulsar's PersistentTopicInternalStats (a ledger per ledger-id range)."""
    log_ = topic.log
    starts = list(topic._ledger_starts) + [log_.next_entry_id]
    ledgers = []
    for i, ledger in enumerate(topic._ledger_ids):
        first, end = max(starts[i], log_.first_entry_id), starts[i + 1]
        if end > first or i == len(topic._ledger_ids) - 1:
            ledgers.append({"ledgerId": ledger, "entries": max(0, end - first), "size": 0, "offloaded": False,
                            "underReplicated": False})
    if ledgers:
        ledgers[-1]["size"] = log_.size_bytes
    cursors = {}
    for name, sub in topic.subscriptions.items():
        cursors[name] = {
            "markDeletePosition": position(topic, sub.cursor.mark_delete),
            "readPosition": position(topic, sub.read_position),
            "waitingReadOp": False, "pendingReadOps": 0, "messagesConsumedCounter": sub.messages_out,
            "cursorLedger": -1, "cursorLedgerLastEntry": -1,
            "individuallyDeletedMessages": "[" + ",".join(
                f"({position(topic, e - 1)}..{position(topic, e)}]" for e in sorted(sub.cursor.acked)[:100]) + "]",
            "lastLedgerSwitchTimestamp": "", "state": "Open", "active": bool(sub.consumers),
            "numberOfEntriesSinceFirstNotAckedMessage": max(0, sub.read_position - sub.cursor.mark_delete - 1),
            "totalNonContiguousDeletedMessagesRange": len(sub.cursor.acked), "subscriptionHavePendingRead": False,
            "subscriptionHavePendingReplayRead": False, "properties": {}}
    entries = max(0, log_.next_entry_id - log_.first_entry_id)
    return {
        "entriesAddedCounter": entries, "numberOfEntries": entries, "totalSize": log_.size_bytes,
        "currentLedgerEntries": max(0, log_.next_entry_id - topic.ledger_start),
        "currentLedgerSize": log_.size_bytes, "lastLedgerCreatedTimestamp": "", "waitingCursorsCount": 0,
        "pendingAddEntriesCount": 0, "lastConfirmedEntry": position(topic, log_.last_entry_id),
        "state": "LedgerOpened", "ledgers": ledgers, "cursors": cursors,
        "schemaLedgers": [], "compactedLedger": {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False,
                                                 "underReplicated": False},
    }


def labels(topic_name: str) -> tuple[str, str, str]:
    """(cluster, namespace, topic): the labels Pulsar puts on a topic's metrics."""
    return CLUSTER, namespace_of(topic_name), topic_name


def _address(conn: object) -> str:
    transport = getattr(conn, "transport", None)
    peer = transport.get_extra_info("peername") if transport is not None else None
    return f"/{peer[0]}:{peer[1]}" if peer else ""
