"""`/metrics` in the Prometheus text format, with Pulsar's metric names and labels (`cluster`,
`namespace`, `topic`, `subscription`), so dashboards made for Pulsar work; and the embedded
broker's own counters (`broker.pulsar.stats()`, storage faults, the entry cache) as
`pulsarwire_*`. Built from in-memory state at each scrape: no disk is read.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .policies import CLUSTER
from .stats import RateSampler, backlog_bytes, backlog_entries, labels

if TYPE_CHECKING:
    from .server import Broker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TOPIC_LABELS = ["cluster", "namespace", "topic"]
SUBSCRIPTION_LABELS = TOPIC_LABELS + ["subscription"]


class BrokerCollector:
    """A prometheus_client collector over one broker."""

    def __init__(self, broker: "Broker", rates: RateSampler) -> None:
        self.broker = broker
        self.rates = rates

    def collect(self) -> Iterator[Metric]:
        gauges = {name: GaugeMetricFamily(name, doc, labels=TOPIC_LABELS) for name, doc in (
            ("pulsar_subscriptions_count", "Subscriptions of the topic"),
            ("pulsar_producers_count", "Producers attached to the topic"),
            ("pulsar_consumers_count", "Consumers attached to the topic"),
            ("pulsar_rate_in", "Messages in per second"),
            ("pulsar_rate_out", "Messages out per second"),
            ("pulsar_throughput_in", "Bytes in per second"),
            ("pulsar_throughput_out", "Bytes out per second"),
            ("pulsar_storage_size", "Bytes the topic's log takes"),
            ("pulsar_storage_backlog_size", "Bytes of the largest subscription backlog (estimated)"),
            ("pulsar_msg_backlog", "Entries not acknowledged, summed over the subscriptions"),
        )}
        counters = {name: CounterMetricFamily(name, doc, labels=TOPIC_LABELS) for name, doc in (
            ("pulsar_in_messages", "Messages stored since the topic opened"),
            ("pulsar_in_bytes", "Bytes stored since the topic opened"),
            ("pulsar_out_messages", "Messages dispatched since the topic opened"),
            ("pulsar_out_bytes", "Bytes dispatched since the topic opened"),
        )}
        subs = {name: GaugeMetricFamily(name, doc, labels=SUBSCRIPTION_LABELS) for name, doc in (
            ("pulsar_subscription_back_log", "Entries the subscription has not acknowledged"),
            ("pulsar_subscription_msg_rate_out", "Messages dispatched per second"),
            ("pulsar_subscription_msg_throughput_out", "Bytes dispatched per second"),
            ("pulsar_subscription_unacked_messages", "Messages dispatched and not acknowledged"),
            ("pulsar_subscription_consumers_count", "Consumers of the subscription"),
            ("pulsar_subscription_delayed", "Delayed messages held back"),
        )}
        for name, topic in list(self.broker.core.topics.items()):
            label = list(labels(name))
            rate_in, throughput_in = self.rates.topic_in(name)
            rate_out = throughput_out = 0.0
            messages_out = bytes_out = consumers = backlog = largest = 0
            for sub_name, sub in topic.subscriptions.items():
                sub_rate, sub_throughput = self.rates.subscription_out(name, sub_name)
                rate_out += sub_rate
                throughput_out += sub_throughput
                messages_out += sub.messages_out
                bytes_out += sub.bytes_out
                consumers += len(sub.consumers)
                entries = backlog_entries(sub)
                backlog += entries
                largest = max(largest, entries)
                sub_label = label + [sub_name]
                subs["pulsar_subscription_back_log"].add_metric(sub_label, entries)
                subs["pulsar_subscription_msg_rate_out"].add_metric(sub_label, sub_rate)
                subs["pulsar_subscription_msg_throughput_out"].add_metric(sub_label, sub_throughput)
                subs["pulsar_subscription_unacked_messages"].add_metric(
                    sub_label, sum(c.unacked_messages for c in sub.consumers))
                subs["pulsar_subscription_consumers_count"].add_metric(sub_label, len(sub.consumers))
                subs["pulsar_subscription_delayed"].add_metric(sub_label, len(sub._delayed))
            for metric, value in (("pulsar_subscriptions_count", len(topic.subscriptions)),
                                  ("pulsar_producers_count", len(topic.producers)),
                                  ("pulsar_consumers_count", consumers), ("pulsar_rate_in", rate_in),
                                  ("pulsar_rate_out", rate_out), ("pulsar_throughput_in", throughput_in),
                                  ("pulsar_throughput_out", throughput_out),
                                  ("pulsar_storage_size", topic.log.size_bytes),
                                  ("pulsar_storage_backlog_size", backlog_bytes(topic, largest)),
                                  ("pulsar_msg_backlog", backlog)):
                gauges[metric].add_metric(label, value)
            for metric, value in (("pulsar_in_messages", topic.messages_in), ("pulsar_in_bytes", topic.bytes_in),
                                  ("pulsar_out_messages", messages_out), ("pulsar_out_bytes", bytes_out)):
                counters[metric].add_metric(label, value)
        yield from gauges.values()
        yield from counters.values()
        yield from subs.values()
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


def registry(broker: "Broker", rates: RateSampler) -> CollectorRegistry:
    """A registry of its own per broker (the process-wide default one would mix brokers)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(BrokerCollector(broker, rates))  # type: ignore[arg-type]
    return reg


def exposition(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
