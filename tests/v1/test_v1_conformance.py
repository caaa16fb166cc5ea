"""Black-box conformance suite for the V1 port, written from ../shared/reference/v1_protocol.md alone.

Each test names the sentence of the specification it checks. Where the page is silent the suite
asserts nothing beyond the page (payload shapes are matched with patterns, not the broker's words).
"""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from pulsarwire.broker import metafile
from tests.peers import BrokerThread

PRODUCE_OK = re.compile(r"^partition=(\d+) offset=(\d+) hw=(\d+)$")
CONSUME_OK = re.compile(r"^messages=((?:\d+:[^,]*)(?:,\d+:[^,]*)*)? hw=(\d+)$")
ASSIGNED_OK = re.compile(r"^generation=(\d+) assigned=\[((?:\d+(?:,\d+)*)?)\]$")
REPLICA_OK = re.compile(r"^replica=(\d+) acked_offset=(\d+) hw=(\d+) isr=\[((?:\d+(?:,\d+)*)?)\] "
                        r"under_replicated=(true|false)$")
ERROR = re.compile(r"^V1\|([^|]*)\|ERR\|([A-Z_]+)\|(.*)$")


class V1Line:
    """One raw TCP connection to the V1 port: send a line, read the answer line."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = self.sock.makefile("rb")
        self.next_id = 1000

    def raw(self, line: str) -> str:
        self.sock.sendall(line.encode() + b"\n")
        answer = self.reader.readline()
        assert answer.endswith(b"\n"), f"no answer line to {line!r}"
        return answer.decode().rstrip("\r\n")

    def call(self, command: str, args: str = "") -> tuple[str, str]:
        """Send a request with a fresh correlation id; return ("OK", payload) or (code, message)."""
        self.next_id += 1
        cid = str(self.next_id)
        answer = self.raw(f"V1|{cid}|{command}|{args}")
        fields = answer.split("|")
        assert fields[0] == "V1" and fields[1] == cid, answer
        if fields[2] == "OK":
            assert len(fields) in (3, 4), answer
            return "OK", fields[3] if len(fields) == 4 else ""
        assert fields[2] == "ERR" and len(fields) >= 5, answer
        return fields[3], "|".join(fields[4:])

    def ok(self, command: str, args: str = "") -> str:
        status, payload = self.call(command, args)
        assert status == "OK", f"{command} {args}: {status} {payload}"
        return payload

    def error(self, command: str, args: str) -> str:
        status, _ = self.call(command, args)
        assert status != "OK", f"{command} {args} succeeded"
        return status

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def parse_assigned(payload: str) -> tuple[int, list[int]]:
    match = ASSIGNED_OK.match(payload)
    assert match, payload
    return int(match.group(1)), [int(p) for p in match.group(2).split(",") if p]


def parse_replica(payload: str) -> dict:
    match = REPLICA_OK.match(payload)
    assert match, payload
    return {"replica": int(match.group(1)), "acked_offset": int(match.group(2)), "hw": int(match.group(3)),
            "isr": [int(r) for r in match.group(4).split(",") if r],
            "under_replicated": match.group(5) == "true"}


def parse_consume(payload: str) -> tuple[list[tuple[int, str]], int]:
    match = CONSUME_OK.match(payload)
    assert match, payload
    records = []
    if match.group(1):
        for item in match.group(1).split(","):
            offset, value = item.split(":", 1)
            records.append((int(offset), value))
    return records, int(match.group(2))


def produce(conn: V1Line, topic: str, record: str, acks: str | None = None) -> tuple[int, int, int]:
    payload = conn.ok("PRODUCE", f"{topic} {record}" + (f" acks={acks}" if acks else ""))
    match = PRODUCE_OK.match(payload)
    assert match, payload
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def start_broker(data_dir, **options) -> BrokerThread:
    settings = dict(port=0, v1_port=0, replication_timeout=0.3, replica_lag_time=30.0, session_timeout=30.0)
    settings.update(options)
    return BrokerThread(data_dir, **settings).start()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """Defaults of the broker's replication settings (3 replicas, 2 in sync), 3 V1 partitions."""
    running = start_broker(tmp_path_factory.mktemp("v1conf"), v1_partitions=3, replication_factor=3,
                           min_insync_replicas=2)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One V1 partition per topic, so every record lands on partition 0."""
    running = start_broker(tmp_path_factory.mktemp("v1conf1"), v1_partitions=1, replication_factor=3,
                           min_insync_replicas=2)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    """As `single`, with a replication timeout no loaded machine reaches: an acks=all PRODUCE
    waits for as long as its follower may take to report."""
    running = start_broker(tmp_path_factory.mktemp("v1conf-patient"), v1_partitions=1, replication_factor=3,
                           min_insync_replicas=2, replication_timeout=30.0)
    yield running
    running.stop()


@pytest.fixture
def conn(broker):
    line = V1Line(broker.v1_port)
    yield line
    line.close()


@pytest.fixture
def conn1(single):
    line = V1Line(single.v1_port)
    yield line
    line.close()


# --- Envelope -------------------------------------------------------------------------------------

def test_example_ping_with_trailing_bar(conn):
    # "Commands with no args must still include a trailing |, for example: V1|99|PING|"
    assert conn.raw("V1|99|PING|").startswith("V1|99|OK")


def test_example_produce(conn):
    # "V1|42|PRODUCE|orders user1:created" -> "V1|<id>|OK|partition=<n> offset=<n> hw=<n>"
    answer = conn.raw("V1|42|PRODUCE|orders user1:created")
    assert re.match(r"^V1\|42\|OK\|partition=\d+ offset=\d+ hw=\d+$", answer), answer


def test_example_produce_acks_all_without_followers_times_out(conn):
    # "V1|43|PRODUCE|orders user1:created acks=all": min ISR (2) cannot be met with no follower
    answer = conn.raw("V1|43|PRODUCE|orders user1:created acks=all")
    match = ERROR.match(answer)
    assert match and match.groups()[:2] == ("43", "REPLICATION_TIMEOUT"), answer


@pytest.mark.parametrize("line", [
    "V1|7|PING",                    # three sections (no trailing bar)
    "V1|7|PING|x|y",                # five sections
    "V1|7",                         # two sections
    "garbage",                      # one section
    "",                             # empty line
    "V2|7|PING|",                   # another version
    "v1|7|PING|",                   # the version token is exactly V1
    " V1|7|PING|",
    "|7|PING|",                     # empty version
    "V1||PING|",                    # empty correlation id
    "V1|7||",                       # empty command
    "V1|7||orders 0 0",
])
def test_unparseable_request_answers_correlation_id_zero(conn, line):
    # "If a request cannot be parsed, the broker responds with correlation id 0: V1|0|ERR|BAD_REQUEST|..."
    answer = conn.raw(line)
    assert answer.startswith("V1|0|ERR|BAD_REQUEST|"), answer
    assert conn.raw("V1|8|PING|").startswith("V1|8|OK")   # the connection still serves


def test_undecodable_request_answers_correlation_id_zero(conn):
    conn.sock.sendall(b"V1|7|PRODUCE|orders k:\xff\xfe\n")
    assert conn.reader.readline().decode().startswith("V1|0|ERR|BAD_REQUEST|")
    assert conn.raw("V1|8|PING|").startswith("V1|8|OK")


def test_unparseable_request_executes_nothing(conn1):
    conn1.raw("V1|1|PRODUCE|envtopic k:v|extra")
    conn1.raw("V2|1|PRODUCE|envtopic k:v")
    records, _ = parse_consume(conn1.ok("CONSUME", "envtopic 0 0"))
    assert records == []


@pytest.mark.parametrize("cid", ["1", "0", "abc", "x-y_z.9", "18446744073709551616"])
def test_correlation_id_is_echoed(conn, cid):
    assert conn.raw(f"V1|{cid}|PING|").startswith(f"V1|{cid}|OK")
    assert conn.raw(f"V1|{cid}|NOPE|").startswith(f"V1|{cid}|ERR|UNKNOWN_COMMAND|")
    assert conn.raw(f"V1|{cid}|CONSUME|orders").startswith(f"V1|{cid}|ERR|BAD_REQUEST|")


@pytest.mark.parametrize("command", ["NOPE", "FETCH", "PRODUCEX", "V1"])
def test_unknown_command(conn, command):
    # "UNKNOWN_COMMAND | unsupported command"
    assert conn.error(command, "orders 0 0") == "UNKNOWN_COMMAND"


def test_error_response_has_five_sections(conn):
    answer = conn.raw("V1|5|CONSUME|orders x 0")
    fields = answer.split("|")
    assert fields[:4] == ["V1", "5", "ERR", "BAD_REQUEST"] and len(fields) == 5 and fields[4], answer


def test_pipelined_requests_are_answered_in_order(conn):
    conn.sock.sendall(b"".join(f"V1|p{i}|PING|\n".encode() for i in range(20)))
    for i in range(20):
        assert conn.reader.readline().decode().startswith(f"V1|p{i}|OK")


# --- PRODUCE --------------------------------------------------------------------------------------

@pytest.mark.parametrize("acks", [None, "0", "1"])
def test_produce_ack_modes_leader_success(conn, acks):
    # "acks=0: ... immediate leader success response", "acks=1: leader append acknowledgement"
    partition, offset, hw = produce(conn, "acks-modes", "k:v", acks)
    assert 0 <= partition < 3 and offset >= 0 and hw >= 0


def test_produce_offsets_are_consecutive_per_partition(conn1):
    offsets = [produce(conn1, "consecutive", f"k{i}:v{i}")[1] for i in range(5)]
    assert offsets == [0, 1, 2, 3, 4]
    assert {produce(conn1, "consecutive", "k:v")[0]} == {0}


def test_produce_partition_in_range(conn):
    for i in range(30):
        partition, _, _ = produce(conn, "spread", f"key{i}:v")
        assert 0 <= partition < 3


@pytest.mark.parametrize("args", [
    "",
    "orders",
    "orders novalue",               # "PRODUCE requires a key:value message payload"
    "orders k:v acks=2",            # "ack mode must be exactly acks=0, acks=1, or acks=all"
    "orders k:v acks=",
    "orders k:v ACKS=1",
    "orders k:v acks=All",
    "orders k:v acks=ALL",
    "orders k:v acks=01",
    "orders k:v acks",
    "orders k:v acks=1 extra",
    "orders k:v extra",
])
def test_produce_bad_args(conn, args):
    assert conn.error("PRODUCE", args) == "BAD_REQUEST"


def test_produce_bad_request_stores_nothing(conn1):
    conn1.error("PRODUCE", "badstore k:v acks=2")
    conn1.error("PRODUCE", "badstore kv")
    assert parse_consume(conn1.ok("CONSUME", "badstore 0 0"))[0] == []


# --- CONSUME --------------------------------------------------------------------------------------

def test_consume_returns_records_from_offset(conn1):
    for value in ("a", "b", "c"):
        produce(conn1, "consume-basic", f"k:{value}")
    records, hw = parse_consume(conn1.ok("CONSUME", "consume-basic 0 0"))
    assert records == [(0, "a"), (1, "b"), (2, "c")] and hw == 3
    records, hw = parse_consume(conn1.ok("CONSUME", "consume-basic 0 1"))
    assert records == [(1, "b"), (2, "c")] and hw == 3


def test_consume_payload_exact_text(conn1):
    produce(conn1, "consume-text", "user1:created")
    produce(conn1, "consume-text", "user2:paid")
    assert conn1.ok("CONSUME", "consume-text 0 0") == "messages=0:created,1:paid hw=2"


def test_consume_empty_messages(conn, conn1):
    # "(empty messages= when nothing committed at requested offset)"
    assert conn1.ok("CONSUME", "never-written 0 0") == "messages= hw=0"
    produce(conn1, "consume-end", "k:v")
    assert conn1.ok("CONSUME", "consume-end 0 1") == "messages= hw=1"
    assert conn1.ok("CONSUME", "consume-end 0 50") == "messages= hw=1"


def test_consume_value_keeps_colons(conn1):
    produce(conn1, "colons", "k:a:b")
    assert parse_consume(conn1.ok("CONSUME", "colons 0 0"))[0] == [(0, "a:b")]


@pytest.mark.parametrize("args", [
    "", "orders", "orders 0", "orders 0 0 0",
    "orders x 0", "orders 0 x", "orders 0 1.5", "orders 1e3 0", "orders 0 0x1", "orders 0 --1",
])
def test_consume_bad_args(conn, args):
    # "CONSUME ... numeric fields must be valid integers"
    assert conn.error("CONSUME", args) == "BAD_REQUEST"


# --- Groups ---------------------------------------------------------------------------------------

def test_join_first_member_gets_all_partitions(conn):
    generation, assigned = parse_assigned(conn.ok("JOIN", "g-first orders a"))
    assert generation >= 1 and assigned == [0, 1, 2]


def test_join_bumps_generation_and_sync_returns_assignment(conn):
    gen_a, _ = parse_assigned(conn.ok("JOIN", "g-sync orders a"))
    gen_b, assigned_b = parse_assigned(conn.ok("JOIN", "g-sync orders b"))
    assert gen_b > gen_a
    # "SYNC: validate generation and fetch latest assignment"
    gen, assigned_a = parse_assigned(conn.ok("SYNC", f"g-sync orders a {gen_b}"))
    assert gen == gen_b
    assert sorted(assigned_a + assigned_b) == [0, 1, 2] and not set(assigned_a) & set(assigned_b)
    assert parse_assigned(conn.ok("SYNC", f"g-sync orders b {gen_b}")) == (gen_b, assigned_b)


def members_assignment(conn, group, topic, members, assignor):
    """Join members in the given order; return {member: assigned} at the final generation."""
    for member in members:
        generation, _ = parse_assigned(conn.ok("JOIN", f"{group} {topic} {member} assignor={assignor}"))
    return {member: parse_assigned(conn.ok("SYNC", f"{group} {topic} {member} {generation}"))[1]
            for member in members}


@pytest.fixture(scope="module")
def seven(tmp_path_factory):
    running = start_broker(tmp_path_factory.mktemp("v1conf7"), v1_partitions=7)
    yield running
    running.stop()


def test_round_robin_exact(seven):
    conn = V1Line(seven.v1_port)
    assert members_assignment(conn, "g-rr", "t7", ["a", "b", "c"], "round_robin") == {
        "a": [0, 3, 6], "b": [1, 4], "c": [2, 5]}
    conn.close()


def test_range_exact(seven):
    conn = V1Line(seven.v1_port)
    assert members_assignment(conn, "g-range", "t7", ["a", "b", "c"], "range") == {
        "a": [0, 1, 2], "b": [3, 4], "c": [5, 6]}
    conn.close()


def test_range_more_members_than_partitions(conn):
    got = members_assignment(conn, "g-range4", "orders", ["a", "b", "c", "d"], "range")
    assert got == {"a": [0], "b": [1], "c": [2], "d": []}


def test_round_robin_two_members(conn):
    assert members_assignment(conn, "g-rr2", "orders", ["a", "b"], "round_robin") == {"a": [0, 2], "b": [1]}


def test_range_two_members(conn):
    assert members_assignment(conn, "g-range2", "orders", ["a", "b"], "range") == {"a": [0, 1], "b": [2]}


@pytest.mark.parametrize("args", [
    "", "g", "g orders", "g orders a assignor=sticky", "g orders a assignor=", "g orders a roundrobin",
    "g orders a assignor=RANGE", "g orders a assignor=round-robin", "g orders a assignor=range extra",
])
def test_join_bad_args(conn, args):
    # "JOIN optional assignor must be assignor=round_robin or assignor=range"
    assert conn.error("JOIN", args) == "BAD_REQUEST"


@pytest.mark.parametrize("command, args", [
    ("SYNC", "g-num orders a x"), ("HEARTBEAT", "g-num orders a x"), ("LEAVE", "g-num orders a x"),
    ("COMMIT", "g-num orders a x 0 0"), ("COMMIT", "g-num orders a 1 x 0"), ("COMMIT", "g-num orders a 1 0 x"),
    ("COMMIT", "g-num orders a 1 0 1.0"), ("OFFSET", "g-num orders x"), ("SYNC", "g-num orders a 1.0"),
    ("SYNC", "g-num orders a"), ("HEARTBEAT", "g-num orders a"), ("LEAVE", "g-num orders a"),
    ("COMMIT", "g-num orders a 1 0"), ("OFFSET", "g-num orders"), ("SYNC", "g-num orders a 1 2"),
    ("OFFSET", "g-num orders 0 0"), ("COMMIT", "g-num orders a 1 0 0 0"),
])
def test_group_numeric_fields_and_arity(conn, command, args):
    # "... SYNC, HEARTBEAT, LEAVE, COMMIT, OFFSET ... numeric fields must be valid integers"
    conn.ok("JOIN", "g-num orders a")
    assert conn.error(command, args) == "BAD_REQUEST"


def test_argument_errors_come_before_generation_checks(conn):
    # parser/argument rules first, then "COMMIT must match active member generation"
    assert conn.error("COMMIT", "g-order orders ghost 99 0 x") == "BAD_REQUEST"
    assert conn.error("SYNC", "g-order orders ghost x") == "BAD_REQUEST"


@pytest.mark.parametrize("command", ["SYNC", "HEARTBEAT", "LEAVE"])
def test_stale_generation(conn, command):
    # "GENERATION_MISMATCH | stale member generation, ..."
    group = f"g-stale-{command}"
    gen1, _ = parse_assigned(conn.ok("JOIN", f"{group} orders a"))
    gen2, _ = parse_assigned(conn.ok("JOIN", f"{group} orders b"))
    assert conn.error(command, f"{group} orders a {gen1}") == "GENERATION_MISMATCH"
    assert conn.error(command, f"{group} orders a {gen2 + 5}") == "GENERATION_MISMATCH"


@pytest.mark.parametrize("command", ["SYNC", "HEARTBEAT", "LEAVE"])
def test_unknown_member(conn, command):
    # "GENERATION_MISMATCH | ... unknown member ..."
    group = f"g-unknown-{command}"
    assert conn.error(command, f"{group} orders ghost 1") == "GENERATION_MISMATCH"    # no such group
    generation, _ = parse_assigned(conn.ok("JOIN", f"{group} orders a"))
    assert conn.error(command, f"{group} orders ghost {generation}") == "GENERATION_MISMATCH"


def test_heartbeat_ok(conn):
    generation, _ = parse_assigned(conn.ok("JOIN", "g-hb orders a"))
    assert conn.ok("HEARTBEAT", f"g-hb orders a {generation}") == "heartbeat=ok"


def test_commit_and_offset(conn):
    gen, _ = parse_assigned(conn.ok("JOIN", "g-commit orders a"))
    gen, assigned_b = parse_assigned(conn.ok("JOIN", "g-commit orders b"))
    _, assigned_a = parse_assigned(conn.ok("SYNC", f"g-commit orders a {gen}"))
    mine, theirs = assigned_a[0], assigned_b[0]
    assert conn.ok("COMMIT", f"g-commit orders a {gen} {mine} 17") == "committed=true"
    assert conn.ok("OFFSET", f"g-commit orders {mine}") == "offset=17"
    # "GENERATION_MISMATCH | ... or unassigned commit partition"
    assert conn.error("COMMIT", f"g-commit orders a {gen} {theirs} 5") == "GENERATION_MISMATCH"
    assert conn.error("COMMIT", f"g-commit orders a {gen} 99 5") == "GENERATION_MISMATCH"
    assert conn.error("COMMIT", f"g-commit orders a {gen - 1} {mine} 5") == "GENERATION_MISMATCH"
    assert conn.error("COMMIT", f"g-commit orders ghost {gen} {mine} 5") == "GENERATION_MISMATCH"
    assert conn.ok("OFFSET", f"g-commit orders {mine}") == "offset=17"       # refused commits change nothing
    assert conn.ok("COMMIT", f"g-commit orders b {gen} {theirs} 4") == "committed=true"
    assert conn.ok("OFFSET", f"g-commit orders {theirs}") == "offset=4"


def test_offset_of_a_partition_out_of_range_is_a_bad_request(conn):
    # "BAD_REQUEST | malformed envelope or invalid command args", as CONSUME answers it
    conn.ok("PRODUCE", "orders k:v")  # the topic exists
    partitions = conn.error("CONSUME", "orders 99 0")
    assert partitions == "BAD_REQUEST"
    assert conn.error("OFFSET", "g-range orders 99") == "BAD_REQUEST"
    assert conn.error("OFFSET", "g-range orders -1") == "BAD_REQUEST"
    assert conn.ok("OFFSET", "g-range orders 0") == "offset=-1"


def test_offset_without_commit_has_offset_payload(conn):
    assert re.match(r"^offset=-?\d+$", conn.ok("OFFSET", "g-never orders 0"))


def test_leave_triggers_rebalance(conn):
    conn.ok("JOIN", "g-leave orders a")
    gen, _ = parse_assigned(conn.ok("JOIN", "g-leave orders b"))
    # "LEAVE: explicitly leave group and trigger rebalance"
    assert conn.ok("LEAVE", f"g-leave orders b {gen}") == "left=true"
    assert conn.error("SYNC", f"g-leave orders a {gen}") == "GENERATION_MISMATCH"
    assert conn.error("HEARTBEAT", f"g-leave orders b {gen}") == "GENERATION_MISMATCH"
    new_gen, assigned = parse_assigned(conn.ok("JOIN", "g-leave orders a"))
    assert new_gen > gen and assigned == [0, 1, 2]
    assert parse_assigned(conn.ok("SYNC", f"g-leave orders a {new_gen}")) == (new_gen, [0, 1, 2])


def test_session_timeout_rebalances(tmp_path):
    # "HEARTBEAT: keep membership alive for session timeout"
    running = start_broker(tmp_path, v1_partitions=3, session_timeout=0.6)
    try:
        conn = V1Line(running.v1_port)
        conn.ok("JOIN", "g-session orders a")
        gen, _ = parse_assigned(conn.ok("JOIN", "g-session orders b"))
        deadline = time.monotonic() + 30         # a heartbeats, b stays silent
        rebalanced = False
        while time.monotonic() < deadline:
            status, _ = conn.call("HEARTBEAT", f"g-session orders a {gen}")
            if status == "GENERATION_MISMATCH":
                rebalanced = True
                break
            assert status == "OK"
            time.sleep(0.1)
        assert rebalanced, "the silent member was never removed"
        new_gen, assigned = parse_assigned(conn.ok("JOIN", "g-session orders a"))
        assert new_gen > gen and assigned == [0, 1, 2]
        assert conn.error("HEARTBEAT", f"g-session orders b {new_gen}") == "GENERATION_MISMATCH"
        for _ in range(8):                         # a member that keeps heartbeating stays
            assert conn.ok("HEARTBEAT", f"g-session orders a {new_gen}") == "heartbeat=ok"
            time.sleep(0.15)
        conn.close()
    finally:
        running.stop()


def test_groups_and_offsets_survive_restart(tmp_path):
    running = start_broker(tmp_path, v1_partitions=4)
    try:
        conn = V1Line(running.v1_port)
        conn.ok("JOIN", "g-durable topic-d a assignor=range")
        gen, assigned_b = parse_assigned(conn.ok("JOIN", "g-durable topic-d b"))
        _, assigned_a = parse_assigned(conn.ok("SYNC", f"g-durable topic-d a {gen}"))
        assert (assigned_a, assigned_b) == ([0, 1], [2, 3])
        conn.ok("COMMIT", f"g-durable topic-d a {gen} 1 42")
        conn.close()
        running.stop()
        # "Group metadata is persisted to groups.json under the broker data directory."
        groups = metafile.decode((tmp_path / "groups.json").read_bytes())
        text = json.dumps(groups)
        for word in ("g-durable", "topic-d", "range", '"a"', '"b"', str(gen)):
            assert word in text, (word, text)
        # "Offsets remain persisted separately in offsets.json."
        assert "42" in (tmp_path / "offsets.json").read_text()
        running.start()
        conn = V1Line(running.v1_port)
        assert parse_assigned(conn.ok("SYNC", f"g-durable topic-d a {gen}")) == (gen, [0, 1])
        assert parse_assigned(conn.ok("SYNC", f"g-durable topic-d b {gen}")) == (gen, [2, 3])
        assert conn.ok("OFFSET", "g-durable topic-d 1") == "offset=42"
        # the persisted assignor (range) still decides
        gen3, assigned_c = parse_assigned(conn.ok("JOIN", "g-durable topic-d c"))
        assert gen3 > gen and assigned_c == [3]
        assert parse_assigned(conn.ok("SYNC", f"g-durable topic-d a {gen3}")) == (gen3, [0, 1])
        conn.close()
    finally:
        running.stop()


# --- Replication ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    "t 0 0 0",          # "replica_id must be in range 1..(replication_factor-1) (0 is the leader)"
    "t 0 3 0", "t 0 -1 0", "t 0 x 0", "t x 1 0", "t 0 1 x", "t 0 1", "t 0 1 0 0", "",
])
def test_replica_fetch_bad_args(conn, args):
    assert conn.error("REPLICA_FETCH", args) == "BAD_REQUEST"


def test_replica_fetch_payload_and_isr(conn1):
    produce(conn1, "rf-basic", "k:a")
    produce(conn1, "rf-basic", "k:b")
    info = parse_replica(conn1.ok("REPLICA_FETCH", "rf-basic 0 1 2"))
    assert info == {"replica": 1, "acked_offset": 2, "hw": 2, "isr": [0, 1], "under_replicated": True}
    info = parse_replica(conn1.ok("REPLICA_FETCH", "rf-basic 0 2 2"))
    assert info == {"replica": 2, "acked_offset": 2, "hw": 2, "isr": [0, 1, 2], "under_replicated": False}


def test_consume_only_up_to_high_watermark(conn1):
    # "CONSUME returns only committed records (up to high watermark)."
    produce(conn1, "rf-hw", "k:a")
    parse_replica(conn1.ok("REPLICA_FETCH", "rf-hw 0 1 1"))
    parse_replica(conn1.ok("REPLICA_FETCH", "rf-hw 0 2 1"))
    _, offset, hw = produce(conn1, "rf-hw", "k:b", "1")
    assert offset == 1 and hw == 1                     # followers have not fetched offset 1 yet
    assert parse_consume(conn1.ok("CONSUME", "rf-hw 0 0")) == ([(0, "a")], 1)
    assert parse_consume(conn1.ok("CONSUME", "rf-hw 0 1")) == ([], 1)
    assert parse_replica(conn1.ok("REPLICA_FETCH", "rf-hw 0 1 2"))["hw"] == 1    # replica 2 still behind
    assert parse_replica(conn1.ok("REPLICA_FETCH", "rf-hw 0 2 2"))["hw"] == 2
    assert parse_consume(conn1.ok("CONSUME", "rf-hw 0 0")) == ([(0, "a"), (1, "b")], 2)


def _report_until_answered(follower: V1Line, fetch: str, worker: threading.Thread) -> None:
    """The follower reports `fetch` until the acks=all PRODUCE in `worker` is answered: a report
    that reaches the broker before the record counts only up to the log's end, so it is repeated."""
    deadline = time.monotonic() + 30
    while worker.is_alive() and time.monotonic() < deadline:
        parse_replica(follower.ok("REPLICA_FETCH", fetch))
        worker.join(0.05)


