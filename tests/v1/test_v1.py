"""The V1 text protocol, one test per rule of /work/shared/reference/v1_protocol.md (the
specification), then the broker's documented additions: AUTH, the CONSUME byte budget, and
V1 never touching Pulsar-side topics it does not own.

Brokers here are configured with timeouts that suit each test: `broker` is patient (no
wait can run out on a loaded machine), `impatient` times out quickly for the tests that
need a timeout to happen; those wait for conditions with generous deadlines."""
from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import tracemalloc

import pytest
import zstandard

from pulsarwire import Client, CompressionType, InitialPosition, MessageId
from pulsarwire.broker import metafile
from pulsarwire.broker import v1 as v1_module
from pulsarwire.broker.settings import BrokerSettings
from pulsarwire.v1client import V1Client, V1Error, parse_payload

from ..conftest import unique
from ..peers import BrokerProcess, BrokerThread, free_port, wait_for_port
from ..helpers import run

PARTITIONS = 3


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerThread(tmp_path_factory.mktemp("v1"), v1_port=0, v1_partitions=PARTITIONS, replication_factor=3,
                     min_insync_replicas=2, replication_timeout=60.0, replica_lag_time=600.0,
                     session_timeout=600.0).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def impatient(tmp_path_factory):
    b = BrokerThread(tmp_path_factory.mktemp("v1-impatient"), v1_port=0, v1_partitions=PARTITIONS,
                     replication_factor=3, min_insync_replicas=2, replication_timeout=0.3,
                     replica_lag_time=0.3, session_timeout=0.5).start()
    yield b
    b.stop()


def connect(broker, **options):
    return V1Client.connect("127.0.0.1", broker.v1_port, **options)


def ask(broker, *requests: str) -> list[str]:
    """Send raw request lines on one connection; their raw response lines."""
    async def main():
        async with await connect(broker) as c:
            return [await c.raw(line) for line in requests]
    return run(main())


def ask1(broker, request: str) -> str:
    return ask(broker, request)[0]


def is_error(response: str, correlation: str, code: str) -> bool:
    return response.startswith(f"V1|{correlation}|ERR|{code}|")


def produced(broker, topic: str, key: str, value: str) -> dict:
    response = ask1(broker, f"V1|1|PRODUCE|{topic} {key}:{value}")
    assert response.startswith("V1|1|OK|"), response
    return parse_payload(response.split("|", 3)[3])


def nothing_stored(broker, topic: str) -> bool:
    return all(ask1(broker, f"V1|1|CONSUME|{topic} {p} 0") == "V1|1|OK|messages= hw=0" for p in range(PARTITIONS))


# --- envelope -------------------------------------------------------------------------

def test_envelope_needs_exactly_four_sections(broker):
    for line in ("V1|5|PING", "V1|5|PING|a|b", "garbage", "", "V1|5", "V1|5|PING||"):
        assert is_error(ask1(broker, line), "0", "BAD_REQUEST"), line


def test_envelope_with_five_sections_stores_nothing(broker):
    topic = unique("five")
    assert is_error(ask1(broker, f"V1|1|PRODUCE|{topic} k:v|x"), "0", "BAD_REQUEST")
    assert nothing_stored(broker, topic)
    assert broker.call(broker.broker.core.partitioned_count, f"persistent://public/default/{topic}") is None


def test_envelope_version_must_be_V1(broker):
    for line in ("V2|1|PING|", "v1|1|PING|", "V1 |1|PING|", "|1|PING|"):
        assert is_error(ask1(broker, line), "0", "BAD_REQUEST"), line


def test_envelope_correlation_id_must_not_be_empty(broker):
    assert is_error(ask1(broker, "V1||PING|"), "0", "BAD_REQUEST")


def test_envelope_echoes_any_non_empty_correlation_id(broker):
    topic = unique("ids")
    for correlation in ("abc", "-7", "007", "x y", "ключ", "#!:=", "99999999999999999999999"):
        assert ask1(broker, f"V1|{correlation}|PING|") == f"V1|{correlation}|OK|PONG"
        assert is_error(ask1(broker, f"V1|{correlation}|FLY|"), correlation, "UNKNOWN_COMMAND")
        assert is_error(ask1(broker, f"V1|{correlation}|CONSUME|{topic} x 0"), correlation, "BAD_REQUEST")


def test_envelope_command_must_not_be_empty(broker):
    assert is_error(ask1(broker, "V1|1||"), "0", "BAD_REQUEST")
    assert is_error(ask1(broker, "V1|1||x"), "0", "BAD_REQUEST")


def test_unknown_command(broker):
    assert is_error(ask1(broker, "V1|3|FLY|away"), "3", "UNKNOWN_COMMAND")
    assert is_error(ask1(broker, "V1|4|produce|t k:v"), "4", "UNKNOWN_COMMAND")  # commands are upper case


def test_command_without_args_keeps_its_trailing_bar(broker):
    assert ask1(broker, "V1|99|PING|") == "V1|99|OK|PONG"
    assert is_error(ask1(broker, "V1|99|PING|extra"), "99", "BAD_REQUEST")


def test_lines_that_do_not_parse_and_connection_survives(broker):
    async def main():
        async with await connect(broker) as c:
            c._writer.write(b"V1|1|PING|\xff\n")
            assert (await c._reader.readline()).startswith(b"V1|0|ERR|BAD_REQUEST|")
            assert await c.raw("V1|2|PING|\r") == "V1|2|OK|PONG"  # CRLF line ends are accepted
            assert await c.ping() == "PONG"
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.v1_port)
        writer.write(b"V1|1|PING|" + b"x" * (1 << 21) + b"\n")
        assert (await reader.readline()).startswith(b"V1|0|ERR|BAD_REQUEST|")
        writer.close()
    run(main())


# --- PRODUCE ----------------------------------------------------------------------------

def test_produce_payload(broker):
    topic = unique("produce")
    first = ask1(broker, f"V1|42|PRODUCE|{topic} user1:created")
    assert re.fullmatch(r"V1\|42\|OK\|partition=[0-2] offset=0 hw=1", first), first
    partition = parse_payload(first.split("|", 3)[3])["partition"]
    again = ask1(broker, f"V1|43|PRODUCE|{topic} user1:updated acks=1")
    assert again == f"V1|43|OK|partition={partition} offset=1 hw=2"  # one key, one partition


def test_produce_ack_modes_0_and_1_answer_at_once(broker):
    topic = unique("acks")
    responses = ask(broker, f"V1|1|PRODUCE|{topic} k:a acks=0", f"V1|2|PRODUCE|{topic} k:b acks=1",
                    f"V1|3|PRODUCE|{topic} k:c")
    assert [parse_payload(r.split("|", 3)[3])["offset"] for r in responses] == [0, 1, 2]


def test_produce_ack_mode_must_be_exact(broker):
    topic = unique("ack-token")
    for token in ("ACKS=all", "ack=all", "acks=ALL", "acks=2", "acks=", "acks", "foo", "acks=all,"):
        assert is_error(ask1(broker, f"V1|7|PRODUCE|{topic} k:v {token}"), "7", "BAD_REQUEST"), token
    assert nothing_stored(broker, topic)


def test_produce_requires_a_key_value_record(broker):
    topic = unique("record")
    for args in (f"{topic} novalue", topic, "", f"{topic} k:v acks=1 extra", f"{topic} k:hello world"):
        assert is_error(ask1(broker, f"V1|5|PRODUCE|{args}"), "5", "BAD_REQUEST"), args
    assert nothing_stored(broker, topic)


def test_produce_value_may_hold_colons_and_key_may_be_empty(broker):
    topic = unique("colons")
    placed = produced(broker, topic, "k", "a:b:c")
    assert parse_payload(ask1(broker, f"V1|1|CONSUME|{topic} {placed['partition']} 0").split("|", 3)[3]) == \
        {"messages": [(0, "a:b:c")], "hw": 1}
    partitions = {produced(broker, topic, "", f"v{i}")["partition"] for i in range(PARTITIONS)}
    assert partitions == set(range(PARTITIONS))  # no key: round robin


def test_produce_topic_name_is_validated(broker):
    for topic in ("a/b", "persistent://x/y", "non-persistent://public/default/t", "x" * 300):
        assert is_error(ask1(broker, f"V1|1|PRODUCE|{topic} k:v"), "1", "BAD_REQUEST"), topic


def test_acks_0_and_1_succeed_without_replicas_acks_all_does_not(impatient):
    topic = unique("no-isr")
    stored = ask1(impatient, f"V1|1|PRODUCE|{topic} k:v acks=1")
    assert stored.startswith("V1|1|OK|")
    timed_out = ask1(impatient, f"V1|2|PRODUCE|{topic} k:w acks=all")
    assert is_error(timed_out, "2", "REPLICATION_TIMEOUT")
    partition = parse_payload(stored.split("|", 3)[3])["partition"]
    # the timed-out record is stored all the same (the ISR is only the leader: it is committed)
    assert ask1(impatient, f"V1|3|CONSUME|{topic} {partition} 0") == "V1|3|OK|messages=0:v,1:w hw=2"


