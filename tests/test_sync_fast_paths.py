"""`pulsarwire.sync`'s paths without a thread round trip per message: receive() takes from the
receiver queue in the caller's thread, acknowledgements and permits reach the loop in batches,
sends are queued in the caller's thread. What must hold: order, nothing lost or doubled, acks
sent before close, unacknowledged messages redelivered, callbacks called, flush waits."""
from __future__ import annotations

import threading

import pytest

import pulsarwire.sync as pulsar

from .conftest import unique


def produce(client, topic, count, size=16, batching=True):
    producer = client.create_producer(topic, batching_enabled=batching, block_if_queue_full=True)
    for i in range(count):
        producer.send_async(b"%08d" % i + bytes(size), None)
    producer.flush()
    producer.close()


def index(message):
    return int(message.data()[:8])


def test_receive_and_acknowledge_past_the_receiver_queue(embedded):
    topic = unique()
    with pulsar.Client(embedded.url) as client:
        consumer = client.subscribe(topic, "s", receiver_queue_size=10,
                                    initial_position=pulsar.InitialPosition.Earliest)
        produce(client, topic, 500)
        got = []
        for _ in range(500):  # 50 times the queue: permits go back as messages are taken
            message = consumer.receive(5000)
            got.append(index(message))
            consumer.acknowledge(message)
        assert got == list(range(500))
        with pytest.raises(pulsar.Timeout):
            consumer.receive(50)
        consumer.close()
        with pytest.raises(pulsar.AlreadyClosed):
            consumer.receive(50)
        with pytest.raises(pulsar.AlreadyClosed):
            consumer.acknowledge(message)


def test_concurrent_receivers_get_each_message_once_in_order(embedded):
    topic = unique()
    with pulsar.Client(embedded.url) as client:
        consumer = client.subscribe(topic, "s", receiver_queue_size=50,
                                    initial_position=pulsar.InitialPosition.Earliest)
        seen: dict[int, list[int]] = {n: [] for n in range(4)}

        def receive_all(n):
            while True:
                try:
                    message = consumer.receive(1000)
                except pulsar.Timeout:
                    return
                seen[n].append(index(message))
                consumer.acknowledge(message)
        threads = [threading.Thread(target=receive_all, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        produce(client, topic, 2000)
        for thread in threads:
            thread.join(30)
        every = sorted(i for got in seen.values() for i in got)
        assert every == list(range(2000))
        for got in seen.values():
            assert got == sorted(got)  # each thread sees the queue's order


def test_acknowledgements_reach_the_broker_when_closing_at_once(embedded):
    topic = unique()
    with pulsar.Client(embedded.url) as client:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        produce(client, topic, 300, batching=False)  # a batch comes again unless all of it is acknowledged
        for _ in range(200):
            consumer.acknowledge(consumer.receive(5000))
        consumer.close()  # no wait: the acks queued in this thread go out before the close
        again = client.subscribe(topic, "s")
        rest = [index(again.receive(5000)) for _ in range(100)]
        assert rest == list(range(200, 300))
        with pytest.raises(pulsar.Timeout):
            again.receive(300)
        again.close()


def test_unacknowledged_messages_come_again_after_close(embedded):
    topic = unique()
    with pulsar.Client(embedded.url) as client:
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                    initial_position=pulsar.InitialPosition.Earliest)
        produce(client, topic, 100, batching=False)
        for _ in range(100):
            message = consumer.receive(5000)
            if index(message) % 2:
                consumer.acknowledge(message)
        consumer.close()
        again = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        redelivered = sorted(index(again.receive(5000)) for _ in range(50))
        assert redelivered == list(range(0, 100, 2))
        again.close()


def test_a_receive_waiting_when_the_consumer_closes_answers(embedded):
    with pulsar.Client(embedded.url) as client:
        consumer = client.subscribe(unique(), "s")
        errors = []

        def wait():
            try:
                consumer.receive()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
        thread = threading.Thread(target=wait)
        thread.start()
        thread.join(0.3)
        consumer.close()
        thread.join(5)
        assert not thread.is_alive() and isinstance(errors[0], pulsar.AlreadyClosed)


def test_batch_receive_takes_what_is_queued(embedded):
    topic = unique()
    with pulsar.Client(embedded.url) as client:
        policy = pulsar.ConsumerBatchReceivePolicy(100, -1, 200)
        consumer = client.subscribe(topic, "s", batch_receive_policy=policy,
                                    initial_position=pulsar.InitialPosition.Earliest)
        produce(client, topic, 250)
        got = []
        while len(got) < 250:
            batch = consumer.batch_receive()
            assert 0 < len(batch) <= 100
            got += [index(m) for m in batch]
            for message in batch:
                consumer.acknowledge(message)
        assert got == list(range(250))
        assert consumer.batch_receive() == []  # the policy's timeout, nothing came
        consumer.close()