def test_acks_all_waits_for_followers(patient):
    # "acks=all: waits until partition high watermark reaches produced offset and min ISR is satisfied"
    conn = V1Line(patient.v1_port)
    parse_replica(conn.ok("REPLICA_FETCH", "rf-all 0 1 0"))
    answers = []
    worker = threading.Thread(target=lambda: answers.append(conn.call("PRODUCE", "rf-all k:v acks=all")))
    worker.start()
    follower = V1Line(patient.v1_port)
    _report_until_answered(follower, "rf-all 0 1 1", worker)
    worker.join(5)
    follower.close()
    conn.close()
    status, payload = answers[0]
    assert status == "OK", payload
    _, offset, hw = (int(x) for x in PRODUCE_OK.match(payload).groups())
    assert offset == 0 and hw >= 1


def test_acks_all_times_out_when_followers_are_silent(conn1):
    parse_replica(conn1.ok("REPLICA_FETCH", "rf-timeout 0 1 0"))
    assert conn1.error("PRODUCE", "rf-timeout k:v acks=all") == "REPLICATION_TIMEOUT"


def test_acks_all_with_min_isr_one_succeeds_alone(tmp_path):
    running = start_broker(tmp_path, v1_partitions=1, replication_factor=2, min_insync_replicas=1)
    try:
        conn = V1Line(running.v1_port)
        _, offset, hw = produce(conn, "solo", "k:v", "all")
        assert offset == 0 and hw == 1
        # replication_factor 2: replica ids are 1..1
        assert conn.error("REPLICA_FETCH", "solo 0 2 1") == "BAD_REQUEST"
        info = parse_replica(conn.ok("REPLICA_FETCH", "solo 0 1 1"))
        assert info["isr"] == [0, 1] and info["under_replicated"] is False
        conn.close()
    finally:
        running.stop()