def test_acks_all_waits_for_min_insync_replicas(broker):
    topic = unique("acks-all")

    async def main():
        async with await connect(broker) as producer, await connect(broker) as follower:
            partition = (await producer.produce(topic, "k", "first"))["partition"]
            done = asyncio.Event()

            async def replicate():
                while not done.is_set():
                    await follower.replica_fetch(topic, partition, 1, 1 << 40)
                    await asyncio.sleep(0.02)
            task = asyncio.ensure_future(replicate())
            try:
                placed = await producer.produce(topic, "k", "replicated", acks="all")
            finally:
                done.set()
                await task
            assert placed["offset"] == 1 and placed["hw"] == 2
    run(main())


# --- CONSUME ----------------------------------------------------------------------------

def test_consume_payload(broker):
    topic = unique("consume")
    partition = produced(broker, topic, "k", "a")["partition"]
    produced(broker, topic, "k", "b")
    assert ask(broker, f"V1|1|CONSUME|{topic} {partition} 0", f"V1|2|CONSUME|{topic} {partition} 1",
               f"V1|3|CONSUME|{topic} {partition} 2", f"V1|4|CONSUME|{topic} {partition} 50") == [
        "V1|1|OK|messages=0:a,1:b hw=2", "V1|2|OK|messages=1:b hw=2",
        "V1|3|OK|messages= hw=2", "V1|4|OK|messages= hw=2"]


def test_consume_numeric_fields_must_be_integers(broker):
    topic = unique("consume-ints")
    produced(broker, topic, "k", "v")
    for args in (f"{topic} x 0", f"{topic} 0 y", f"{topic} 0 1.5", f"{topic} 0 0x1", f"{topic} 0",
                 f"{topic} 0 0 0", f"{topic} 0 -1", f"{topic} -1 0", f"{topic} {PARTITIONS} 0",
                 f"{topic} 0 {1 << 70}"):
        assert is_error(ask1(broker, f"V1|8|CONSUME|{args}"), "8", "BAD_REQUEST"), args


def test_consume_of_a_topic_nobody_produced_to_is_empty(broker):
    topic = unique("nothing")
    assert ask1(broker, f"V1|1|CONSUME|{topic} 0 0") == "V1|1|OK|messages= hw=0"
    assert is_error(ask1(broker, f"V1|2|CONSUME|{topic} {PARTITIONS} 0"), "2", "BAD_REQUEST")
    assert broker.call(broker.broker.core.partitioned_count, f"persistent://public/default/{topic}") is None


def test_consume_returns_only_records_below_the_high_watermark(broker):
    topic = unique("committed")
    partition = produced(broker, topic, "k", "a")["partition"]
    produced(broker, topic, "k", "b")
    # the leader alone is the ISR: both records are committed, and stay so when replica 1
    # reports holding only offset 0 (behind the high watermark, it is not in sync)
    fetched = ask1(broker, f"V1|1|REPLICA_FETCH|{topic} {partition} 1 1")
    assert fetched == "V1|1|OK|replica=1 acked_offset=1 hw=2 isr=[0] under_replicated=true"
    assert ask1(broker, f"V1|2|CONSUME|{topic} {partition} 0") == "V1|2|OK|messages=0:a,1:b hw=2"
    assert ask1(broker, f"V1|3|REPLICA_FETCH|{topic} {partition} 1 2") == \
        "V1|3|OK|replica=1 acked_offset=2 hw=2 isr=[0,1] under_replicated=true"
    # now in sync, replica 1 holds the high watermark back: offset 2 waits for it
    assert re.fullmatch(rf"V1\|4\|OK\|partition={partition} offset=2 hw=2",
                        ask1(broker, f"V1|4|PRODUCE|{topic} k:c"))
    assert ask1(broker, f"V1|5|CONSUME|{topic} {partition} 0") == "V1|5|OK|messages=0:a,1:b hw=2"
    ask1(broker, f"V1|6|REPLICA_FETCH|{topic} {partition} 1 3")
    assert ask1(broker, f"V1|7|CONSUME|{topic} {partition} 0") == "V1|7|OK|messages=0:a,1:b,2:c hw=3"


# --- REPLICA_FETCH and SET_PARTITION_ROLE -----------------------------------------------

def test_replica_fetch_payload_isr_and_under_replication(broker):
    topic = unique("replicas")
    partition = produced(broker, topic, "k", "a")["partition"]
    produced(broker, topic, "k", "b")
    assert ask(broker, f"V1|1|REPLICA_FETCH|{topic} {partition} 2 9", f"V1|2|REPLICA_FETCH|{topic} {partition} 1 2") == [
        "V1|1|OK|replica=2 acked_offset=2 hw=2 isr=[0,2] under_replicated=true",  # acked up to the log end
        "V1|2|OK|replica=1 acked_offset=2 hw=2 isr=[0,1,2] under_replicated=false"]


def test_replica_fetch_fields_and_replica_id_range(broker):
    topic = unique("replica-args")
    partition = produced(broker, topic, "k", "a")["partition"]
    for args in (f"{topic} {partition} 0 0", f"{topic} {partition} 3 0", f"{topic} {partition} -1 0",
                 f"{topic} {partition} x 0", f"{topic} x 1 0", f"{topic} {partition} 1 y",
                 f"{topic} {partition} 1 -1", f"{topic} {partition} 1", f"{topic} {PARTITIONS} 1 0"):
        assert is_error(ask1(broker, f"V1|2|REPLICA_FETCH|{args}"), "2", "BAD_REQUEST"), args


def test_replica_fetch_before_anything_is_produced(broker):
    """A follower may report before the topic exists: the fetch creates it, and the replica
    is in the ISR with nothing acknowledged, so a record produced next is not yet committed."""
    topic = unique("early-replica")
    for partition in range(PARTITIONS):
        assert ask1(broker, f"V1|1|REPLICA_FETCH|{topic} {partition} 1 0") == \
            "V1|1|OK|replica=1 acked_offset=0 hw=0 isr=[0,1] under_replicated=true"
    assert re.fullmatch(r"V1\|2\|OK\|partition=\d offset=0 hw=0", ask1(broker, f"V1|2|PRODUCE|{topic} k:v"))


def test_replica_leaves_the_isr_after_the_lag_time(impatient):
    topic = unique("lag")
    partition = produced(impatient, topic, "k", "a")["partition"]
    assert parse_payload(ask1(impatient, f"V1|1|REPLICA_FETCH|{topic} {partition} 1 0").split("|", 3)[3])["isr"] \
        in ([0, 1], [0])
    deadline = time.monotonic() + 20
    while True:  # replica 1 stops fetching; replica 2's answers show it leave the ISR
        isr = parse_payload(ask1(impatient, f"V1|2|REPLICA_FETCH|{topic} {partition} 2 1").split("|", 3)[3])["isr"]
        if isr == [0, 2]:
            break
        assert time.monotonic() < deadline, isr
        time.sleep(0.1)


def test_set_partition_role_payload_and_not_leader(broker):
    topic = unique("roles")
    partition = produced(broker, topic, "key", "v")["partition"]
    assert ask1(broker, f"V1|1|SET_PARTITION_ROLE|{topic} {partition} follower") == \
        f"V1|1|OK|topic={topic} partition={partition} role=follower hw=1"
    assert is_error(ask1(broker, f"V1|2|PRODUCE|{topic} key:w"), "2", "NOT_LEADER")
    assert ask1(broker, f"V1|3|CONSUME|{topic} {partition} 0") == "V1|3|OK|messages=0:v hw=1"  # still readable
    assert ask1(broker, f"V1|4|SET_PARTITION_ROLE|{topic} {partition} leader") == \
        f"V1|4|OK|topic={topic} partition={partition} role=leader hw=1"
    assert ask1(broker, f"V1|5|PRODUCE|{topic} key:w") == f"V1|5|OK|partition={partition} offset=1 hw=2"


def test_set_partition_role_arguments(broker):
    topic = unique("role-args")
    for args in (f"{topic} 0 boss", f"{topic} 0 Leader", f"{topic} 0", f"{topic} x leader",
                 f"{topic} {PARTITIONS} leader", f"{topic} -1 follower", f"{topic} 0 leader extra"):
        assert is_error(ask1(broker, f"V1|6|SET_PARTITION_ROLE|{args}"), "6", "BAD_REQUEST"), args


def test_becoming_follower_fails_a_waiting_acks_all(broker):
    topic = unique("demoted")

    async def main():
        async with await connect(broker) as producer, await connect(broker) as admin:
            partition = (await producer.produce(topic, "k", "first"))["partition"]
            waiting = asyncio.ensure_future(producer.produce(topic, "k", "second", acks="all"))
            deadline = time.monotonic() + 20
            while not broker.broker.v1.state[(f"persistent://public/default/{topic}", partition)].waiters:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await admin.set_partition_role(topic, partition, "follower")
            with pytest.raises(V1Error) as info:
                await waiting
            assert info.value.code == "NOT_LEADER"
    run(main())


# --- consumer groups --------------------------------------------------------------------

