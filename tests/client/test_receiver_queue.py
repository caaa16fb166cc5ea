"""The receiver queue's cross-thread takes: `take()` pops without a lock while the loop's
thread drops a partition's messages (`remove_from`) or another thread takes a bounded batch
(`take_many`); no message may be lost or handed out twice."""
from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import pytest

from pulsarwire import codec, sync
from pulsarwire.client import Client, InitialPosition
from pulsarwire.client.consumer import MessageQueue

from ..conftest import unique
from ..peers import BrokerThread


class _Owner:
    pass


class _Unit:
    __slots__ = ("owner",)

    def __init__(self, owner: _Owner) -> None:
        self.owner = owner


class _Single:
    __slots__ = ("payload_size",)

    def __init__(self, size: int) -> None:
        self.payload_size = size


class _Message:
    __slots__ = ("_ack_unit", "n", "_single")

    def __init__(self, owner: _Owner, n: int, size: int = 1) -> None:
        self._ack_unit = _Unit(owner)
        self.n = n
        self._single = _Single(size)


def test_take_without_a_lock_against_remove_from_loses_and_repeats_nothing():
    queue = MessageQueue()
    kept_owner, dropped_owner = _Owner(), _Owner()
    total = 200_000
    for n in range(total):
        queue.put(_Message(kept_owner if n % 3 else dropped_owner, n))  # type: ignore[arg-type]
    taken: list[int] = []
    stop = threading.Event()

    def taker() -> None:
        while not stop.is_set() or len(queue):
            message = queue.take()
            if message is not None:
                taken.append(message.n)

    thread = threading.Thread(target=taker)
    thread.start()
    removed = 0
    for _ in range(50):
        removed += queue.remove_from(dropped_owner)  # type: ignore[arg-type]
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    assert len(taken) == len(set(taken))  # none handed out twice
    dropped_taken = sum(1 for n in taken if n % 3 == 0)
    assert len(taken) + removed == total  # every message taken or removed
    assert dropped_taken + removed == len(range(0, total, 3))
    kept_in_order = [n for n in taken if n % 3]
    assert kept_in_order == sorted(kept_in_order)  # one taker sees the queue's order


def test_take_many_stops_at_max_bytes_and_leaves_the_next_message_first():
    queue = MessageQueue()
    owner = _Owner()
    for n in range(5):
        queue.put(_Message(owner, n, size=10))  # type: ignore[arg-type]
    out, size, full = queue.take_many(10, max_bytes=25)
    assert [m.n for m in out] == [0, 1] and size == 20 and full  # type: ignore[attr-defined]
    assert queue.take().n == 2  # type: ignore[union-attr]


def test_take_many_and_take_together_lose_and_repeat_nothing():
    queue = MessageQueue()
    owner = _Owner()
    total = 100_000
    for n in range(total):
        queue.put(_Message(owner, n))  # type: ignore[arg-type]
    got: list[int] = []
    lock = threading.Lock()

    def single() -> None:
        while len(queue):
            message = queue.take()
            if message is not None:
                with lock:
                    got.append(message.n)

    thread = threading.Thread(target=single)
    thread.start()
    while len(queue):
        out, _, _ = queue.take_many(100, max_bytes=50)
        with lock:
            got.extend(m.n for m in out)  # type: ignore[attr-defined]
    thread.join(30)
    assert sorted(got) == list(range(total))


# --- received messages outside the garbage collector's tracking --------------------------------

@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(tmp_path_factory.mktemp("receiver-queue"), v1_port=None).start()
    yield thread
    thread.stop()


def _produce(url: str, topic: str, count: int) -> None:
    client = sync.Client(url)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=50)
    for n in range(count):
        producer.send_async(b"m%d" % n, None)
    producer.flush()
    client.close()


def test_received_messages_are_untracked_by_the_cython_twin_only(broker):
    topic = unique("untracked")
    _produce(broker.url, topic, 200)
    client = sync.Client(broker.url)
    consumer = client.subscribe(topic, "s", initial_position=sync.InitialPosition.Earliest,
                                batch_receive_policy=sync.ConsumerBatchReceivePolicy(100, -1, 1000))
    try:
        received = consumer.batch_receive() + [consumer.receive()]
        assert [m.data() for m in received[:3]] == [b"m0", b"m1", b"m2"]
        tracked = codec.IMPLEMENTATION == "python"
        # the batch's messages and what they wrap, as made on the consumer's event loop
        assert {gc.is_tracked(m) for m in received[:-1]} == {tracked}
        assert {gc.is_tracked(m.native) for m in received} == {tracked}
        gc.collect()  # a collection meanwhile keeps them whole
        assert [m.data() for m in received[:3]] == [b"m0", b"m1", b"m2"]
        assert str(received[5].message_id()) == str(received[5].message_id())
    finally:
        client.close()


@pytest.mark.parametrize("surface", ["asyncio", "sync"])
def test_a_closed_consumer_with_messages_queued_is_freed(broker, surface):
    """The queue and each partition's last message refer back to received messages, which the
    collector does not see through: closing drops them, so the consumer and its client go."""
    topic = unique("freed")
    _produce(broker.url, topic, 300)
    if surface == "sync":
        client = sync.Client(broker.url)
        consumer = client.subscribe(topic, "s", initial_position=sync.InitialPosition.Earliest,
                                    receiver_queue_size=200)
        kept = consumer.receive()
        assert kept.data() == b"m0"
        native_consumer = weakref.ref(consumer._consumer)
        consumer.close()
        client.close()
        del consumer, client
    else:
        async def scenario():
            client = Client(broker.url)
            consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest,
                                              receiver_queue_size=200)
            kept = await consumer.receive()
            while len(consumer._queue) < 100:  # more came, still queued at close
                await asyncio.sleep(0.01)
            await consumer.close()
            await client.close()
            return kept, weakref.ref(consumer)
        kept, native_consumer = asyncio.run(scenario())
    assert kept.data() == b"m0"  # a message kept after close still reads
    del kept  # it holds its consumer (through its entry's AckUnit), as any reference does
    for _ in range(3):
        gc.collect()
    assert native_consumer() is None, gc.get_referrers(native_consumer())