def test_high_watermark_never_moves_back(conn1):
    # a record acknowledged with acks=all is committed: it stays below the high watermark
    parse_replica(conn1.ok("REPLICA_FETCH", "rf-mono 0 1 0"))
    produce(conn1, "rf-mono", "k:early")                   # offset 0
    assert parse_replica(conn1.ok("REPLICA_FETCH", "rf-mono 0 1 1"))["hw"] == 1
    assert parse_consume(conn1.ok("CONSUME", "rf-mono 0 0")) == ([(0, "early")], 1)
    info = parse_replica(conn1.ok("REPLICA_FETCH", "rf-mono 0 2 0"))    # a late replica reports in
    assert info["hw"] >= 1
    info = parse_replica(conn1.ok("REPLICA_FETCH", "rf-mono 0 1 0"))    # a replica reports less than before
    assert info["hw"] >= 1
    assert parse_consume(conn1.ok("CONSUME", "rf-mono 0 0")) == ([(0, "early")], 1)


def test_high_watermark_kept_for_acks_all_record(patient):
    conn = V1Line(patient.v1_port)
    parse_replica(conn.ok("REPLICA_FETCH", "rf-mono2 0 1 0"))
    answers = []
    worker = threading.Thread(target=lambda: answers.append(conn.call("PRODUCE", "rf-mono2 k:acked acks=all")))
    worker.start()
    follower = V1Line(patient.v1_port)
    _report_until_answered(follower, "rf-mono2 0 1 1", worker)
    worker.join(5)
    conn.close()
    assert answers[0][0] == "OK", answers
    parse_replica(follower.ok("REPLICA_FETCH", "rf-mono2 0 2 0"))         # replica 2 starts from scratch
    assert parse_consume(follower.ok("CONSUME", "rf-mono2 0 0")) == ([(0, "acked")], 1)
    follower.close()