def payload(response: str) -> str:
    assert "|OK|" in response, response
    return response.split("|", 3)[3]


def test_join_payload_and_round_robin_rebalance(broker):
    topic, group = unique("rr"), unique("g")
    assert ask1(broker, f"V1|1|JOIN|{group} {topic} c1") == "V1|1|OK|generation=1 assigned=[0,1,2]"
    assert ask1(broker, f"V1|2|JOIN|{group} {topic} c2 assignor=round_robin") == \
        "V1|2|OK|generation=2 assigned=[1]"
    assert ask1(broker, f"V1|3|SYNC|{group} {topic} c1 2") == "V1|3|OK|generation=2 assigned=[0,2]"
    assert ask1(broker, f"V1|4|JOIN|{group} {topic} c3") == "V1|4|OK|generation=3 assigned=[2]"
    assert ask(broker, f"V1|5|SYNC|{group} {topic} c1 3", f"V1|6|SYNC|{group} {topic} c2 3") == [
        "V1|5|OK|generation=3 assigned=[0]", "V1|6|OK|generation=3 assigned=[1]"]


def test_join_range_assignor(broker):
    topic, group = unique("range"), unique("g")
    assert ask1(broker, f"V1|1|JOIN|{group} {topic} c1 assignor=range") == "V1|1|OK|generation=1 assigned=[0,1,2]"
    assert ask1(broker, f"V1|2|JOIN|{group} {topic} c2 assignor=range") == "V1|2|OK|generation=2 assigned=[2]"
    assert ask1(broker, f"V1|3|SYNC|{group} {topic} c1 2") == "V1|3|OK|generation=2 assigned=[0,1]"
    # a JOIN without an assignor keeps the group's
    assert ask1(broker, f"V1|4|JOIN|{group} {topic} c0") == "V1|4|OK|generation=3 assigned=[0]"
    assert ask1(broker, f"V1|5|SYNC|{group} {topic} c2 3") == "V1|5|OK|generation=3 assigned=[2]"


def test_join_with_another_assignor_rebalances_with_it(broker):
    topic, group = unique("switch"), unique("g")
    ask(broker, f"V1|1|JOIN|{group} {topic} c1", f"V1|2|JOIN|{group} {topic} c2")
    assert ask1(broker, f"V1|3|JOIN|{group} {topic} c2 assignor=range") == "V1|3|OK|generation=3 assigned=[2]"


def test_rejoin_of_a_member_keeps_the_generation(broker):
    topic, group = unique("rejoin"), unique("g")
    assert ask(broker, f"V1|1|JOIN|{group} {topic} c1", f"V1|2|JOIN|{group} {topic} c1") == [
        "V1|1|OK|generation=1 assigned=[0,1,2]", "V1|2|OK|generation=1 assigned=[0,1,2]"]


def test_join_arguments(broker):
    topic, group = unique("join-args"), unique("g")
    for args in (f"{group} {topic}", f"{group} {topic} c assignor=sticky", f"{group} {topic} c assignor=RANGE",
                 f"{group} {topic} c range", f"{group} {topic} c assignor=range extra", f"{group} a/b c"):
        assert is_error(ask1(broker, f"V1|16|JOIN|{args}"), "16", "BAD_REQUEST"), args


def test_join_of_a_group_bound_to_another_topic(broker):
    group, other = unique("g"), unique("two")
    ask1(broker, f"V1|1|JOIN|{group} {unique('one')} c1")
    assert is_error(ask1(broker, f"V1|2|JOIN|{group} {other} c2"), "2", "BAD_REQUEST")
    assert broker.call(broker.broker.core.partitioned_count, f"persistent://public/default/{other}") is None


@pytest.mark.parametrize("command", ["SYNC", "HEARTBEAT", "LEAVE"])
def test_member_commands_take_group_topic_consumer_generation(broker, command):
    topic, group = unique("members"), unique("g")
    generation = parse_payload(payload(ask1(broker, f"V1|1|JOIN|{group} {topic} c1")))["generation"]
    for args in (f"{group} c1", f"{group} c1 {generation}", f"{group} {topic} c1",
                 f"{group} {topic} c1 {generation} extra", f"{group} {topic} c1 x", f"{group} {topic} c1 1.0"):
        assert is_error(ask1(broker, f"V1|2|{command}|{args}"), "2", "BAD_REQUEST"), args


@pytest.mark.parametrize("command", ["SYNC", "HEARTBEAT", "LEAVE", "COMMIT", "OFFSET", "CONSUME", "REPLICA_FETCH"])
def test_numeric_fields_are_validated_before_anything_else(broker, command):
    """Everything else about these requests is wrong too (no such group, no such member,
    an invalid topic): the bad integer is what is reported."""
    args = {"SYNC": "nogroup a/b nobody x", "HEARTBEAT": "nogroup a/b nobody x", "LEAVE": "nogroup a/b nobody x",
            "COMMIT": "nogroup a/b nobody 1 0 x", "OFFSET": "nogroup a/b x", "CONSUME": "a/b 0 x",
            "REPLICA_FETCH": "a/b 0 0 x"}[command]
    response = ask1(broker, f"V1|3|{command}|{args}")
    assert is_error(response, "3", "BAD_REQUEST") and "integer" in response, response


def test_sync_returns_the_current_assignment(broker):
    topic, group = unique("sync"), unique("g")
    ask(broker, f"V1|1|JOIN|{group} {topic} c1", f"V1|2|JOIN|{group} {topic} c2")
    assert ask(broker, f"V1|3|SYNC|{group} {topic} c1 2", f"V1|4|SYNC|{group} {topic} c2 2") == [
        "V1|3|OK|generation=2 assigned=[0,2]", "V1|4|OK|generation=2 assigned=[1]"]


def test_heartbeat_payload(broker):
    topic, group = unique("hb"), unique("g")
    ask1(broker, f"V1|1|JOIN|{group} {topic} c1")
    assert ask1(broker, f"V1|2|HEARTBEAT|{group} {topic} c1 1") == "V1|2|OK|heartbeat=ok"


def test_leave_payload_and_rebalance(broker):
    topic, group = unique("leave"), unique("g")
    ask(broker, f"V1|1|JOIN|{group} {topic} c1", f"V1|2|JOIN|{group} {topic} c2")
    assert ask1(broker, f"V1|3|LEAVE|{group} {topic} c2 2") == "V1|3|OK|left=true"
    assert ask1(broker, f"V1|4|SYNC|{group} {topic} c1 3") == "V1|4|OK|generation=3 assigned=[0,1,2]"
    assert is_error(ask1(broker, f"V1|5|SYNC|{group} {topic} c2 3"), "5", "GENERATION_MISMATCH")
    assert ask1(broker, f"V1|6|LEAVE|{group} {topic} c1 3") == "V1|6|OK|left=true"
    assert ask1(broker, f"V1|7|JOIN|{group} {topic} c9") == "V1|7|OK|generation=5 assigned=[0,1,2]"


@pytest.mark.parametrize("command", ["SYNC", "HEARTBEAT", "LEAVE"])
def test_stale_generation_unknown_member_and_unknown_group(broker, command):
    topic, group = unique("stale"), unique("g")
    ask(broker, f"V1|1|JOIN|{group} {topic} c1", f"V1|2|JOIN|{group} {topic} c2")
    for args in (f"{group} {topic} c1 1", f"{group} {topic} c1 3", f"{group} {topic} nobody 2",
                 f"{unique('nogroup')} {topic} c1 2"):
        assert is_error(ask1(broker, f"V1|9|{command}|{args}"), "9", "GENERATION_MISMATCH"), args
    # the member is still there at the current generation
    assert ask1(broker, f"V1|10|HEARTBEAT|{group} {topic} c1 2") == "V1|10|OK|heartbeat=ok"


def test_member_command_naming_another_topic(broker):
    topic, group = unique("bound"), unique("g")
    ask1(broker, f"V1|1|JOIN|{group} {topic} c1")
    assert is_error(ask1(broker, f"V1|2|HEARTBEAT|{group} {unique('other')} c1 1"), "2", "BAD_REQUEST")


def test_commit_payload_and_offset(broker):
    topic, group = unique("commit"), unique("g")
    ask(broker, f"V1|1|JOIN|{group} {topic} c1", f"V1|2|JOIN|{group} {topic} c2")
    assert ask(broker, f"V1|3|COMMIT|{group} {topic} c1 2 0 5", f"V1|4|OFFSET|{group} {topic} 0",
               f"V1|5|OFFSET|{group} {topic} 1", f"V1|6|COMMIT|{group} {topic} c2 2 1 0",
               f"V1|7|OFFSET|{group} {topic} 1") == [
        "V1|3|OK|committed=true", "V1|4|OK|offset=5", "V1|5|OK|offset=-1", "V1|6|OK|committed=true",
        "V1|7|OK|offset=0"]
    # the spelled-out topic name is the same topic
    assert ask1(broker, f"V1|8|OFFSET|{group} persistent://public/default/{topic} 0") == "V1|8|OK|offset=5"


