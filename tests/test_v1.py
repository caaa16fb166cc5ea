"""The V1 text protocol: every command and error path, replication, groups, restart."""
from __future__ import annotations

import asyncio
import json
import os

import pytest

from pulsarwire import Client, InitialPosition
from pulsarwire.v1client import V1Client, V1Error, parse_payload

from .conftest import unique
from .peers import BrokerThread
from .test_client import run


@pytest.fixture
def broker(tmp_path):
    b = BrokerThread(tmp_path, v1_port=0, v1_partitions=3, replication_factor=3, min_insync_replicas=2,
                     replication_timeout=0.5, replica_lag_time=1.0, session_timeout=0.6).start()
    yield b
    b.stop()


def v1(broker):
    return V1Client.connect("127.0.0.1", broker.v1_port)


def test_ping_produce_consume_and_high_watermark(broker):
    async def main():
        async with await v1(broker) as c:
            assert await c.ping() == "PONG"
            topic = unique("orders")
            first = await c.produce(topic, "user-1", "hello world", acks="1")
            assert set(first) == {"partition", "offset", "hw"} and first["offset"] == 0
            again = await c.produce(topic, "user-1", "second: with colon", acks="0")
            assert again["partition"] == first["partition"] and again["offset"] == 1
            batch = await c.consume(topic, first["partition"], 0)
            assert batch["messages"] == [(0, "hello world"), (1, "second: with colon")]
            assert batch["hw"] == 2
            assert (await c.consume(topic, first["partition"], 1))["messages"] == [(1, "second: with colon")]
            # a follower fetching to offset 1 joins the ISR; the high watermark is its acked offset
            fetched = await c.replica_fetch(topic, first["partition"], 1, 1)
            assert fetched == {"replica": 1, "acked_offset": 1, "hw": 1, "isr": [0, 1], "under_replicated": True}
            assert (await c.consume(topic, first["partition"], 0))["messages"] == [(0, "hello world")]
            await c.replica_fetch(topic, first["partition"], 2, 2)
            fetched = await c.replica_fetch(topic, first["partition"], 1, 2)
            assert fetched["isr"] == [0, 1, 2] and fetched["under_replicated"] is False and fetched["hw"] == 2
    run(main())


def test_acks_all_waits_for_replicas_or_times_out(broker):
    async def main():
        async with await v1(broker) as c, await v1(broker) as follower:
            topic = unique("acks")
            with pytest.raises(V1Error) as info:
                await c.produce(topic, "k", "lonely", acks="all")  # ISR is only the leader
            assert info.value.code == "REPLICATION_TIMEOUT"
            partition = (await c.produce(topic, "k", "warm-up"))["partition"]
            await follower.replica_fetch(topic, partition, 1, 2)

            async def replicate():
                for _ in range(20):
                    await asyncio.sleep(0.05)
                    await follower.replica_fetch(topic, partition, 1, 100)
            task = asyncio.ensure_future(replicate())
            placed = await c.produce(topic, "k", "replicated", acks="all")
            assert placed["hw"] > placed["offset"]
            await task
    run(main())


def test_roles_and_not_leader(broker):
    async def main():
        async with await v1(broker) as c:
            topic = unique("roles")
            partition = (await c.produce(topic, "key", "v"))["partition"]
            assert await c.set_partition_role(topic, partition, "follower") == {"role": "follower"}
            for call in (c.produce(topic, "key", "v"), c.replica_fetch(topic, partition, 1, 0)):
                with pytest.raises(V1Error) as info:
                    await call
                assert info.value.code == "NOT_LEADER"
            await c.set_partition_role(topic, partition, "leader")
            await c.produce(topic, "key", "v")
    run(main())


def test_groups_join_sync_heartbeat_commit_leave(broker):
    async def main():
        async with await v1(broker) as c:
            topic = unique("grouped")
            await c.produce(topic, "a", "1")
            joined = await c.join("g", topic, "c1")
            assert joined == {"generation": 1, "assigned": [0, 1, 2]}
            joined2 = await c.join("g", topic, "c2", assignor="range")
            assert joined2 == {"generation": 2, "assigned": [2]}
            assert await c.sync("g", "c1") == {"generation": 2, "assigned": [0, 1]}
            with pytest.raises(V1Error) as info:
                await c.heartbeat("g", "c1", 1)
            assert info.value.code == "GENERATION_MISMATCH"
            assert await c.heartbeat("g", "c1", 2) == {"generation": 2}
            assert await c.commit("g", topic, 0, 5, "c1", 2) == {"offset": 5}
            for args in ((topic, 2, 1, "c1", 2), (topic, 0, 1, "c1", 1), (topic, 0, 1, "nobody", 2)):
                with pytest.raises(V1Error) as info:
                    await c.commit("g", *args)
                assert info.value.code == "GENERATION_MISMATCH"
            assert await c.offset("g", topic, 0) == 5
            assert await c.offset("g", topic, 1) == -1
            assert await c.leave("g", "c2") == {"generation": 3}
            assert await c.sync("g", "c1") == {"generation": 3, "assigned": [0, 1, 2]}
    run(main())


