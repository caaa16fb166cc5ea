"""One client producing and consuming on one connection: Send frames on the wire are bounded
(Connection.WIRE_BUDGET), so control frames (FLOW, ACK) never queue behind everything a
producer holds, and nothing is lost, reordered or left counted."""
from __future__ import annotations

import asyncio

from pulsarwire import Client, InitialPosition

from ..conftest import unique


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def test_send_frames_on_the_wire_stay_within_the_budget(embedded):
    async def main():
        topic = unique()
        async with Client(embedded.url, operation_timeout_seconds=10) as client:
            consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest,
                                              receiver_queue_size=100)
            producers = [await client.create_producer(topic, batching_enabled=False, max_pending_messages=3000)
                         for _ in range(2)]
            conn = producers[0]._partitions[0].conn
            assert conn is producers[1]._partitions[0].conn is consumer._partitions[0].conn
            payload = bytes(1024)
            highest = 0
            futures = []
            for i in range(3000):
                for n, producer in enumerate(producers):
                    futures.append(await producer.send_async(payload + b"%d:%d" % (n, i)))
                highest = max(highest, conn.wire_bytes)
            # far more is pending than the budget lets out: the rest waits in the producers
            assert sum(len(p._partitions[0].pending) for p in producers) > 0
            assert highest <= conn.WIRE_BUDGET + 2 * 2048
            received = []
            while len(received) < 6000:
                batch = await consumer.receive_many(1000, timeout_millis=5000)
                assert batch, f"stalled after {len(received)}"
                for message in batch:
                    consumer.acknowledge(message)
                received.extend(batch)
            ids = await asyncio.gather(*futures)
            assert len(set(ids)) == 6000
            for n in range(2):  # each producer's messages in its order
                mine = [m.data()[1024:] for m in received if m.data()[1024:].startswith(b"%d:" % n)]
                assert mine == [b"%d:%d" % (n, i) for i in range(3000)]
            assert conn.wire_bytes == 0 and not conn._waiting_for_wire
            assert all(p._partitions[0]._wire_bytes == 0 for p in producers)
    run(main())


def test_reattaching_on_a_live_connection_gives_back_the_budget(embedded):
    async def main():
        topic = unique()
        async with Client(embedded.url, operation_timeout_seconds=10, initial_backoff_seconds=0.05) as client:
            producer = await client.create_producer(topic, batching_enabled=False)
            partition = producer._partitions[0]
            conn = partition.conn
            futures = [await producer.send_async(b"x" * 100) for _ in range(50)]
            # the broker closing the producer (not the connection): what was on the wire goes again
            conn.producers.pop(partition.producer_id)
            partition.connection_lost(conn)
            futures += [await producer.send_async(b"y" * 100) for _ in range(50)]
            await producer.flush()
            ids = await asyncio.gather(*futures)
            assert len(ids) == 100
            assert partition.conn is conn and conn.wire_bytes == 0
    run(main())

