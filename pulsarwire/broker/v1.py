"""The V1 text protocol: a small partitioned, replicated log on the broker's own storage.

One request per line, one response per line:

    V1|<correlation_id>|<command>|<args>        args separated by spaces
    V1|<id>|OK[|<payload>]
    V1|<id>|ERR|<code>|<message>
    V1|0|ERR|BAD_REQUEST|...                    for a line that does not parse

V1 topic `t` with N partitions is the broker's partitioned topic
`persistent://public/default/t`; partition p is its `-partition-p` log and an
offset is an entry id, so Pulsar clients and V1 clients read the same data.
Replicas are the followers 1..replication_factor-1 that REPLICA_FETCH; the
leader (replica 0) is always in the ISR and the high watermark is the lowest
offset acknowledged by every ISR member.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field

from .. import codec
from .._proto import PulsarApi_pb2 as pb
from ..routing import murmur3_32
from .core import BrokerCore
from .storage import read_json, write_json
from .topics import entry_metadata

log = logging.getLogger("pulsarwire.broker.v1")

MAX_LINE = 1024 * 1024
MAX_CONSUME = 100
ASSIGNORS = ("round_robin", "range")


class V1Error(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bad(message: str) -> V1Error:
    return V1Error("BAD_REQUEST", message)


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _bad(f"{what} must be an integer, got {text!r}") from None


def _list(values) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


@dataclass
class PartitionState:
    role: str = "leader"
    replicas: dict[int, tuple[int, float]] = field(default_factory=dict)  # id -> (acked, fetched at)
    waiters: list = field(default_factory=list)


class V1Server:
    def __init__(self, core: BrokerCore, *, partitions: int, replication_factor: int, min_insync_replicas: int,
                 replication_timeout: float, replica_lag_time: float, session_timeout: float) -> None:
        if replication_factor < 1:
            raise ValueError("replication_factor must be at least 1")
        self.core = core
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.min_insync = min(min_insync_replicas, replication_factor)
        self.replication_timeout = replication_timeout
        self.replica_lag_time = replica_lag_time
        self.session_timeout = session_timeout
        self.state: dict[tuple[str, int], PartitionState] = {}
        self.groups_path = os.path.join(core.data_dir, "groups.json")
        self.offsets_path = os.path.join(core.data_dir, "offsets.json")
        self.groups: dict = read_json(self.groups_path, {})
        self.offsets: dict = read_json(self.offsets_path, {})
        now = time.monotonic()
        for group in self.groups.values():  # members get a fresh session after a restart
            for member in group["members"].values():
                member["seen"] = now
        self._server: asyncio.AbstractServer | None = None
        self._round_robin = 0
        self._commands = {
            "PING": self.ping, "PRODUCE": self.produce, "CONSUME": self.consume, "JOIN": self.join,
            "SYNC": self.sync, "HEARTBEAT": self.heartbeat, "LEAVE": self.leave, "COMMIT": self.commit,
            "OFFSET": self.offset, "REPLICA_FETCH": self.replica_fetch,
            "SET_PARTITION_ROLE": self.set_partition_role,
        }

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_LINE)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self._save()

    # connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as exc:
                    if exc.partial.strip():
                        writer.write(await self.handle_line(exc.partial))
                    break
                except asyncio.LimitOverrunError:
                    writer.write(b"V1|0|ERR|BAD_REQUEST|line longer than %d bytes\n" % MAX_LINE)
                    break
                writer.write(await self.handle_line(line))
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - already gone
                pass

    async def handle_line(self, raw: bytes) -> bytes:
        """One request line in, one response line out (never raises)."""
        try:
            text = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            return b"V1|0|ERR|BAD_REQUEST|request is not UTF-8\n"
        parts = text.split("|", 3)
        if len(parts) < 3 or parts[0] != "V1" or not parts[1].isdigit() or not parts[2]:
            return f"V1|0|ERR|BAD_REQUEST|expected V1|<correlation_id>|<command>|<args>: {text[:80]!r}\n".encode()
        correlation, command = parts[1], parts[2]
        args = parts[3].split() if len(parts) == 4 else []
        handler = self._commands.get(command)
        try:
            if handler is None:
                raise V1Error("UNKNOWN_COMMAND", f"unknown command {command!r}")
            payload = await handler(args)
        except V1Error as exc:
            return f"V1|{correlation}|ERR|{exc.code}|{exc.message}\n".encode()
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the connection
            log.exception("V1 %s failed", command)
            return f"V1|{correlation}|ERR|BAD_REQUEST|{type(exc).__name__}: {exc}\n".encode()
        return (f"V1|{correlation}|OK\n" if payload is None else f"V1|{correlation}|OK|{payload}\n").encode()

    # topics and replication

    def _full_name(self, topic: str) -> str:
        if not topic or "|" in topic:
            raise _bad(f"invalid topic {topic!r}")
        return topic if "://" in topic else f"persistent://public/default/{topic}"

    def _partition_count(self, topic: str, create: bool) -> int:
        full = self._full_name(topic)
        count = self.core.partitioned_count(full)
        if count is None:
            if full in self.core.topics:
                return 1
            if not create:
                raise _bad(f"unknown topic {topic!r}")
            self.core.create_partitioned_topic(full, self.partitions)
            count = self.partitions
        return count

    def _log_topic(self, topic: str, partition: int, create: bool = False):
        count = self._partition_count(topic, create)
        if not 0 <= partition < count:
            raise _bad(f"partition {partition} out of range 0..{count - 1}")
        full = self._full_name(topic)
        name = full if full in self.core.topics and self.core.partitioned_count(full) is None \
            else f"{full}-partition-{partition}"
        return self.core.topic(name)

    def _state(self, topic: str, partition: int) -> PartitionState:
        key = (self._full_name(topic), partition)
        state = self.state.get(key)
        if state is None:
            state = self.state[key] = PartitionState()
        return state

    def _isr(self, state: PartitionState) -> list[int]:
        now = time.monotonic()
        return [0] + sorted(r for r, (_, seen) in state.replicas.items()
                            if now - seen <= self.replica_lag_time)

    def _hw(self, state: PartitionState, log_end: int) -> int:
        acked = [log_end] + [state.replicas[r][0] for r in self._isr(state) if r != 0]
        return min(acked)

    def _wake(self, state: PartitionState, log_end: int) -> None:
        hw = self._hw(state, log_end)
        isr_size = len(self._isr(state))
        for waiter in list(state.waiters):
            offset, future = waiter
            if hw > offset and isr_size >= self.min_insync and not future.done():
                future.set_result(None)
                state.waiters.remove(waiter)

    # commands

    async def ping(self, args):
        return "PONG"

    async def produce(self, args):
        if len(args) < 2:
            raise _bad("PRODUCE <topic> <key>:<value> [acks=0|1|all]")
        acks = "1"
        if len(args) > 2 and args[-1].startswith("acks="):
            acks = args.pop()[5:]
        if acks not in ("0", "1", "all"):
            raise _bad(f"acks must be 0, 1 or all, got {acks!r}")
        record = " ".join(args[1:])
        if ":" not in record:
            raise _bad("record must be <key>:<value>")
        key, value = record.split(":", 1)
        topic = args[0]
        count = self._partition_count(topic, create=True)
        if key:
            partition = murmur3_32(key.encode()) % count
        else:
            partition = self._round_robin % count
            self._round_robin += 1
        state = self._state(topic, partition)
        if state.role != "leader":
            raise V1Error("NOT_LEADER", f"{topic}/{partition} is a follower")
        log_topic = self._log_topic(topic, partition)
        md = pb.MessageMetadata(producer_name="v1", sequence_id=log_topic.log.next_entry_id,
                                publish_time=int(time.time() * 1000))
        if key:
            md.partition_key = key
        body = codec.encode_metadata_and_payload(md, value.encode())
        offset = log_topic.append(body, None, md.publish_time, None, 1, "v1", md.sequence_id)
        self.core.commit()  # written before it is acknowledged
        log_end = log_topic.log.next_entry_id
        self._wake(state, log_end)
        if acks == "all":
            future = asyncio.get_running_loop().create_future()
            waiter = (offset, future)
            state.waiters.append(waiter)
            self._wake(state, log_end)
            try:
                await asyncio.wait_for(future, self.replication_timeout)
            except asyncio.TimeoutError:
                if waiter in state.waiters:
                    state.waiters.remove(waiter)
                raise V1Error("REPLICATION_TIMEOUT",
                              f"offset {offset} not replicated to {self.min_insync} in-sync replicas "
                              f"within {self.replication_timeout}s") from None
        return f"partition={partition} offset={offset} hw={self._hw(state, log_topic.log.next_entry_id)}"

    async def consume(self, args):
        if len(args) != 3:
            raise _bad("CONSUME <topic> <partition> <offset>")
        topic, partition, offset = args[0], _int(args[1], "partition"), _int(args[2], "offset")
        if offset < 0:
            raise _bad("offset must not be negative")
        log_topic = self._log_topic(topic, partition)
        state = self._state(topic, partition)
        hw = self._hw(state, log_topic.log.next_entry_id)
        records = []
        position = max(offset, log_topic.log.first_entry_id)
        while position < hw and len(records) < MAX_CONSUME:
            entry = log_topic.log.read(position)
            md = entry_metadata(entry)
            size = int.from_bytes(entry.body[:4], "big")
            payload = codec.decompress_payload(md, memoryview(entry.body)[4 + size:])
            for message in codec.split_messages(md, payload):
                records.append(f"{position}:{message.data().decode('utf-8', 'replace')}")
            position += 1
        return f"messages={','.join(records)} hw={hw}"

    async def replica_fetch(self, args):
        if len(args) != 4:
            raise _bad("REPLICA_FETCH <topic> <partition> <replica_id> <offset>")
        topic, partition = args[0], _int(args[1], "partition")
        replica, offset = _int(args[2], "replica_id"), _int(args[3], "offset")
        if not 1 <= replica < self.replication_factor:
            raise _bad(f"replica_id must be in 1..{self.replication_factor - 1}")
        if offset < 0:
            raise _bad("offset must not be negative")
        log_topic = self._log_topic(topic, partition)
        state = self._state(topic, partition)
        if state.role != "leader":
            raise V1Error("NOT_LEADER", f"{topic}/{partition} is a follower")
        log_end = log_topic.log.next_entry_id
        acked = min(offset, log_end)
        state.replicas[replica] = (acked, time.monotonic())
        self._wake(state, log_end)
        isr = self._isr(state)
        return (f"replica={replica} acked_offset={acked} hw={self._hw(state, log_end)} isr={_list(isr)} "
                f"under_replicated={'true' if len(isr) < self.replication_factor else 'false'}")

    async def set_partition_role(self, args):
        if len(args) != 3 or args[2] not in ("leader", "follower"):
            raise _bad("SET_PARTITION_ROLE <topic> <partition> leader|follower")
        partition = _int(args[1], "partition")
        self._log_topic(args[0], partition, create=True)
        state = self._state(args[0], partition)
        state.role = args[2]
        if state.role == "follower":
            for _, future in state.waiters:
                if not future.done():
                    future.set_exception(V1Error("NOT_LEADER", "partition became a follower"))
            state.waiters.clear()
        return f"role={state.role}"

    # consumer groups

    def _group(self, name: str) -> dict:
        group = self.groups.get(name)
        if group is None:
            raise V1Error("GENERATION_MISMATCH", f"unknown group {name!r}")
        return group

    def _rebalance(self, group: dict) -> None:
        group["generation"] += 1
        members = sorted(group["members"])
        count = self._partition_count(group["topic"], create=True)
        assignment: dict[str, list[int]] = {m: [] for m in members}
        if members:
            if group["assignor"] == "range":
                per, extra = divmod(count, len(members))
                start = 0
                for i, m in enumerate(members):
                    size = per + (1 if i < extra else 0)
                    assignment[m] = list(range(start, start + size))
                    start += size
            else:
                for p in range(count):
                    assignment[members[p % len(members)]].append(p)
        group["assignment"] = assignment
        self._save()

    def _assignment_payload(self, group: dict, member: str) -> str:
        return f"generation={group['generation']} assigned={_list(group['assignment'].get(member, []))}"

    async def join(self, args):
        if len(args) not in (3, 4):
            raise _bad("JOIN <group> <topic> <consumer_id> [assignor=round_robin|range]")
        name, topic, member = args[:3]
        assignor = "round_robin"
        if len(args) == 4:
            if not args[3].startswith("assignor=") or args[3][9:] not in ASSIGNORS:
                raise _bad("assignor must be round_robin or range")
            assignor = args[3][9:]
        self._partition_count(topic, create=True)
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = {"topic": topic, "assignor": assignor, "generation": 0,
                                         "members": {}, "assignment": {}}
        elif group["topic"] != topic:
            raise _bad(f"group {name!r} consumes {group['topic']!r}, not {topic!r}")
        new_member = member not in group["members"]
        group["members"][member] = {"seen": time.monotonic()}
        if new_member or assignor != group["assignor"]:
            group["assignor"] = assignor
            self._rebalance(group)
        return self._assignment_payload(group, member)

    def _member(self, group: dict, member: str) -> dict:
        found = group["members"].get(member)
        if found is None:
            raise V1Error("GENERATION_MISMATCH", f"{member!r} is not a member; JOIN again")
        return found

    async def sync(self, args):
        if len(args) != 2:
            raise _bad("SYNC <group> <consumer_id>")
        group = self._group(args[0])
        self._member(group, args[1])["seen"] = time.monotonic()
        return self._assignment_payload(group, args[1])

    async def heartbeat(self, args):
        if len(args) != 3:
            raise _bad("HEARTBEAT <group> <consumer_id> <generation>")
        group = self._group(args[0])
        self._member(group, args[1])["seen"] = time.monotonic()
        generation = _int(args[2], "generation")
        if generation != group["generation"]:
            raise V1Error("GENERATION_MISMATCH",
                          f"generation {generation} is stale; current is {group['generation']}: SYNC")
        return f"generation={generation}"

    async def leave(self, args):
        if len(args) != 2:
            raise _bad("LEAVE <group> <consumer_id>")
        group = self._group(args[0])
        self._member(group, args[1])
        del group["members"][args[1]]
        self._rebalance(group)
        return f"generation={group['generation']}"

    async def commit(self, args):
        if len(args) != 6:
            raise _bad("COMMIT <group> <topic> <partition> <offset> <consumer_id> <generation>")
        name, topic = args[0], args[1]
        partition, offset = _int(args[2], "partition"), _int(args[3], "offset")
        member, generation = args[4], _int(args[5], "generation")
        if offset < 0:
            raise _bad("offset must not be negative")
        group = self._group(name)
        if group["topic"] != topic:
            raise _bad(f"group {name!r} consumes {group['topic']!r}")
        self._member(group, member)["seen"] = time.monotonic()
        if generation != group["generation"]:
            raise V1Error("GENERATION_MISMATCH",
                          f"generation {generation} is stale; current is {group['generation']}")
        if partition not in group["assignment"].get(member, []):
            raise V1Error("GENERATION_MISMATCH", f"partition {partition} is not assigned to {member!r}")
        self.offsets.setdefault(name, {}).setdefault(topic, {})[str(partition)] = offset
        self._save()
        return f"offset={offset}"

    async def offset(self, args):
        if len(args) != 3:
            raise _bad("OFFSET <group> <topic> <partition>")
        partition = _int(args[2], "partition")
        committed = self.offsets.get(args[0], {}).get(args[1], {}).get(str(partition), -1)
        return f"offset={committed}"

    # housekeeping

    def tick(self) -> None:
        """Expire members whose session timed out, and let ISR changes release waiters."""
        now = time.monotonic()
        for group in self.groups.values():
            expired = [m for m, info in group["members"].items() if now - info["seen"] > self.session_timeout]
            for member in expired:
                log.info("member %s of a group timed out", member)
                del group["members"][member]
            if expired:
                self._rebalance(group)
        for (full, partition), state in self.state.items():
            if state.waiters:
                topic = self.core.topics.get(f"{full}-partition-{partition}") or self.core.topics.get(full)
                if topic is not None:
                    self._wake(state, topic.log.next_entry_id)

    def _save(self) -> None:
        groups = {name: dict(g, members={m: {} for m in g["members"]}) for name, g in self.groups.items()}
        write_json(self.groups_path, groups)
        write_json(self.offsets_path, self.offsets)