def test_session_timeout_rebalances(broker):
    async def main():
        async with await v1(broker) as c:
            topic = unique("sessions")
            await c.join("timeouts", topic, "alive")
            await c.join("timeouts", topic, "silent")
            for _ in range(8):
                await asyncio.sleep(0.15)
                generation = (await c.sync("timeouts", "alive"))["generation"]
            state = await c.sync("timeouts", "alive")
            assert state["assigned"] == [0, 1, 2] and state["generation"] == generation
            with pytest.raises(V1Error) as info:
                await c.sync("timeouts", "silent")
            assert info.value.code == "GENERATION_MISMATCH"
    run(main())


def test_error_paths(broker):
    async def main():
        async with await v1(broker) as c:
            topic = unique("errors")
            await c.produce(topic, "k", "v")
            cases = {
                "garbage": "V1|0|ERR|BAD_REQUEST|",
                "V1|abc|PING|": "V1|0|ERR|BAD_REQUEST|",
                "V2|1|PING|": "V1|0|ERR|BAD_REQUEST|",
                "V1|3|FLY|away": "V1|3|ERR|UNKNOWN_COMMAND|",
                "V1|4|PRODUCE|": "V1|4|ERR|BAD_REQUEST|",
                f"V1|5|PRODUCE|{topic} novalue": "V1|5|ERR|BAD_REQUEST|",
                f"V1|6|PRODUCE|{topic} k:v acks=2": "V1|6|ERR|BAD_REQUEST|",
                f"V1|7|CONSUME|{topic} 0": "V1|7|ERR|BAD_REQUEST|",
                f"V1|8|CONSUME|{topic} x 0": "V1|8|ERR|BAD_REQUEST|",
                f"V1|9|CONSUME|{topic} 0 -1": "V1|9|ERR|BAD_REQUEST|",
                f"V1|10|CONSUME|{topic} 7 0": "V1|10|ERR|BAD_REQUEST|",
                "V1|11|CONSUME|no-such-topic 0 0": "V1|11|ERR|BAD_REQUEST|",
                f"V1|12|REPLICA_FETCH|{topic} 0 0 0": "V1|12|ERR|BAD_REQUEST|",
                f"V1|13|REPLICA_FETCH|{topic} 0 3 0": "V1|13|ERR|BAD_REQUEST|",
                f"V1|14|SET_PARTITION_ROLE|{topic} 0 boss": "V1|14|ERR|BAD_REQUEST|",
                f"V1|15|JOIN|g {topic}": "V1|15|ERR|BAD_REQUEST|",
                f"V1|16|JOIN|g {topic} c assignor=sticky": "V1|16|ERR|BAD_REQUEST|",
                "V1|17|SYNC|nogroup c": "V1|17|ERR|GENERATION_MISMATCH|",
                "V1|18|HEARTBEAT|nogroup c x": "V1|18|ERR|GENERATION_MISMATCH|",
                "V1|19|OFFSET|g t x": "V1|19|ERR|BAD_REQUEST|",
                "V1|20|PING|": "V1|20|OK|PONG",
            }
            for line, expected in cases.items():
                response = await c.raw(line)
                assert response.startswith(expected), (line, response)
            # the connection survived every error
            assert await c.ping() == "PONG"
            # an overlong line is refused
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.v1_port)
            writer.write(b"V1|1|PING|" + b"x" * (1 << 21) + b"\n")
            assert (await reader.readline()).startswith(b"V1|0|ERR|BAD_REQUEST|")
            writer.close()
    run(main())


def test_groups_and_offsets_survive_restart(tmp_path):
    broker = BrokerThread(tmp_path, v1_port=0, v1_partitions=2).start()

    async def before():
        async with await v1(broker) as c:
            await c.produce("persist", "k", "v")
            joined = await c.join("pg", "persist", "m1")
            await c.commit("pg", "persist", 0, 7, "m1", joined["generation"])
            return joined["generation"]
    try:
        generation = run(before())
        broker.restart()
        with open(os.path.join(str(tmp_path), "groups.json")) as fh:
            assert "pg" in json.load(fh)

        async def after():
            async with await v1(broker) as c:
                assert await c.offset("pg", "persist", 0) == 7
                assert (await c.sync("pg", "m1"))["generation"] == generation
                assert (await c.consume("persist", (await c.produce("persist", "k", "w"))["partition"], 0))["messages"]
        run(after())
    finally:
        broker.stop()


def test_v1_and_pulsar_clients_share_the_log(broker):
    async def main():
        topic = unique("shared-log")
        async with await v1(broker) as c:
            placed = [await c.produce(topic, f"key{i}", f"value-{i}") for i in range(6)]
        async with Client(broker.url) as client:
            consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
            got = {(await consumer.receive(5000)).data() for _ in range(6)}
            assert got == {b"value-%d" % i for i in range(6)}
            producer = await client.create_producer(f"{topic}-partition-0")
            await producer.send(b"from-pulsar")
        async with await v1(broker) as c:
            records = (await c.consume(topic, 0, 0))["messages"]
            assert (records[-1][1]) == "from-pulsar"
        assert placed
    run(main())


def test_parse_payload():
    assert parse_payload("partition=1 offset=2 hw=3") == {"partition": 1, "offset": 2, "hw": 3}
    assert parse_payload("messages= hw=0") == {"messages": [], "hw": 0}
    assert parse_payload("messages=0:a b,1:c hw=2") == {"messages": [(0, "a b"), (1, "c")], "hw": 2}
    assert parse_payload("isr=[0,1] under_replicated=false") == {"isr": [0, 1], "under_replicated": False}