def test_lagging_replica_leaves_isr(tmp_path):
    running = start_broker(tmp_path, v1_partitions=1, replica_lag_time=0.4)
    try:
        conn = V1Line(running.v1_port)
        parse_replica(conn.ok("REPLICA_FETCH", "lag 0 1 0"))
        assert parse_replica(conn.ok("REPLICA_FETCH", "lag 0 2 0"))["isr"] == [0, 1, 2]
        for _ in range(6):                                  # replica 2 keeps fetching, replica 1 is silent
            time.sleep(0.15)
            info = parse_replica(conn.ok("REPLICA_FETCH", "lag 0 2 0"))
        assert info["isr"] == [0, 2] and info["under_replicated"] is True
        conn.close()
    finally:
        running.stop()


# --- SET_PARTITION_ROLE / NOT_LEADER --------------------------------------------------------------

def test_set_partition_role_payload_and_not_leader(conn1):
    produce(conn1, "roles", "k:a")
    assert conn1.ok("SET_PARTITION_ROLE", "roles 0 follower") == "topic=roles partition=0 role=follower hw=1"
    # "PRODUCE is rejected with NOT_LEADER when the target partition is in local follower role."
    for acks in ("", " acks=0", " acks=1", " acks=all"):
        assert conn1.error("PRODUCE", f"roles k:b{acks}") == "NOT_LEADER"
    assert parse_consume(conn1.ok("CONSUME", "roles 0 0")) == ([(0, "a")], 1)
    assert conn1.ok("SET_PARTITION_ROLE", "roles 0 leader") == "topic=roles partition=0 role=leader hw=1"
    assert produce(conn1, "roles", "k:c")[1] == 1


