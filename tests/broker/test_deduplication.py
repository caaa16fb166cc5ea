"""Deduplication is a setting, as in Pulsar: off by default (every send is stored, whatever its
sequence id), on for the broker (`deduplication=True`), a namespace or a topic (policies kept
in the data dir)."""
from __future__ import annotations

import asyncio

import pytest

from pulsarwire.broker.policies import PolicyError
from pulsarwire.client import Client

from ..conftest import unique
from ..peers import BrokerThread

pulsar = pytest.importorskip("pulsar")


def _read_all(client, topic, count):
    consumer = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    got = []
    try:
        for _ in range(count):
            message = consumer.receive(timeout_millis=5000)
            got.append(message.data())
            consumer.acknowledge(message)
        with pytest.raises(Exception):
            consumer.receive(timeout_millis=200)
    finally:
        consumer.close()
    return got


def test_official_producer_sends_after_an_explicit_sequence_id_are_stored_by_default(tmp_path):
    """The official producer's `send(content, sequence_id=42)` then automatic sends (ids 1, 2, ...):
    a Pulsar broker with default settings stores all of them; so must the embedded broker."""
    broker = BrokerThread(tmp_path / "data", v1_port=None).start()
    client = pulsar.Client(broker.url, operation_timeout_seconds=10)
    try:
        topic = unique("after-explicit-id")
        producer = client.create_producer(topic, batching_enabled=False)
        ids = [producer.send(b"explicit", sequence_id=42)]
        ids += [producer.send(f"auto-{n}".encode()) for n in range(3)]
        assert all(message_id.entry_id() >= 0 for message_id in ids), ids
        assert _read_all(client, topic, 4) == [b"explicit", b"auto-0", b"auto-1", b"auto-2"]
    finally:
        client.close()
        broker.stop()


def test_deduplication_on_for_the_broker_drops_a_lower_sequence_id(tmp_path):
    broker = BrokerThread(tmp_path / "data", v1_port=None, deduplication=True).start()
    client = pulsar.Client(broker.url, operation_timeout_seconds=10)
    try:
        topic = unique("dedup-on")
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"first", sequence_id=5)
        duplicate = producer.send(b"again", sequence_id=5)
        assert (duplicate.ledger_id(), duplicate.entry_id()) == (-1, -1)  # as Pulsar answers it
        producer.send(b"next", sequence_id=6)
        assert _read_all(client, topic, 2) == [b"first", b"next"]
    finally:
        client.close()
        broker.stop()


def test_namespace_and_topic_policies_override_the_default_and_persist(tmp_path):
    async def scenario():
        from pulsarwire.broker.server import Broker
        async with Broker(str(tmp_path / "data"), v1_port=None) as broker:
            policies = broker.core.policies
            policies.create_tenant("acme", {})
            policies.create_namespace("acme/dedup")
            policies.set_namespace_policy("acme/dedup", "deduplicationEnabled", True)
            policies.set_topic_policy("persistent://acme/dedup/exempt", "deduplicationEnabled", False)
            await policies.save()
            async with Client(broker.service_url) as client:
                stored = await _send_twice(client, "persistent://acme/dedup/t")
                assert stored == 1  # the namespace deduplicates
                assert await _send_twice(client, "persistent://acme/dedup/exempt") == 2  # the topic does not
                assert await _send_twice(client, "persistent://public/default/" + unique("d")) == 2
        async with Broker(str(tmp_path / "data"), v1_port=None) as broker:  # kept across a restart
            assert broker.core.policies.deduplication("persistent://acme/dedup/t-partition-3")
            assert not broker.core.policies.deduplication("persistent://acme/dedup/exempt")
            with pytest.raises(PolicyError):
                broker.core.policies.set_namespace_policy("acme/dedup", "deduplicationEnabled", "yes")

    async def _send_twice(client, topic):
        producer = await client.create_producer(topic, producer_name=unique("p"), batching_enabled=False)
        await producer.send(b"x", sequence_id=7)
        receipt = await producer.send(b"x", sequence_id=7)
        await producer.close()
        return 1 if receipt.entry_id < 0 else 2

    asyncio.run(scenario())


def test_switching_deduplication_on_applies_to_open_topics(tmp_path):
    broker = BrokerThread(tmp_path / "data", v1_port=None).start()
    client = pulsar.Client(broker.url, operation_timeout_seconds=10)
    try:
        topic = unique("switch")
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"a", sequence_id=3)
        assert producer.send(b"b", sequence_id=3).entry_id() >= 0  # off: stored

        async def enable():
            broker.broker.core.policies.set_namespace_policy("public/default", "deduplicationEnabled", True)
            await broker.broker.core.policies.save()
        asyncio.run_coroutine_threadsafe(enable(), broker.loop).result(10)
        assert producer.send(b"c", sequence_id=3).entry_id() == -1  # on: a duplicate
    finally:
        client.close()
        broker.stop()