def test_commit_is_validated_against_generation_member_and_assignment(broker):
    topic, group = unique("commit-check"), unique("g")
    ask(broker, f"V1|1|JOIN|{group} {topic} c1", f"V1|2|JOIN|{group} {topic} c2")  # c1 owns 0 and 2
    for args in (f"{group} {topic} c1 1 0 1",  # stale generation
                 f"{group} {topic} c1 2 1 1",  # partition 1 belongs to c2
                 f"{group} {topic} c1 2 7 1",  # no such partition: not assigned either
                 f"{group} {topic} nobody 2 0 1", f"{unique('nogroup')} {topic} c1 2 0 1"):
        assert is_error(ask1(broker, f"V1|9|COMMIT|{args}"), "9", "GENERATION_MISMATCH"), args
    assert ask1(broker, f"V1|10|OFFSET|{group} {topic} 0") == "V1|10|OK|offset=-1"


def test_commit_arguments(broker):
    topic, group = unique("commit-args"), unique("g")
    ask1(broker, f"V1|1|JOIN|{group} {topic} c1")
    for args in (f"{group} {topic} 0 5 c1 1",  # the old order
                 f"{group} {topic} c1 1 0", f"{group} {topic} c1 1 0 5 6", f"{group} {topic} c1 x 0 5",
                 f"{group} {topic} c1 1 y 5", f"{group} {topic} c1 1 0 z", f"{group} {topic} c1 1 0 -1",
                 f"{group} {topic} c1 1 -1 0"):
        assert is_error(ask1(broker, f"V1|9|COMMIT|{args}"), "9", "BAD_REQUEST"), args


def test_offset_arguments(broker):
    for args in ("g t x", "g t", "g t 0 1", "g t -1", "g a/b 0"):
        assert is_error(ask1(broker, f"V1|19|OFFSET|{args}"), "19", "BAD_REQUEST"), args
    assert ask1(broker, f"V1|20|OFFSET|{unique('g')} t 0") == "V1|20|OK|offset=-1"


def test_session_timeout_removes_silent_members_and_rebalances(impatient):
    topic, group = unique("sessions"), unique("g")

    async def main():
        async with await connect(impatient) as c:
            await c.join(group, topic, "silent")
            generation = (await c.join(group, topic, "alive"))["generation"]
            deadline = time.monotonic() + 30
            while True:  # alive keeps its session (re-joining if the loaded machine let it lapse)
                try:
                    state = await c.sync(group, topic, "alive", generation)
                    if state["assigned"] == list(range(PARTITIONS)):
                        break
                except V1Error as exc:
                    assert exc.code == "GENERATION_MISMATCH"
                    generation = (await c.join(group, topic, "alive"))["generation"]
                assert time.monotonic() < deadline, "silent member never timed out"
                await asyncio.sleep(0.05)
            with pytest.raises(V1Error) as info:
                await c.heartbeat(group, topic, "silent", generation)
            assert info.value.code == "GENERATION_MISMATCH"
    run(main())


def test_session_timeout_is_enforced_without_further_requests(impatient):
    topic, group = unique("idle"), unique("g")
    ask(impatient, f"V1|1|JOIN|{group} {topic} c1", f"V1|2|JOIN|{group} {topic} c2")
    path = os.path.join(impatient.data_dir, "groups.json")
    deadline = time.monotonic() + 30
    while True:  # the broker's maintenance expires both and persists the group
        with open(path) as fh:
            saved = metafile.decode(fh.buffer.read())[group]
        if not saved["members"]:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert saved["generation"] >= 3 and saved["assignments"] == {}


def test_groups_and_offsets_survive_restart(tmp_path):
    broker = BrokerThread(tmp_path, v1_port=0, v1_partitions=2, session_timeout=600.0).start()
    try:
        assert ask(broker, "V1|1|JOIN|pg persist m1 assignor=range", "V1|2|JOIN|pg persist m2",
                   "V1|3|COMMIT|pg persist m1 2 0 7", "V1|4|COMMIT|pg persist m2 2 1 3") == [
            "V1|1|OK|generation=1 assigned=[0,1]", "V1|2|OK|generation=2 assigned=[1]",
            "V1|3|OK|committed=true", "V1|4|OK|committed=true"]
        with open(tmp_path / "groups.json") as fh:
            assert metafile.decode(fh.buffer.read())["pg"] == {"topic": "persist", "assignor": "range", "generation": 2,
                                                               "members": ["m1", "m2"], "assignments": {"m1": [0], "m2": [1]}}
        with open(tmp_path / "offsets.json") as fh:
            assert metafile.decode(fh.buffer.read()) == {"pg": {"persist": {"0": 7, "1": 3}}}
        broker.restart()
        assert ask(broker, "V1|5|OFFSET|pg persist 0", "V1|6|OFFSET|pg persist 1", "V1|7|SYNC|pg persist m1 2",
                   "V1|8|HEARTBEAT|pg persist m2 2", "V1|9|JOIN|pg persist m3") == [
            "V1|5|OK|offset=7", "V1|6|OK|offset=3", "V1|7|OK|generation=2 assigned=[0]", "V1|8|OK|heartbeat=ok",
            "V1|9|OK|generation=3 assigned=[]"]  # range: 2 partitions among 3 members
    finally:
        broker.stop()


# --- additions: AUTH ----------------------------------------------------------------------

def test_auth_protects_the_v1_port(tmp_path):
    broker = BrokerThread(tmp_path, v1_port=0, auth_tokens={"secret"}).start()
    topic = unique("guarded")
    try:
        assert ask(broker, f"V1|1|PRODUCE|{topic} k:v", "V1|2|PING|", f"V1|3|CONSUME|{topic} 0 0") == [
            "V1|1|ERR|UNAUTHORIZED|this broker requires authentication: send AUTH <token> first",
            "V1|2|ERR|UNAUTHORIZED|this broker requires authentication: send AUTH <token> first",
            "V1|3|ERR|UNAUTHORIZED|this broker requires authentication: send AUTH <token> first"]
        assert broker.call(broker.broker.core.partitioned_count, f"persistent://public/default/{topic}") is None

        async def main():
            async with await connect(broker) as c:  # a wrong token: refused, and the connection is closed
                assert await c.raw("V1|4|AUTH|wrong") == "V1|4|ERR|UNAUTHORIZED|authentication failed"
                assert await c._reader.readline() == b""
            async with await connect(broker) as c:
                assert is_error(await c.raw("V1|5|AUTH|"), "5", "BAD_REQUEST")
                assert await c.raw("V1|6|AUTH|secret") == "V1|6|OK|authenticated=true"
                assert (await c.produce(topic, "k", "v"))["offset"] == 0
            async with await connect(broker, token="secret") as c:
                assert await c.ping() == "PONG"
            with pytest.raises(V1Error) as info:
                await connect(broker, token="nope")
            assert info.value.code == "UNAUTHORIZED"
        run(main())
    finally:
        broker.stop()


def test_auth_without_broker_auth_is_accepted(broker):
    assert ask(broker, "V1|1|AUTH|anything", "V1|2|PING|") == ["V1|1|OK|authenticated=true", "V1|2|OK|PONG"]


def test_cli_options_reach_the_v1_port(tmp_path):
    v1_port = free_port()
    process = BrokerProcess(tmp_path / "data", extra=[
        "--v1-port", str(v1_port), "--auth-token", "cli-secret", "--v1-consume-max-bytes", "64",
        "--v1-partitions", "2", "--replication-factor", "1", "--min-insync-replicas", "1",
        "--session-timeout", "600", "--v1-max-connections-per-address", "3",
        "--v1-max-total-output-bytes", "1048576"]).start()
    try:
        wait_for_port(v1_port)

        async def main():
            async with await V1Client.connect("127.0.0.1", v1_port) as c:
                with pytest.raises(V1Error) as info:
                    await c.ping()
                assert info.value.code == "UNAUTHORIZED"
            async with await V1Client.connect("127.0.0.1", v1_port, token="cli-secret") as c:
                placed = await c.produce("cli", "k", "x" * 100)
                with pytest.raises(V1Error) as info:
                    await c.consume("cli", placed["partition"], 0)
                assert info.value.code == "RECORD_TOO_LARGE" and info.value.offset == 0
                assert await c.join("g", "cli", "c1") == {"generation": 1, "assigned": [0, 1]}
                assert (await c.produce("cli", "k", "v", acks="all"))["hw"] == 2  # no replicas to wait for
                held = [_silent(v1_port) for _ in range(2)]  # with this one: 3 from this address
                with _silent(v1_port) as extra:
                    assert b"one address" in _first_line(extra)
                for s in held:
                    s.close()
        run(main())
    finally:
        process.stop()


# --- additions: CONSUME byte budget -------------------------------------------------------

@pytest.fixture
def budget_broker(tmp_path):
    b = BrokerThread(tmp_path, v1_port=0, v1_partitions=1, v1_consume_max_bytes=100).start()
    yield b
    b.stop()