def test_not_leader_only_for_the_follower_partition(conn):
    partition, _, _ = produce(conn, "roles3", "user1:x")
    other = (partition + 1) % 3
    conn.ok("SET_PARTITION_ROLE", f"roles3 {other} follower")
    assert produce(conn, "roles3", "user1:y")[0] == partition
    conn.ok("SET_PARTITION_ROLE", f"roles3 {partition} follower")
    assert conn.error("PRODUCE", "roles3 user1:z") == "NOT_LEADER"


@pytest.mark.parametrize("args", [
    "t 0 Leader", "t 0 FOLLOWER", "t 0 boss", "t 0", "t 0 leader extra", "t x leader", "", "t 0 leader,",
])
def test_set_partition_role_bad_args(conn, args):
    # "SET_PARTITION_ROLE role must be exactly leader or follower"
    assert conn.error("SET_PARTITION_ROLE", args) == "BAD_REQUEST"


def test_replica_behind_committed_records_does_not_satisfy_acks_all(conn1):
    # "acks=all: waits until ... min ISR is satisfied": a replica that holds none of the records
    # committed while the leader was alone does not make a second copy of a new one
    produce(conn1, "rf-behind", "k:a")                                   # leader alone: committed
    parse_replica(conn1.ok("REPLICA_FETCH", "rf-behind 0 1 0"))          # replica 1 holds nothing
    assert conn1.error("PRODUCE", "rf-behind k:b acks=all") == "REPLICATION_TIMEOUT"
    info = parse_replica(conn1.ok("REPLICA_FETCH", "rf-behind 0 1 2"))  # caught up: now in sync
    assert info["isr"] == [0, 1] and info["hw"] == 2
    assert parse_consume(conn1.ok("CONSUME", "rf-behind 0 0")) == ([(0, "a"), (1, "b")], 2)


