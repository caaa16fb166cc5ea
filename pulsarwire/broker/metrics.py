"""`/metrics` in the Prometheus text format, with Pulsar's metric names and labels (`cluster`,
`namespace`, `topic`, `subscription`), so dashboards made for Pulsar work; and the embedded
broker's own counters (`broker.pulsar.stats()`, storage faults, the entry cache) as
`pulsarwire_*`. Built from in-memory state at each scrape: no disk is read.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from .policies import CLUSTER
from .stats import RateSampler, backlog_bytes, backlog_entries, labels

if TYPE_CHECKING:
    from .core import BrokerCore
    from .pulsar import PulsarService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServedBroker(Protocol):
    """What the metrics and the HTTP front end read of the broker that serves them (server.Broker)."""

    core: BrokerCore
    pulsar: PulsarService

    def storage_stats(self) -> dict[str, Any]: ...


class BrokerCollector:
    """A prometheus_client collector of the broker-wide metrics (a few dozen series)."""

    def __init__(self, broker: ServedBroker, rates: RateSampler) -> None:
        self.broker = broker
        self.rates = rates

    def collect(self) -> Iterator[Metric]:
        yield from self._broker_metrics()

    def _broker_metrics(self) -> Iterator[Metric]:
        cluster = [CLUSTER]
        service = self.broker.pulsar.stats()
        for name, doc, value in (
                ("pulsar_active_connections", "Open Pulsar protocol connections", service["connections"]),
                ("pulsar_broker_topics_count", "Open topics", len(self.broker.core.topics)),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["cluster"])
            gauge.add_metric(cluster, value)
            yield gauge
        # the bounded-resource counters: what hostile or slow clients cost, what is held now
        for key, value in sorted(service.items()):
            gauge = GaugeMetricFamily(f"pulsarwire_broker_{key}", f"broker.pulsar.stats()['{key}']", labels=["cluster"])
            gauge.add_metric(cluster, value)
            yield gauge
        for key, value in sorted(self.broker.storage_stats().items()):
            if isinstance(value, (int, float)):
                gauge = GaugeMetricFamily(f"pulsarwire_storage_{key}", f"broker.storage_stats()['{key}']",
                                          labels=["cluster"])
                gauge.add_metric(cluster, value)
                yield gauge


def registry(broker: ServedBroker, rates: RateSampler) -> CollectorRegistry:
    """A registry of its own per broker (the process-wide default one would mix brokers)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(BrokerCollector(broker, rates))
    return reg


# (name, type, help) of the per-topic and per-subscription families, in the order they are written
TOPIC_FAMILIES = (
    ("pulsar_subscriptions_count", "gauge", "Subscriptions of the topic"),
    ("pulsar_producers_count", "gauge", "Producers attached to the topic"),
    ("pulsar_consumers_count", "gauge", "Consumers attached to the topic"),
    ("pulsar_rate_in", "gauge", "Messages in per second"),
    ("pulsar_rate_out", "gauge", "Messages out per second"),
    ("pulsar_throughput_in", "gauge", "Bytes in per second"),
    ("pulsar_throughput_out", "gauge", "Bytes out per second"),
    ("pulsar_storage_size", "gauge", "Bytes the topic's log takes"),
    ("pulsar_storage_backlog_size", "gauge", "Bytes of the largest subscription backlog (estimated)"),
    ("pulsar_msg_backlog", "gauge", "Entries not acknowledged, summed over the subscriptions"),
    ("pulsar_in_messages_total", "counter", "Messages stored since the topic opened"),
    ("pulsar_in_bytes_total", "counter", "Bytes stored since the topic opened"),
    ("pulsar_out_messages_total", "counter", "Messages dispatched since the topic opened"),
    ("pulsar_out_bytes_total", "counter", "Bytes dispatched since the topic opened"),
)
SUBSCRIPTION_FAMILIES = (
    ("pulsar_subscription_back_log", "gauge", "Entries the subscription has not acknowledged"),
    ("pulsar_subscription_msg_rate_out", "gauge", "Messages dispatched per second"),
    ("pulsar_subscription_msg_throughput_out", "gauge", "Bytes dispatched per second"),
    ("pulsar_subscription_unacked_messages", "gauge", "Messages dispatched and not acknowledged"),
    ("pulsar_subscription_consumers_count", "gauge", "Consumers of the subscription"),
    ("pulsar_subscription_delayed", "gauge", "Delayed messages held back"),
)


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _topic_rows(broker: ServedBroker, rates: RateSampler) -> tuple[list, list]:
    """([label block, value per TOPIC_FAMILIES], [label block, value per SUBSCRIPTION_FAMILIES])."""
    topic_rows, subscription_rows = [], []
    for name, topic in list(broker.core.topics.items()):
        cluster, namespace, _ = labels(name)
        block = f'cluster="{cluster}",namespace="{_label_value(namespace)}",topic="{_label_value(name)}"'
        rate_in, throughput_in = rates.topic_in(name)
        rate_out = throughput_out = 0.0
        messages_out = bytes_out = consumers = backlog = largest = 0
        for sub_name, sub in topic.subscriptions.items():
            sub_rate, sub_throughput = rates.subscription_out(name, sub_name)
            rate_out += sub_rate
            throughput_out += sub_throughput
            messages_out += sub.messages_out
            bytes_out += sub.bytes_out
            consumers += len(sub.consumers)
            entries = backlog_entries(sub)
            backlog += entries
            largest = max(largest, entries)
            # labels in name order, as prometheus_client writes them
            sub_block = (f'cluster="{cluster}",namespace="{_label_value(namespace)}",'
                         f'subscription="{_label_value(sub_name)}",topic="{_label_value(name)}"')
            subscription_rows.append((sub_block, (entries, sub_rate, sub_throughput,
                                                  sum(c.unacked_messages for c in sub.consumers),
                                                  len(sub.consumers), len(sub._delayed))))
        topic_rows.append((block, (len(topic.subscriptions), len(topic.producers), consumers, rate_in, rate_out,
                                   throughput_in, throughput_out, topic.log.size_bytes, backlog_bytes(topic, largest),
                                   backlog, topic.messages_in, topic.bytes_in, messages_out, bytes_out)))
    return topic_rows, subscription_rows


def exposition(broker: ServedBroker, rates: RateSampler, reg: CollectorRegistry) -> bytes:
    """The text format (version 0.0.4). The per-topic series, thousands on a broker with many
    topics, are written here with each topic's labels escaped once (prometheus_client's generic
    writer validates and escapes every label of every sample, which made a scrape of 200 topics
    cost tens of milliseconds of the event loop); the broker-wide ones by prometheus_client."""
    topic_rows, subscription_rows = _topic_rows(broker, rates)
    out: list[str] = []
    for families, rows in ((TOPIC_FAMILIES, topic_rows), (SUBSCRIPTION_FAMILIES, subscription_rows)):
        for index, (name, kind, doc) in enumerate(families):
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
            out.extend(f"{name}{{{block}}} {floatToGoString(values[index])}\n" for block, values in rows)
    return "".join(out).encode() + generate_latest(reg)