def test_consume_stops_at_the_byte_budget_and_a_client_pages_through(budget_broker):
    topic = unique("budget")
    values = [f"{i:02d}" + "v" * 28 for i in range(10)]  # each record is `N:` + 30 bytes

    async def main():
        async with await connect(budget_broker) as c:
            for value in values:
                await c.produce(topic, "k", value)
            first = await c.raw(f"V1|1|CONSUME|{topic} 0 0")
            assert len(first.split("messages=", 1)[1].split(" hw=")[0]) <= 100
            got, offset = [], 0
            while offset < 10:
                batch = await c.consume(topic, 0, offset)
                assert 1 <= len(batch["messages"]) <= 3 and batch["hw"] == 10
                got.extend(batch["messages"])
                offset = batch["messages"][-1][0] + 1
            assert got == list(enumerate(values))
    run(main())


def test_record_larger_than_the_budget_is_reported_and_skippable(budget_broker):
    topic = unique("too-large")

    async def main():
        async with await connect(budget_broker) as c:
            await c.produce(topic, "k", "small")
            await c.produce(topic, "k", "x" * 150)
            await c.produce(topic, "k", "after")
            assert (await c.consume(topic, 0, 0))["messages"] == [(0, "small")]  # stops before it
            response = await c.raw(f"V1|5|CONSUME|{topic} 0 1")
            assert response.startswith("V1|5|ERR|RECORD_TOO_LARGE|offset=1 bytes=150 budget=100:"), response
            with pytest.raises(V1Error) as info:
                await c.consume(topic, 0, 1)
            assert info.value.offset == 1
            assert (await c.consume(topic, 0, info.value.offset + 1))["messages"] == [(2, "after")]
    run(main())


def _produce_compressed(broker, topic: str, payloads: list[bytes], compression=CompressionType.ZSTD) -> None:
    """Pulsar-produce to partition 0 of V1 topic `topic` (one entry per payload)."""
    full = f"persistent://public/default/{topic}"
    if broker.call(broker.broker.core.partitioned_count, full) is None:
        broker.call(broker.broker.create_partitioned_topic, full, 1)

    async def main():
        async with Client(broker.url) as client:
            producer = await client.create_producer(f"{topic}-partition-0", compression_type=compression,
                                                    batching_enabled=False)
            for data in payloads:
                await producer.send(data)
            await producer.close()
    run(main())


@pytest.fixture
def bomb_broker(tmp_path):
    b = BrokerThread(tmp_path, v1_port=0, v1_partitions=1).start()  # the default budget, 8 MiB
    yield b
    b.stop()


def test_compressed_entries_that_expand_hugely_keep_memory_bounded(bomb_broker):
    """The issue's reproduction: compressed entries that decompress to 64 MiB each. Their
    declared size is checked before anything is decompressed, so memory stays flat."""
    topic = unique("bomb")
    ask1(bomb_broker, f"V1|1|PRODUCE|{topic} k:first")
    bomb = bytes(64 * 1024 * 1024)
    _produce_compressed(bomb_broker, topic, [bomb] * 4)
    del bomb

    async def main():
        async with await connect(bomb_broker) as c:
            assert (await c.consume(topic, 0, 0))["messages"] == [(0, "first")]
            for offset in range(1, 5):
                with pytest.raises(V1Error) as info:
                    await c.consume(topic, 0, offset)
                assert info.value.code == "RECORD_TOO_LARGE" and info.value.offset == offset
            assert await c.ping() == "PONG"
    tracemalloc.start()
    try:
        run(main())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024, f"peak {peak} bytes"


def test_consume_within_the_budget_keeps_memory_to_a_few_budgets(bomb_broker):
    topic = unique("big")
    block = 3 * 1024 * 1024
    _produce_compressed(bomb_broker, topic, [bytes([65 + i]) * block for i in range(4)])

    async def main():
        async with await connect(bomb_broker) as c:
            first = await c.consume(topic, 0, 0)
            assert [offset for offset, _ in first["messages"]] == [0, 1]  # two of 3 MiB fit in 8 MiB
            assert first["messages"][1][1] == "B" * block
            rest = await c.consume(topic, 0, 2)
            assert [offset for offset, _ in rest["messages"]] == [2, 3]
    tracemalloc.start()
    try:
        run(main())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * BrokerSettings().v1_consume_max_bytes, f"peak {peak} bytes"


def test_pulsar_port_answers_while_a_big_entry_decompresses(bomb_broker, monkeypatch):
    """Held on its worker thread until the Pulsar round trip is done: were decompression on
    the event loop, the Pulsar port could not answer before the release."""
    topic = unique("offloop")
    _produce_compressed(bomb_broker, topic, [b"z" * (2 * 1024 * 1024)])
    started, release = threading.Event(), threading.Event()
    real_render = v1_module._render

    def held_render(*args):
        started.set()
        release.wait(60)
        return real_render(*args)
    monkeypatch.setattr(v1_module, "_render", held_render)

    async def main():
        async with await connect(bomb_broker) as c:
            consuming = asyncio.ensure_future(c.consume(topic, 0, 0))
            assert await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
            try:
                async with Client(bomb_broker.url, operation_timeout_seconds=30) as client:
                    producer = await client.create_producer(unique("meanwhile"))
                    await producer.send(b"served while V1 decompresses")
                assert not consuming.done()
            finally:
                release.set()
            batch = await consuming
            assert batch["messages"] == [(0, "z" * (2 * 1024 * 1024))]
    run(main())


def test_corrupt_record_is_reported_and_skippable(bomb_broker):
    topic = unique("corrupt")
    ask(bomb_broker, f"V1|1|PRODUCE|{topic} k:good")

    def append_garbage():
        from pulsarwire import codec
        from pulsarwire._proto import PulsarApi_pb2 as pb
        md = pb.MessageMetadata(producer_name="garbage", sequence_id=0, publish_time=1, compression=pb.ZSTD,
                                uncompressed_size=10)
        log = bomb_broker.broker.core.topic(f"persistent://public/default/{topic}-partition-0")
        log.append(codec.encode_metadata_and_payload(md, b"not zstd at all"), None, 1, None, 1, "garbage", 0)
        bomb_broker.broker.core.commit()
    bomb_broker.call(append_garbage)
    ask1(bomb_broker, f"V1|2|PRODUCE|{topic} k:later")
    assert ask(bomb_broker, f"V1|3|CONSUME|{topic} 0 0") == ["V1|3|OK|messages=0:good hw=3"]
    response = ask1(bomb_broker, f"V1|4|CONSUME|{topic} 0 1")
    assert response.startswith("V1|4|ERR|CORRUPT_RECORD|offset=1:"), response
    assert ask1(bomb_broker, f"V1|5|CONSUME|{topic} 0 2") == "V1|5|OK|messages=2:later hw=3"


# --- additions: V1 and Pulsar on one broker -----------------------------------------------

def test_v1_produce_to_a_non_partitioned_pulsar_topic_is_refused(tmp_path):
    """The hijack: a V1 PRODUCE used to re-register such a topic as partitioned, and Pulsar
    readers then saw 1 message of 100. Refused before and after a restart (when the topic
    is only on disk), and the Pulsar readers still see all 100."""
    broker = BrokerThread(tmp_path, v1_port=0).start()
    topic = unique("pulsar-owned")

    async def read_all():
        async with Client(broker.url) as client:
            reader = await client.create_reader(topic, MessageId.earliest)
            got = []
            while await reader.has_message_available():
                got.append((await reader.read_next(10000)).data())
            return got

    async def produce():
        async with Client(broker.url) as client:
            producer = await client.create_producer(topic)
            for i in range(100):
                await producer.send(b"%d" % i)
    expected = [b"%d" % i for i in range(100)]
    try:
        run(produce())
        for attempt in range(2):
            for request in (f"PRODUCE|{topic} k:v", f"PRODUCE|{topic} k:v acks=all", f"CONSUME|{topic} 0 0",
                            f"JOIN|g {topic} c", f"SET_PARTITION_ROLE|{topic} 0 follower",
                            f"REPLICA_FETCH|{topic} 0 1 0"):
                response = ask1(broker, f"V1|1|{request}")
                assert is_error(response, "1", "BAD_REQUEST") and "non-partitioned" in response, response
            assert run(read_all()) == expected
            assert not os.path.exists(tmp_path / "topics.json")  # nothing registered as partitioned
            broker.restart()
        assert run(read_all()) == expected
    finally:
        broker.stop()


def test_v1_topic_names_a_partition_is_refused(broker):
    topic = unique("parted")
    broker.call(broker.broker.create_partitioned_topic, f"persistent://public/default/{topic}", 2)
    for request in (f"PRODUCE|{topic}-partition-0 k:v", f"CONSUME|{topic}-partition-0 0 0",
                    f"JOIN|g {topic}-partition-1 c", f"SET_PARTITION_ROLE|{topic}-partition-0 0 leader"):
        assert is_error(ask1(broker, f"V1|1|{request}"), "1", "BAD_REQUEST"), request

    async def main():  # the Pulsar side still writes to its partition
        async with Client(broker.url) as client:
            producer = await client.create_producer(f"{topic}-partition-0")
            await producer.send(b"still mine")
    run(main())
    assert ask1(broker, f"V1|2|CONSUME|{topic} 0 0") == "V1|2|OK|messages=0:still mine hw=1"