def test_acks_all_succeeds_once_a_silent_replica_leaves_the_isr(tmp_path):
    # min ISR 2 of 3: replica 1 keeps up, replica 2 goes silent and leaves the ISR after the lag
    # time; the high watermark then reaches the record with two in sync
    running = start_broker(tmp_path, v1_partitions=1, replica_lag_time=0.4, replication_timeout=3.0)
    try:
        conn = V1Line(running.v1_port)
        parse_replica(conn.ok("REPLICA_FETCH", "shrink 0 1 0"))
        assert parse_replica(conn.ok("REPLICA_FETCH", "shrink 0 2 0"))["isr"] == [0, 1, 2]
        answers = []
        worker = threading.Thread(target=lambda: answers.append(conn.call("PRODUCE", "shrink k:v acks=all")))
        worker.start()
        follower = V1Line(running.v1_port)
        started = time.monotonic()
        while worker.is_alive() and time.monotonic() - started < 2.5:
            parse_replica(follower.ok("REPLICA_FETCH", "shrink 0 1 1"))
            time.sleep(0.1)
        worker.join(5)
        assert answers and answers[0][0] == "OK", answers
        info = parse_replica(follower.ok("REPLICA_FETCH", "shrink 0 1 1"))
        assert info["isr"] == [0, 1] and info["hw"] == 1 and info["under_replicated"] is True
        follower.close()
        conn.close()
    finally:
        running.stop()


def start_cli_broker(data_dir, *flags: str) -> tuple[subprocess.Popen, int]:
    """`python -m pulsarwire broker` on free ports; the process and its V1 port (from the banner)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", str(data_dir), "--port", "0", "--v1-port", "0",
         *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    banner = process.stdout.readline()
    match = re.search(r"V1 on 127\.0\.0\.1:(\d+)", banner)
    if not match:
        process.kill()
        process.wait(10)
        raise AssertionError(f"no V1 port in {banner!r}")
    return process, int(match.group(1))


def test_cli_broker_serves_v1(tmp_path):
    process, port = start_cli_broker(tmp_path, "--v1-partitions", "1", "--replication-factor", "2",
                                     "--min-insync-replicas", "1")
    try:
        conn = V1Line(port)
        assert conn.raw("V1|42|PRODUCE|orders user1:created") == "V1|42|OK|partition=0 offset=0 hw=1"
        assert conn.raw("V1|43|PRODUCE|orders user1:created acks=all") == "V1|43|OK|partition=0 offset=1 hw=2"
        assert conn.raw("V1|44|CONSUME|orders 0 0") == "V1|44|OK|messages=0:created,1:created hw=2"
        assert conn.raw("V1|45|REPLICA_FETCH|orders 0 1 2") == \
            "V1|45|OK|replica=1 acked_offset=2 hw=2 isr=[0,1] under_replicated=false"
        conn.close()
    finally:
        process.terminate()
        process.wait(10)


def test_acknowledged_state_survives_kill_9(tmp_path):
    # "Group metadata is persisted to groups.json", "Offsets remain persisted separately in offsets.json"
    flags = ("--v1-partitions", "2")
    process, port = start_cli_broker(tmp_path, *flags)
    try:
        conn = V1Line(port)
        partition, offset, _ = produce(conn, "crash", "k:kept")
        conn.ok("JOIN", "g-crash crash a assignor=range")
        generation, assigned = parse_assigned(conn.ok("JOIN", "g-crash crash b"))
        conn.ok("COMMIT", f"g-crash crash b {generation} {assigned[0]} 7")
        conn.close()
    finally:
        process.kill()
        process.wait(10)
    process, port = start_cli_broker(tmp_path, *flags)
    try:
        conn = V1Line(port)
        assert (offset, "kept") in parse_consume(conn.ok("CONSUME", f"crash {partition} 0"))[0]
        assert conn.ok("OFFSET", f"g-crash crash {assigned[0]}") == "offset=7"
        assert parse_assigned(conn.ok("SYNC", f"g-crash crash b {generation}")) == (generation, assigned)
        assert parse_assigned(conn.ok("SYNC", f"g-crash crash a {generation}")) == (generation, [0])
        conn.close()
    finally:
        process.terminate()
        process.wait(10)


def test_argument_rules_come_before_the_partition_role(conn1):
    # "Handlers then enforce command-specific argument rules" - before the NOT_LEADER state check
    produce(conn1, "order-role", "k:v")
    conn1.ok("SET_PARTITION_ROLE", "order-role 0 follower")
    assert conn1.error("PRODUCE", "order-role k:v acks=2") == "BAD_REQUEST"
    assert conn1.error("PRODUCE", "order-role kv") == "BAD_REQUEST"
    assert conn1.error("PRODUCE", "order-role k:v") == "NOT_LEADER"
    conn1.ok("SET_PARTITION_ROLE", "order-role 0 leader")


def test_refused_join_creates_no_member(conn):
    assert conn.error("JOIN", "g-refused orders a assignor=sticky") == "BAD_REQUEST"
    assert conn.error("SYNC", "g-refused orders a 1") == "GENERATION_MISMATCH"
    assert conn.error("HEARTBEAT", "g-refused orders a 1") == "GENERATION_MISMATCH"
    generation, assigned = parse_assigned(conn.ok("JOIN", "g-refused orders a"))
    assert assigned == [0, 1, 2]
    assert conn.error("JOIN", "g-refused orders b assignor=RANGE") == "BAD_REQUEST"
    assert parse_assigned(conn.ok("SYNC", f"g-refused orders a {generation}")) == (generation, [0, 1, 2])


def test_join_again_keeps_generation_or_moves_forward(conn):
    gen1, assigned1 = parse_assigned(conn.ok("JOIN", "g-again orders a"))
    gen2, assigned2 = parse_assigned(conn.ok("JOIN", "g-again orders a"))
    assert gen2 >= gen1 and assigned2 == assigned1 == [0, 1, 2]
    assert conn.ok("HEARTBEAT", f"g-again orders a {gen2}") == "heartbeat=ok"