def test_v1_uses_a_pulsar_partitioned_topic_with_its_own_partition_count(broker):
    topic = unique("pulsar-parted")
    broker.call(broker.broker.create_partitioned_topic, f"persistent://public/default/{topic}", 5)
    partitions = {produced(broker, topic, f"key{i}", f"value-{i}")["partition"] for i in range(40)}
    assert partitions == set(range(5))
    assert ask1(broker, f"V1|1|CONSUME|{topic} 4 0").startswith("V1|1|OK|messages=")
    assert is_error(ask1(broker, f"V1|2|CONSUME|{topic} 5 0"), "2", "BAD_REQUEST")

    async def main():
        async with Client(broker.url) as client:
            consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
            got = {(await consumer.receive(10000)).data() for _ in range(40)}
            assert got == {b"value-%d" % i for i in range(40)}
            producer = await client.create_producer(f"{topic}-partition-0")
            await producer.send(b"from-pulsar")
    run(main())
    records = parse_payload(payload(ask1(broker, f"V1|3|CONSUME|{topic} 0 0")))["messages"]
    assert records[-1][1] == "from-pulsar"


def test_v1_produce_to_a_terminated_partition_is_refused(broker):
    topic = unique("terminated")
    full = f"persistent://public/default/{topic}"
    broker.call(broker.broker.create_partitioned_topic, full, 1)
    produced(broker, topic, "k", "before")
    broker.call(broker.broker.terminate_topic, f"{full}-partition-0")
    assert is_error(ask1(broker, f"V1|1|PRODUCE|{topic} k:after"), "1", "BAD_REQUEST")
    assert ask1(broker, f"V1|2|CONSUME|{topic} 0 0") == "V1|2|OK|messages=0:before hw=1"


def test_values_pulsar_wrote_are_one_line_and_batches_share_their_offset(broker):
    topic = unique("from-pulsar")
    ask1(broker, f"V1|1|PRODUCE|{topic} k:v1")  # creates the V1 topic
    partition = 0

    async def main():
        async with Client(broker.url) as client:
            plain = await client.create_producer(f"{topic}-partition-{partition}", batching_enabled=False)
            await plain.send(b"a|b\nc\r")
            await plain.send(b"\xff\xfeok")
            batched = await client.create_producer(f"{topic}-partition-{partition}", batching_max_messages=3,
                                                   batching_max_publish_delay_ms=10000)
            receipts = [await batched.send_async(b"b%d" % i) for i in range(3)]  # one batch of three
            await asyncio.gather(*receipts)
    run(main())
    records = parse_payload(payload(ask1(broker, f"V1|2|CONSUME|{topic} {partition} 0")))["messages"]
    tail = records[-5:]
    first = tail[0][0]
    assert tail == [(first, "a\ufffdb\ufffdc\ufffd"), (first + 1, "\ufffd\ufffdok"),
                    (first + 2, "b0"), (first + 2, "b1"), (first + 2, "b2")]


# --- the client ------------------------------------------------------------------------

def test_client_payload_parsing():
    assert parse_payload("partition=1 offset=2 hw=3") == {"partition": 1, "offset": 2, "hw": 3}
    assert parse_payload("messages= hw=0") == {"messages": [], "hw": 0}
    assert parse_payload("messages=0:a,1:b hw=2") == {"messages": [(0, "a"), (1, "b")], "hw": 2}
    # no escaping: a comma starts a record only before an offset in order
    assert parse_payload("messages=4:x,y,5:z,1:w hw=6") == {"messages": [(4, "x,y"), (5, "z,1:w")], "hw": 6}
    assert parse_payload("replica=1 acked_offset=2 hw=2 isr=[0,1] under_replicated=false") == \
        {"replica": 1, "acked_offset": 2, "hw": 2, "isr": [0, 1], "under_replicated": False}
    assert parse_payload("topic=42 partition=0 role=leader hw=0") == \
        {"topic": "42", "partition": 0, "role": "leader", "hw": 0}
    assert parse_payload("heartbeat=ok") == {"heartbeat": "ok"}
    assert parse_payload("left=true") == {"left": True}
    assert parse_payload("committed=true") == {"committed": True}


def test_client_refuses_arguments_the_protocol_cannot_carry(broker):
    async def main():
        async with await connect(broker) as c:
            for call in (c.produce("t", "k", "two words"), c.produce("t", "a:b", "v"), c.produce("t|x", "k", "v"),
                         c.produce("t", "k", "v", acks="ALL"), c.join("g", "t", ""), c.heartbeat("g", "t", "c d", 1)):
                with pytest.raises(ValueError):
                    await call
            assert await c.ping() == "PONG"  # nothing half-sent
    run(main())


def test_client_calls_match_the_spec(broker):
    topic, group = unique("client"), unique("g")

    async def main():
        async with await connect(broker) as c:
            placed = await c.produce(topic, "user1", "created", acks=1)
            assert (await c.consume(topic, placed["partition"], 0)) == {"messages": [(0, "created")], "hw": 1}
            member = await c.join(group, topic, "c1", assignor="range")
            assert member == {"generation": 1, "assigned": [0, 1, 2]}
            assert await c.sync(group, topic, "c1", 1) == member
            assert await c.heartbeat(group, topic, "c1", 1) == {"heartbeat": "ok"}
            assert await c.commit(group, topic, "c1", 1, placed["partition"], 1) == {"committed": True}
            assert await c.offset(group, topic, placed["partition"]) == 1
            assert await c.leave(group, topic, "c1", 1) == {"left": True}
            assert await c.set_partition_role(topic, 0, "leader") == \
                {"topic": topic, "partition": 0, "role": "leader", "hw": 1 if placed["partition"] == 0 else 0}
            fetched = await c.replica_fetch(topic, placed["partition"], 1, 1)
            assert fetched == {"replica": 1, "acked_offset": 1, "hw": 1, "isr": [0, 1], "under_replicated": True}
    run(main())


# --- additions: each connection reads a partition ahead for itself ------------------------

def test_connections_consuming_one_partition_at_different_offsets_each_read_ahead(tmp_path):
    """Past the entry cache, each connection's CONSUMEs of a partition read through a reader of
    its own (TopicLog.reader): two connections at different offsets each read runs, rather than
    turning each other's reads into single records; a closed connection gives its buffers back."""
    b = BrokerThread(tmp_path, v1_port=0, v1_partitions=1, max_cache_bytes=1 << 16).start()
    try:
        topic = unique("readers")
        values = [f"{i:04d}" + "v" * 5000 for i in range(400)]

        def holders():
            return b.call(b.broker.core.files.run_holders)

        async def main():
            async with await connect(b) as first, await connect(b) as second:
                for value in values:
                    await first.produce(topic, "k", value)
                got = {first: [], second: []}
                offsets = {first: 0, second: 200}
                while offsets[first] < 200:
                    for c in (first, second):
                        batch = await c.consume(topic, 0, offsets[c])
                        got[c].extend(batch["messages"])
                        offsets[c] = batch["messages"][-1][0] + 1
                assert got[first][:200] == list(enumerate(values))[:200]
                assert got[second] == list(enumerate(values))[200:200 + len(got[second])]
                readers = holders()
                assert len(readers) == 2 and readers[0] is not readers[1]
        run(main())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and holders():
            time.sleep(0.05)
        assert holders() == []
    finally:
        b.stop()


def test_a_connection_keeps_a_bounded_number_of_readers(tmp_path):
    from pulsarwire.broker.storage import FilePool, TopicLog
    pool = FilePool()
    logs = [TopicLog(str(tmp_path / str(i)), pool=pool) for i in range(v1_module.MAX_SESSION_READERS + 2)]
    session = v1_module.Session()
    readers = [session.reader(topic_log) for topic_log in logs]
    assert session.reader(logs[-1]) is readers[-1]  # the same log: the same reader
    assert len(session._readers) == v1_module.MAX_SESSION_READERS
    assert session.reader(logs[0]) is not readers[0]  # the least recently read went first
    session.close_readers()
    assert not session._readers
    for topic_log in logs:
        topic_log.close()


# --- values, arguments, lines and settings the specification leaves open (docs/v1.md) ----------

def test_produce_refuses_a_value_a_consume_reply_cannot_carry(broker):
    """A comma in a value would forge records in CONSUME's `messages=<offset:value,...>` (a client
    resuming at the forged offset + 1 would skip real records): refused, nothing stored."""
    topic = unique("forge")
    for record in ("k:x,999999:forged", "k:a,b", "k:,", "k:a\rb"):
        assert is_error(ask1(broker, f"V1|7|PRODUCE|{topic} {record}"), "7", "BAD_REQUEST"), record
    assert nothing_stored(broker, topic)
    placed = produced(broker, topic, "k", "real")
    assert ask1(broker, f"V1|8|CONSUME|{topic} {placed['partition']} 0") == "V1|8|OK|messages=0:real hw=1"


def test_a_comma_pulsar_wrote_cannot_forge_a_record(broker):
    topic = unique("forge-pulsar")
    ask1(broker, f"V1|1|PRODUCE|{topic} k:v1")  # creates the V1 topic

    async def main():
        async with Client(broker.url) as client:
            producer = await client.create_producer(f"{topic}-partition-0", batching_enabled=False)
            await producer.send(b"x,999999:forged")
    run(main())
    answer = ask1(broker, f"V1|2|CONSUME|{topic} 0 0")
    assert "999999:" not in answer.replace("\ufffd999999:", "") and ",999999:" not in answer, answer


def test_arguments_are_split_on_ascii_spaces_and_tabs_only(broker):
    topic = unique("split")
    answer = ask1(broker, f"V1|1|PRODUCE|{topic} k:東京\u3000駅")
    assert answer.startswith("V1|1|OK|"), answer
    partition = parse_payload(payload(answer))["partition"]
    assert ask1(broker, f"V1|2|CONSUME|{topic} {partition} 0") == f"V1|2|OK|messages=0:東京\u3000駅 hw=1"
    # "exactly acks=all" means exactly: a no-break space is part of the token
    assert is_error(ask1(broker, f"V1|3|PRODUCE|{topic} k:v acks=all\u00a0"), "3", "BAD_REQUEST")
    assert is_error(ask1(broker, f"V1|4|PRODUCE|{topic}\u2003k:v"), "4", "BAD_REQUEST")
    # tabs separate arguments as spaces do (docs/v1.md)
    answer = ask1(broker, f"V1|5|PRODUCE|{topic}\tk:tabbed\t acks=1")
    assert answer.startswith("V1|5|OK|"), answer


def test_a_line_cut_off_by_the_end_of_the_stream_is_not_executed(broker):
    import socket
    topic = unique("cut")
    with socket.create_connection(("127.0.0.1", broker.v1_port), timeout=10) as sock:
        sock.sendall(f"V1|1|PING|\nV1|2|PRODUCE|{topic} k:trunc".encode())
        sock.shutdown(socket.SHUT_WR)  # the client died mid-write
        answers = sock.makefile("rb").read().decode().splitlines()
    assert answers[0] == "V1|1|OK|PONG"
    assert len(answers) == 2 and is_error(answers[1], "0", "BAD_REQUEST"), answers
    assert nothing_stored(broker, topic)


def test_min_insync_replicas_above_the_replication_factor_is_refused(tmp_path):
    from pulsarwire.broker.server import Broker
    for replication_factor, min_insync in ((1, 2), (3, 4), (2, 0)):
        with pytest.raises(ValueError, match="min_insync_replicas"):
            Broker(str(tmp_path / "b"), replication_factor=replication_factor, min_insync_replicas=min_insync)
    assert not os.path.exists(tmp_path / "b")  # refused before anything was opened
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "pulsarwire", "broker", "--data-dir", str(tmp_path / "c"),
                           "--port", "0", "--v1-port", "0", "--replication-factor", "1",
                           "--min-insync-replicas", "2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "--min-insync-replicas" in done.stderr and "--replication-factor" in done.stderr, done.stderr


# --- additions: no lock-out by connections that never become established (docs/v1.md) ------------

def _silent(port: int):
    import socket
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _first_line(sock) -> bytes:
    sock.settimeout(5)
    return sock.makefile("rb").readline()


def test_connections_per_client_address_are_limited(tmp_path):
    b = BrokerThread(tmp_path, v1_port=0, v1_max_connections_per_address=3).start()
    try:
        held = [_silent(b.v1_port) for _ in range(3)]
        with _silent(b.v1_port) as extra:
            line = _first_line(extra)
            assert line.startswith(b"V1|0|ERR|TOO_MANY_CONNECTIONS|") and b"one address" in line, line
        held.pop().close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b.call(lambda: sum(b.broker.v1.per_address.values())) > 2:
            time.sleep(0.02)
        with _silent(b.v1_port) as again:  # the place given back is free again
            again.sendall(b"V1|1|PING|\n")
            assert _first_line(again) == b"V1|1|OK|PONG\n"
        for s in held:
            s.close()
    finally:
        b.stop()


def test_silent_connections_cannot_take_the_places_kept_for_established_ones(tmp_path):
    b = BrokerThread(tmp_path, v1_port=0, max_connections=8).start()  # 2 kept for established connections
    try:
        async def main():
            async with await connect(b) as working:  # established: it sent a valid request
                silent = [_silent(b.v1_port) for _ in range(6)]
                try:
                    with _silent(b.v1_port) as seventh:
                        line = _first_line(seventh)
                        assert line.startswith(b"V1|0|ERR|TOO_MANY_CONNECTIONS|"), line
                        assert b"kept for established" in line
                    assert await working.ping() == "PONG"
                    stats = b.call(b.broker.v1.stats)
                    assert stats["connections"] == 7 and stats["pending_connections"] == 6
                finally:
                    for s in silent:
                        s.close()
        run(main())
    finally:
        b.stop()


def test_wrong_tokens_are_answered_late_without_blocking_the_broker(tmp_path):
    b = BrokerThread(tmp_path, v1_port=0, auth_tokens={"secret"}).start()
    try:
        b.broker.v1.auth_failure_delay = 0.6
        import socket
        with _silent(b.v1_port) as guess:
            guess.sendall(b"V1|1|AUTH|guess\n")

            async def meanwhile():
                async with await connect(b, token="secret") as other:
                    return await other.ping()
            assert run(meanwhile()) == "PONG"  # served while the guess waits
            guess.settimeout(0.3)
            with pytest.raises(socket.timeout):
                guess.recv(100)  # not answered yet
            guess.settimeout(5)
            assert guess.makefile("rb").readline() == b"V1|1|ERR|UNAUTHORIZED|authentication failed\n"
        assert b.call(b.broker.v1.stats)["auth_failures"] == 1
    finally:
        b.stop()


# --- additions: pipelined PRODUCEs share one group commit and one write -----------------------------

def test_v1_records_carry_the_metadata_pulsar_would_encode():
    from pulsarwire._proto import PulsarApi_pb2 as pb
    cases = [(0, 1, b""), (127, 1 << 41, b"k"), (1 << 20, 1_700_000_000_123, b"x" * 300)]
    cases += [(value, value, b"k" * (value % 20000)) for value in (128, 16383, 16384, (1 << 21) - 1, 1 << 21,
                                                                   (1 << 28) - 1, 1 << 28, (1 << 63) - 1)]
    for sequence_id, publish_time, key in cases:
        md = pb.MessageMetadata(producer_name="", sequence_id=sequence_id, publish_time=publish_time)
        if key:
            md.partition_key = key.decode()
        expected = md.SerializeToString()
        body = v1_module.v1_entry_body(sequence_id, publish_time, key, b"value")
        assert body == len(expected).to_bytes(4, "big") + expected + b"value"


def test_pipelined_produces_are_acknowledged_only_once_written(tmp_path):
    """Many PRODUCE lines answered as one group: a failed group commit answers INTERNAL_ERROR for
    each of its records (none acknowledged), and every acknowledged record is readable."""
    from ..helpers import FillingDisk
    disk = FillingDisk()
    b = BrokerThread(tmp_path, v1_port=0, v1_partitions=2, file_ops=disk).start()
    try:
        topic = unique("group")
        import socket
        with socket.create_connection(("127.0.0.1", b.v1_port), timeout=10) as s, s.makefile("rb") as reader:
            s.sendall(f"V1|0|PRODUCE|{topic} a:first\n".encode())  # creates the topic
            assert reader.readline().startswith(b"V1|0|OK|")
            disk.room = 0
            s.sendall(b"".join(b"V1|%d|PRODUCE|%s k%d:v%d\n" % (i, topic.encode(), i, i) for i in range(1, 201)))
            failed = [reader.readline() for _ in range(200)]
            assert all(b"|ERR|INTERNAL_ERROR|" in line for line in failed), failed[:3]
            disk.room = None
            s.sendall(b"".join(b"V1|%d|PRODUCE|%s k%d:w%d acks=%d\n" % (i, topic.encode(), i, i, i % 2)
                               for i in range(201, 401)))
            acked = [reader.readline().decode() for _ in range(200)]
        assert all(line.startswith(f"V1|{i}|OK|") for i, line in zip(range(201, 401), acked)), acked[:3]
        stored = {}
        for line in acked:
            placed = parse_payload(line.rstrip("\n").split("|", 3)[3])
            stored.setdefault(placed["partition"], []).append(placed["offset"])

        async def main():
            async with await connect(b) as c:
                for partition, offsets in stored.items():
                    got, offset = [], 0
                    while True:
                        batch = await c.consume(topic, partition, offset)
                        if not batch["messages"]:
                            break
                        got.extend(batch["messages"])
                        offset = got[-1][0] + 1
                    values = dict(got)
                    assert all(values[o].startswith("w") for o in offsets)  # each acknowledged record is there
                    assert not any(v.startswith("v") for v in values.values())  # no failed one is
        run(main())
    finally:
        b.stop()


# --- additions: what V1 replies nobody reads may hold (issue 32) ----------------------------------

def _slow_reader(port: int, lines: bytes):
    import socket
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # what is not read stays in the broker
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    try:
        s.sendall(lines)
    except BlockingIOError:
        pass  # the broker stopped reading: its input budget is full
    return s


def _partition_of_30_kb(port: int, topic: str) -> int:
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s, s.makefile("rb") as reader:
        s.sendall(b"".join(b"V1|%d|PRODUCE|%s k:%s\n" % (i, topic.encode(), b"v" * 1000) for i in range(30)))
        replies = [reader.readline() for _ in range(30)]
    return parse_payload(replies[-1].decode().rstrip("\n").split("|", 3)[3])["partition"]


def test_unsent_replies_of_all_connections_are_capped_and_honest_clients_still_served(tmp_path):
    cap, budget = 256 * 1024, 64 * 1024
    b = BrokerThread(tmp_path, v1_port=0, max_output_bytes=budget, v1_max_total_output_bytes=cap,
                     frame_timeout=60.0).start()
    try:
        topic = unique("cap")
        partition = _partition_of_30_kb(b.v1_port, topic)
        requests = b"".join(b"V1|%d|CONSUME|%s %d 0\n" % (i, topic.encode(), partition) for i in range(200))
        readers = [_slow_reader(b.v1_port, requests) for _ in range(10)]  # 10 budgets: 640 KiB > the cap
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not b.call(b.broker.v1.stats)["output_cap_waits"]:
                time.sleep(0.05)
            time.sleep(0.5)
            stats = b.call(b.broker.v1.stats)
            assert stats["output_cap_waits"] >= 1
            assert stats["peak_output_bytes"] <= cap + 40 * 1024, stats  # the cap and one reply over it
            assert stats["output_bytes"] <= cap + 40 * 1024, stats
            assert ask1(b, "V1|7|PING|") == "V1|7|OK|PONG"  # holding no unsent replies, it is answered
        finally:
            for s in readers:
                s.close()
    finally:
        b.stop()


def test_a_slow_reader_holds_what_its_input_and_output_budgets_say(tmp_path):
    """Pipelined short lines cost their bytes (kept as received until answered), not a Python
    object each: one client pipelining 3 MiB of CONSUME lines without reading holds about its
    output budget, one reply and the 2 MiB of lines waiting."""
    budget = 64 * 1024
    b = BrokerThread(tmp_path, v1_port=0, max_output_bytes=budget, frame_timeout=60.0).start()
    try:
        topic = unique("slow")
        partition = _partition_of_30_kb(b.v1_port, topic)
        line = b"V1|1|CONSUME|%s %d 0\n" % (topic.encode(), partition)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            s = _slow_reader(b.v1_port, line * (3 * 1024 * 1024 // len(line)))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not b.call(b.broker.v1.stats)["input_pauses"]:
                time.sleep(0.05)
            time.sleep(0.5)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        s.close()
        # output budget + one reply + 2 MiB of lines + one read's worth (256 KiB) and its lines split
        # (as line objects the same 2 MiB held 6.7 MB)
        assert held < budget + 40 * 1024 + v1_module.MAX_QUEUED_LINES_BYTES + 1024 * 1024, held
    finally:
        b.stop()


def test_consume_shows_as_is_only_entries_exactly_as_v1_writes_them():
    from pulsarwire._proto import PulsarApi_pb2 as pb
    def plain(body):
        start = v1_module._plain_v1_value_start(body)
        return None if start < 0 else body[start:]
    assert plain(v1_module.v1_entry_body(5, 1_700_000_000_000, b"key", b"value")) == b"value"
    assert plain(v1_module.v1_entry_body(5, 1, b"k" * 200, "東京".encode())) == "東京".encode()
    assert plain(v1_module.v1_entry_body(5, 1, b"", b"")) == b""
    for value in (b"a,b", b"a|b", b"a\nb", b"a\rb", b"\xff"):  # shown through the general path (U+FFFD)
        assert plain(v1_module.v1_entry_body(5, 1, b"k", value)) is None
    # the same leading fields with anything after them (a batch, compression), as a Pulsar client may write
    for extra in (pb.MessageMetadata(num_messages_in_batch=2), pb.MessageMetadata(compression=pb.ZSTD)):
        md = pb.MessageMetadata(producer_name="", sequence_id=5, publish_time=1, partition_key="k")
        md.MergeFrom(extra)
        raw = md.SerializeToString()
        assert plain(len(raw).to_bytes(4, "big") + raw + b"payload") is None
    assert plain(b"\x00\x00") is None
    # the finding is kept with the (cached) entry: other connections reuse it
    from pulsarwire.broker.storage import Entry
    entry = Entry(7, v1_module.v1_entry_body(7, 1, b"k", b"value"), 0, 1, 1)
    assert v1_module._plain_v1_record(entry) == b"7:value" and entry.plain_value_start > 0
    other = Entry(8, v1_module.v1_entry_body(8, 1, b"k", b"a,b"), 0, 1, 1)
    assert v1_module._plain_v1_record(other) is None and other.plain_value_start == -1


def test_consume_replies_parsed_in_bulk_read_as_piece_by_piece():
    import random
    from pulsarwire import v1client
    rng = random.Random(30)
    for _ in range(3000):
        body = "".join(rng.choice(["0", "1", "2", "9", "10", ":", ",", "a", "05", "+1", "\u0663"])
                       for _ in range(rng.randrange(12)))
        hw = rng.choice([None, 0, 2, 11])
        try:
            expected = v1client._records_one_by_one(body, hw)
        except V1Error:
            with pytest.raises(V1Error):
                v1client._records(body, hw)
            continue
        assert v1client._records(body, hw) == expected, (body, hw)
    assert v1client._records("1:a,0:b,2:c", 3) == [(1, "a,0:b"), (2, "c")]  # out of order: part of a value
    assert v1client._records("0:a,1:b,3:c", 3) == [(0, "a"), (1, "b,3:c")]  # at or past hw: the same
    assert v1client._records("0:a,01:b,1:c:d", 3) == [(0, "a,01:b"), (1, "c:d")]
    body = ",".join(f"{i}:v{i}" for i in range(1000))
    assert v1client._records(body, 1000) == [(i, f"v{i}") for i in range(1000)]


def test_records_of_the_common_produce_path_carry_their_metadata(broker):
    from pulsarwire.broker.entries import entry_metadata
    topic = unique("fast-md")
    lines = [f"V1|{i}|PRODUCE|{topic} {key}:v{i}" for i, key in enumerate(["k", "k", "", "東京" * 70, "k"])]
    answers = ask(broker, *lines)  # the first creates the topic; the rest take the common path
    for i, answer in enumerate(answers):
        placed = parse_payload(payload(answer))
        full = f"persistent://public/default/{topic}-partition-{placed['partition']}"
        entry = broker.call(lambda: broker.broker.core.topics[full].log.read(placed["offset"]))
        md = entry_metadata(entry)
        key = lines[i].split(" ")[1].split(":")[0]
        assert (md.producer_name, md.sequence_id, md.partition_key) == ("", placed["offset"], key)
        assert md.publish_time > 0 and bytes(entry.body).endswith(b"v%d" % i)


def test_a_group_of_produces_across_new_segments_is_stored_whole_and_in_order(tmp_path):
    b = BrokerThread(tmp_path, v1_port=0, v1_partitions=1, segment_bytes=4096).start()  # ~25 records a segment
    try:
        topic = unique("segments")
        import socket
        with socket.create_connection(("127.0.0.1", b.v1_port), timeout=10) as s, s.makefile("rb") as reader:
            s.sendall(b"".join(b"V1|%d|PRODUCE|%s k:%s-%d\n" % (i, topic.encode(), b"v" * 100, i) for i in range(600)))
            answers = [reader.readline().decode() for _ in range(600)]
        offsets = [parse_payload(a.rstrip("\n").split("|", 3)[3])["offset"] for a in answers]
        assert offsets == list(range(600)), answers[:3]

        async def main():
            async with await connect(b) as c:
                got, offset = [], 0
                while offset < 600:
                    batch = await c.consume(topic, 0, offset)
                    got.extend(batch["messages"])
                    offset = got[-1][0] + 1
                assert got == [(i, f"{'v' * 100}-{i}") for i in range(600)]
        run(main())
    finally:
        b.stop()


def test_the_common_produce_path_sees_partitions_added_meanwhile(broker):
    topic = unique("grow")
    keys = [f"k{i}" for i in range(40)]
    before = {parse_payload(payload(a))["partition"] for a in ask(broker, *(f"V1|{i}|PRODUCE|{topic} {k}:v"
                                                                        for i, k in enumerate(keys)))}
    assert before <= set(range(PARTITIONS))
    broker.call(broker.broker.create_partitioned_topic, f"persistent://public/default/{topic}", PARTITIONS + 3)
    after = [parse_payload(payload(a))["partition"] for a in ask(broker, *(f"V1|{i}|PRODUCE|{topic} {k}:v"
                                                                       for i, k in enumerate(keys)))]
    from pulsarwire.routing import murmur3_32
    assert after == [murmur3_32(k.encode()) % (PARTITIONS + 3) for k in keys]
