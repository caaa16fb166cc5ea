"""The V1 text protocol front end, as /work/shared/reference/v1_protocol.md specifies it.

One request per line, one response per line:

    V1|<correlation_id>|<command>|<args>     exactly four sections; args separated by ASCII spaces and tabs
    V1|<id>|OK[|<payload>]
    V1|<id>|ERR|<code>|<message>
    V1|0|ERR|BAD_REQUEST|...                 for a line that does not parse

A V1 topic `t` with N partitions is the broker's partitioned topic
`persistent://public/default/t`; partition p is its `-partition-p` log and an
offset is an entry id, so Pulsar clients and V1 clients read the same data.
V1 never writes to a non-partitioned Pulsar topic nor to a single partition by
its own name. Replicas are the followers 1..replication_factor-1 that
REPLICA_FETCH; the leader (replica 0) is always in the ISR, a replica is in it
while it fetches and holds everything committed, and the high watermark is the
lowest offset acknowledged by every ISR member (it never moves back).

Additive to the specification (its compatibility policy allows new commands;
payloads may grow): the commands PING and AUTH, and the error codes
UNAUTHORIZED, RECORD_TOO_LARGE, CORRUPT_RECORD, INTERNAL_ERROR and TOO_MANY_CONNECTIONS.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import hmac
import logging
import os
import re
import socket
import struct
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

from .. import codec, compression
from .._proto import PulsarApi_pb2 as pb
from ..errors import CodecError
from ..reads import tune_reads
from ..routing import murmur3_32
from .core import PARTITION_MARKER, BrokerCore, InvalidTopicName, close_transport
from . import metafile
from .settings import BrokerSettings
from .storage import CommitBatch, Entry, LogReader, StorageError, TopicLog, crc32c
from .entries import entry_metadata
from .topic import Topic

log = logging.getLogger("pulsarwire.broker.v1")

MAX_LINE = 1024 * 1024  # longest request line
MAX_QUEUED_LINES_BYTES = 2 * MAX_LINE  # complete request lines waiting for their answer before reading stops
# After the error that closes a connection still sending (a line over MAX_LINE), its input is read
# and dropped for at most this long and this much, the error sent and the stream shut (FIN): a
# socket closed with unread input resets, and the reset destroys the error before the client reads it.
LINGER_SECONDS = 2.0
LINGER_BYTES = 4 * MAX_LINE
MAX_LINGERING = 64  # connections lingering at once, broker-wide; past that they close at once
OUTPUT_CHECK_INTERVAL = 0.02  # seconds between measures of what is unsent while connections wait for the cap
AUTH_FAILURE_DELAY = 1.0  # seconds before a wrong token is answered (and its connection closed)
# Of max_connections, this share is kept for established connections (authenticated, or on a broker
# without tokens having sent a valid request): new ones cannot take it, so silent ones cannot lock out
# the clients already working.
ESTABLISHED_SHARE = 4  # a quarter
try:  # bytes a socket's kernel send queue holds (Linux): a client reading behind it makes progress
    import fcntl
    import termios
    _OUTQ: int | None = termios.TIOCOUTQ
except (ImportError, AttributeError):
    _OUTQ = None
MAX_CONSUME_ENTRIES = 1000  # entries one CONSUME reply reads at most
MAX_SESSION_READERS = 8  # partitions a connection reads ahead in at once (least recently read first out)
MAX_WAITS_PER_REQUEST = 4  # times one request waits for its topic to be created or opened before it fails
OFF_LOOP_BYTES = 256 * 1024  # compressed entries larger than this decompress on a worker thread
PRODUCER_NAME = ""  # V1 records' producer name: no Pulsar producer can have it (the broker names unnamed ones), so V1 never shares dedup state with one
DEFAULT_NAMESPACE = "persistent://public/default/"

# Error codes: the specification's five, then the additive ones.
BAD_REQUEST = "BAD_REQUEST"
UNKNOWN_COMMAND = "UNKNOWN_COMMAND"
REPLICATION_TIMEOUT = "REPLICATION_TIMEOUT"
NOT_LEADER = "NOT_LEADER"
GENERATION_MISMATCH = "GENERATION_MISMATCH"
UNAUTHORIZED = "UNAUTHORIZED"  # AUTH failed, or a command before AUTH on a broker with auth
RECORD_TOO_LARGE = "RECORD_TOO_LARGE"  # CONSUME: the record at the offset exceeds the reply budget
CORRUPT_RECORD = "CORRUPT_RECORD"  # CONSUME: the record at the offset does not decode
INTERNAL_ERROR = "INTERNAL_ERROR"  # a broker fault, not the request's
TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"  # sent (id 0) to a connection over the limit, then closed

ACK_MODES = {"acks=0": "0", "acks=1": "1", "acks=all": "all"}
ASSIGNORS = {"assignor=round_robin": "round_robin", "assignor=range": "range"}
ROLES = ("leader", "follower")
USAGE = {
    "PING": "PING (no arguments)",
    "AUTH": "AUTH <token>",
    "PRODUCE": "PRODUCE <topic> <key>:<value> [acks=0 or acks=1 or acks=all]",
    "CONSUME": "CONSUME <topic> <partition> <offset>",
    "JOIN": "JOIN <group> <topic> <consumer_id> [assignor=round_robin or assignor=range]",
    "SYNC": "SYNC <group> <topic> <consumer_id> <generation>",
    "HEARTBEAT": "HEARTBEAT <group> <topic> <consumer_id> <generation>",
    "LEAVE": "LEAVE <group> <topic> <consumer_id> <generation>",
    "COMMIT": "COMMIT <group> <topic> <consumer_id> <generation> <partition> <offset>",
    "OFFSET": "OFFSET <group> <topic> <partition>",
    "REPLICA_FETCH": "REPLICA_FETCH <topic> <partition> <replica_id> <offset>",
    "SET_PARTITION_ROLE": "SET_PARTITION_ROLE <topic> <partition> leader-or-follower",
}

_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64 = (-(1 << 63), (1 << 63) - 1)
_NAME = r"[A-Za-z0-9_.=:-]+"
_SHORT_TOPIC = re.compile(_NAME)
_FULL_TOPIC = re.compile(rf"persistent://{_NAME}/{_NAME}/{_NAME}")
_MAX_FILE_NAME = 255
# Characters a value cannot carry in a CONSUME reply: newline, carriage return, the section
# separator, and the comma that separates records (the format has no escaping: a comma in a value
# followed by `<digits>:` would read as a record at an offset that does not exist).
_LINE_UNSAFE = {ord("\n"): "\ufffd", ord("\r"): "\ufffd", ord("|"): "\ufffd", ord(","): "\ufffd"}
_MESSAGE_UNSAFE = {ord("\n"): " ", ord("\r"): " ", ord("|"): "/"}  # in error messages


def check_replication(replication_factor: int, min_insync_replicas: int) -> None:
    """ValueError for settings acks=all could never meet (never weakened silently)."""
    if replication_factor < 1:
        raise ValueError("replication_factor must be at least 1")
    if not 1 <= min_insync_replicas <= replication_factor:
        raise ValueError(f"min_insync_replicas ({min_insync_replicas}) must be in 1..replication_factor "
                         f"({replication_factor}): acks=all could never be met")


class V1Error(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Produced(list):
    """A PRODUCE appended (or staged), its receipt not rendered yet: [correlation id, partition,
    offset, PartitionState, Topic, the log's CommitBatch the record belongs to (a StorageError
    when it could not be appended; None while staged)]."""
    __slots__ = ()


# answered by answer_later (so is PRODUCE acks=all); JOIN, LEAVE and COMMIT wait for their group
# change to be on disk (a batched write, off the loop)
_WAITING_COMMANDS = frozenset(("CONSUME", "AUTH", "JOIN", "LEAVE", "COMMIT"))
MAX_REMEMBERED_TOPICS = 4096  # validated PRODUCE topic names kept (then forgotten at once)
MAX_REMEMBERED_KEYS = 65536  # record keys whose hash is kept (then forgotten at once)


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x200000:
        return bytes((value & 0x7F | 0x80, (value >> 7) & 0x7F | 0x80, value >> 14))
    if value < 0x10000000:
        return bytes((value & 0x7F | 0x80, (value >> 7) & 0x7F | 0x80, (value >> 14) & 0x7F | 0x80, value >> 21))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def v1_entry_body(sequence_id: int, publish_time: int, key: bytes, value: bytes) -> bytes:
    """A V1 record as a stored entry: [u32 metadata size][MessageMetadata][value], the metadata
    encoded here (producer_name "", sequence_id, publish_time, partition_key when the key is not
    empty; field numbers 1, 2, 3, 6), as MessageMetadata.SerializeToString() would, for speed."""
    metadata = b"\n\x00\x10" + _varint(sequence_id) + b"\x18" + _varint(publish_time)
    if key:
        metadata += b"2" + _varint(len(key)) + key
    return b"".join((len(metadata).to_bytes(4, "big"), metadata, value))


# The metadata V1 writes (v1_entry_body): producer_name "", sequence_id, publish_time, and
# partition_key (its length then the key, checked apart) - nothing else (no batch, no compression).
_V1_METADATA = re.compile(rb"\n\x00\x10[\x80-\xff]{0,9}[\x00-\x7f]\x18[\x80-\xff]{0,9}[\x00-\x7f]"
                          rb"(?:2([\x00-\x7f]|[\x80-\xff][\x00-\x7f]|[\x80-\xff]{2}[\x00-\x7f]))?")


_U32_AT = struct.Struct(">I").unpack_from


def _plain_v1_value_start(body: bytes | memoryview) -> int:
    """Where the value starts in an entry whose metadata is exactly what V1 writes and whose value
    a CONSUME reply carries as it is (UTF-8 without newline, carriage return, `|` or comma); -1
    for any other entry (written by a Pulsar client, or not to be shown as it is), which _render
    handles."""
    if type(body) is not bytes:
        body = bytes(body)
    if len(body) < 4:
        return -1
    end = 4 + _U32_AT(body)[0]
    found = _V1_METADATA.match(body, 4, end)
    if found is None:
        return -1
    stop = found.end()
    if stop != end:
        key_size = found.group(1)
        if key_size is None:
            return -1
        if len(key_size) == 1:
            length = key_size[0]
        else:
            length = 0
            for shift, byte in enumerate(key_size):
                length |= (byte & 0x7F) << (7 * shift)
        if stop + length != end:
            return -1
    value = body[end:]
    if len(value.translate(None, b",\n\r|")) != len(value):  # one pass for the four
        return -1
    if not value.isascii():
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return -1
    return end


def _plain_v1_record(entry: Entry) -> bytes | None:
    """The entry's `offset:value` text when _plain_v1_value_start recognises it, else None. The
    finding is kept with the entry, so that the other connections consuming it from the entry
    cache skip the recognition."""
    start = entry.plain_value_start
    if start is None:
        start = entry.plain_value_start = _plain_v1_value_start(entry.body)
    if start < 0:
        return None
    return b"%d:%s" % (entry.entry_id, entry.body[start:])


class _TooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _bad(message: str) -> V1Error:
    return V1Error(BAD_REQUEST, message)


def _usage(command: str) -> V1Error:
    return _bad(f"usage: {USAGE[command]}")


def _show(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:60] + "...")


def _int(text: str, what: str) -> int:
    """A numeric field: an optional sign and ASCII digits, within 64 bits."""
    if not _INTEGER.fullmatch(text):
        raise _bad(f"{what} must be an integer, got {_show(text)}")
    value = int(text)
    if not _INT64[0] <= value <= _INT64[1]:
        raise _bad(f"{what} {text} does not fit in 64 bits")
    return value


def _not_negative(value: int, what: str) -> int:
    if value < 0:
        raise _bad(f"{what} must not be negative, got {value}")
    return value


def _list(values: Iterable[object]) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


def parse_request(raw: bytes) -> tuple[str, str, list[str]]:
    """(correlation id, command, args) of one request line; a V1Error when it does not parse."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad("request is not UTF-8") from None
    if text.endswith("\n"):
        text = text[:-1]
    if text.endswith("\r"):
        text = text[:-1]
    sections = text.split("|")
    if len(sections) != 4:
        raise _bad(f"a request has exactly four sections separated by a vertical bar "
                   f"(V1, correlation id, command, args), got {len(sections)}")
    version, correlation, command, args = sections
    if version != "V1":
        raise _bad(f"protocol version must be V1, got {_show(version)}")
    if not correlation:
        raise _bad("correlation id is empty")
    if not command:
        raise _bad("command is empty")
    return correlation, command, split_args(args)


def split_args(args: str) -> list[str]:
    """Arguments are separated by runs of ASCII spaces and tabs, and by nothing else: a value
    keeps every other character (U+3000, U+00A0, ...), and `acks=all\u00a0` is no ack mode."""
    if "\t" in args:
        args = args.replace("\t", " ")
    return [arg for arg in args.split(" ") if arg]


def _response(correlation: str, payload: str | list[bytes] | None) -> bytes:
    """The OK line; `payload` is None, text, or a list of byte pieces (joined once: CONSUME's are big)."""
    if payload is None:
        return f"V1|{correlation}|OK\n".encode()
    if isinstance(payload, str):
        return f"V1|{correlation}|OK|{payload}\n".encode()
    return b"".join((f"V1|{correlation}|OK|".encode(), *payload, b"\n"))


class _Waits(Exception):
    """A request that must wait for its topic to be created (on disk) or opened (off the event
    loop); `ready()` gives what to wait for, and the request is then handled again."""

    def __init__(self, ready: Callable[[], Awaitable]) -> None:
        super().__init__("waits for its topic")
        self.ready = ready


def _error(correlation: str, code: str, message: str) -> bytes:
    return f"V1|{correlation}|ERR|{code}|{message.translate(_MESSAGE_UNSAFE)}\n".encode()


def _line_safe(data: bytes | bytearray | memoryview) -> bytes:
    """A message's value as UTF-8 that fits in a V1 line (undecodable bytes and the
    characters newline, carriage return and `|` become U+FFFD)."""
    raw = bytes(data)
    if raw.isascii() and b"\n" not in raw and b"\r" not in raw and b"|" not in raw and b"," not in raw:
        return raw
    return raw.decode("utf-8", "replace").translate(_LINE_UNSAFE).encode()


def _render(offset: int, metadata: pb.MessageMetadata, payload: bytes | memoryview, room: int) -> list[bytes]:
    """The messages of the entry at `offset` as `offset:value` texts, or _TooLarge when
    they (each counted with its comma) take more than `room` bytes. Thread-safe."""
    data = codec.decompress_payload(metadata, payload, room)
    prefix = b"%d:" % offset
    records = []
    size = 0
    for message in codec.split_messages(metadata, data):
        record = prefix + _line_safe(message.data())
        size += len(record) + 1
        if size > room:
            raise _TooLarge(size)
        records.append(record)
    return records


@dataclass
class PartitionState:
    role: str = "leader"
    replicas: dict[int, tuple[int, float]] = field(default_factory=dict)  # id -> (acked, fetched at)
    hw: int = 0  # only moves forward: what was committed stays committed
    waiters: list = field(default_factory=list)  # (offset, future) of acks=all produces


class Session:
    """One V1 connection: whether it authenticated, whether to close it, and its readers of the
    partitions it consumes (so that two connections consuming one partition at different offsets
    each read ahead in order, see TopicLog.reader)."""

    __slots__ = ("authenticated", "established", "auth_failed", "close", "_readers")

    def __init__(self) -> None:
        self.authenticated = False
        self.established = False  # authenticated, or sent a valid request on a broker without tokens
        self.auth_failed = False
        self.close = False
        self._readers: collections.OrderedDict[int, LogReader] = collections.OrderedDict()

    def reader(self, topic_log: TopicLog) -> LogReader:
        """This connection's reader of `topic_log` (at most MAX_SESSION_READERS kept)."""
        key = id(topic_log)  # a log's id is its own while a reader here holds the log
        reader = self._readers.get(key)
        if reader is not None:
            self._readers.move_to_end(key)
            return reader
        reader = self._readers[key] = topic_log.reader()
        while len(self._readers) > MAX_SESSION_READERS:
            self._readers.popitem(last=False)[1].close()
        return reader

    def close_readers(self) -> None:
        while self._readers:
            self._readers.popitem()[1].close()


# TCP keep-alive on V1 connections (V1 has no per-connection heartbeat): a peer gone without a
# word (host down, cable out) is found after about KEEPALIVE_IDLE + KEEPALIVE_INTERVAL *
# KEEPALIVE_PROBES seconds of silence, rather than the system's two hours, and its place given back.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES = 60, 10, 3


def enable_keepalive(transport: asyncio.BaseTransport) -> None:
    """Turn on TCP keep-alive probes on a connection's socket (where the system has them)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                              ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError as exc:  # not a TCP socket, or the system refuses: the connection works without
        log.debug("no TCP keep-alive on a connection: %s", exc)


_CUT_LINE = object()  # in a connection's queue: its last line had no newline when the stream ended
MAX_GROUP_LINES = 1024  # lines answered as one group: one group commit, one write
GROUP_REPLY_BYTES = 64 * 1024  # a group ends once its replies pass this (records count 64 bytes each)


def _command_of(line: bytes) -> bytes:
    sections = line.split(b"|", 3)
    return sections[2] if len(sections) > 2 else b""


class V1Connection(asyncio.Protocol):
    """One V1 client: request lines in, answered one at a time and in order by a worker task.

    What it can make the broker hold is bounded: the unfinished line (MAX_LINE bytes, and
    `line_timeout` from its first byte), complete lines waiting (reading stops past
    MAX_QUEUED_LINES_BYTES), unsent replies (answering stops past `max_output_bytes` and the
    connection is closed when the client takes none of them for `line_timeout`), and the time to
    become established (`handshake_timeout`: AUTH on a broker with tokens, else a valid request).
    A limit that closes the connection first sends `V1|0|ERR|<code>|<why>`, unless the client
    reads nothing (then it is aborted). A wrong token is answered after `auth_failure_delay`."""

    def __init__(self, server: "V1Server") -> None:
        self.server = server
        self.session = Session()
        self.transport: asyncio.Transport | None = None
        self.accepted_at = time.monotonic()
        self.closed = False
        self.address: str | None = None  # the client's IP address, counted in server.per_address
        self._pending = False  # counted in server.pending (not established yet)
        self._output_counted = 0  # this connection's share of server.output_bytes
        self._unfinished = bytearray()  # the start of the next line
        self._partial_since: float | None = None  # when the unfinished line's first byte arrived
        self._input: collections.deque = collections.deque()  # complete lines as received (None: too long)
        self._lines: collections.deque = collections.deque()  # those split, not answered yet
        self._queued_bytes = 0
        self._input_ended = False  # the client shut its side, or a line was too long: answer what is queued, close
        self._reading = True
        self._writable = True
        self._blocked_since: float | None = None  # since when replies over budget wait, the client taking none
        self._blocked_bytes = 0  # unsent replies then
        self._wakeup: asyncio.Future | None = None  # what the idle worker awaits
        self._worker: asyncio.Task | None = None
        self._linger_left = -1  # closed, still reading to drop input: the bytes it may still drop

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # a server's connection: a stream transport
        self.transport = transport
        tune_reads(transport)
        server = self.server
        budget = server.max_output_bytes
        transport.set_write_buffer_limits(high=budget, low=budget // 2)
        peer = transport.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) and peer else None
        refusal = server.refusal(address)
        if refusal is not None:
            server.counters["refused_connections"] += 1
            log.warning("refusing a V1 connection from %s: %s", address, refusal)
            self.close(_error("0", TOO_MANY_CONNECTIONS, refusal))
            return
        server.connections.add(self)
        self.address = address
        server.per_address[address] += 1
        self._pending = True
        server.pending += 1
        server.watch()
        enable_keepalive(transport)
        self._worker = asyncio.ensure_future(self._answer())

    def data_received(self, data: bytes) -> None:
        if self.closed or self._input_ended:
            if self._linger_left >= 0:
                if len(data) > self._linger_left:
                    self._end_linger()
                else:
                    self._linger_left -= len(data)
            return
        unfinished = self._unfinished
        if b"\n" not in data:
            unfinished += data
            if len(unfinished) > MAX_LINE:
                self._too_long()
            elif self._partial_since is None:
                self._partial_since = time.monotonic()
            return
        if unfinished:
            data = bytes(unfinished) + data
        cut = data.rfind(b"\n") + 1
        complete, rest = data[:cut], data[cut:]
        self._unfinished = bytearray(rest)
        if cut > MAX_LINE:  # (rare: a long unfinished line ended here) may one of its lines be too long?
            lines = complete.split(b"\n")
            for i, line in enumerate(lines):
                if len(line) > MAX_LINE:
                    if i:
                        self._queue_input(b"\n".join(lines[:i]) + b"\n")
                    self._too_long()
                    return
        # kept as received, split into lines only when they are answered: a line object costs
        # about 60 bytes beside its text, more than a short request line itself
        self._queue_input(complete)
        self._partial_since = time.monotonic() if rest else None  # the unfinished line began in this data
        if len(rest) > MAX_LINE:
            self._too_long()
        self._wake()
        self._set_reading()

    def _queue_input(self, complete: bytes) -> None:
        self._input.append(complete)
        self._queued_bytes += len(complete)

    def _next_lines(self) -> None:
        """Split the oldest input received (or a marker: None, _CUT_LINE) into the lines to answer."""
        item = self._input.popleft()
        if item is None or item is _CUT_LINE:
            self._lines.append(item)
            return
        lines = item.split(b"\n")
        lines.pop()  # input ends with a newline
        self._queued_bytes -= len(item)  # split lines are one read's worth at most: not counted
        self._lines.extend(lines)

    def eof_received(self) -> bool:
        if self._linger_left >= 0:  # the client is done sending: the close can no longer reset
            self._end_linger()
            return True
        self._input_ended = True
        if self._unfinished:  # a line cut off by the end of the stream (the client died mid-write?)
            self.server.counters["cut_lines"] += 1
            self._input.append(_CUT_LINE)
        self._unfinished = bytearray()
        self._partial_since = None
        self._wake()
        return True  # keep the transport open to send the answers

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger_left >= 0:
            self._linger_left = -1
            self.server.lingering -= 1
        self._cleanup()

    def pause_writing(self) -> None:
        self._writable = False
        self._blocked_since = time.monotonic()
        self._blocked_bytes = self._unsent()
        self.server.counters["output_pauses"] += 1

    def resume_writing(self) -> None:
        self._writable = True
        self._blocked_since = None
        self._account_output()
        self._wake()

    # answering

    def _too_long(self) -> None:
        """A line over MAX_LINE: the lines before it are answered, then the error, then close."""
        self.server.counters["oversized_lines"] += 1
        self._input.append(None)
        self._unfinished = bytearray()
        self._partial_since = None
        self._input_ended = True  # nothing after it is read
        self._wake()
        self._set_reading()

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def _answer(self) -> None:
        """Answer the queued lines in order. Lines answered without waiting are taken as a group
        (up to MAX_GROUP_LINES or GROUP_REPLY_BYTES of replies): one group commit covers the
        records they append and one write sends their replies."""
        lines = self._lines
        server = self.server
        session = self.session
        loop = asyncio.get_running_loop()
        transport = self.transport
        assert transport is not None  # started by connection_made
        try:
            while not self.closed:
                if not lines and self._input:
                    self._next_lines()
                if not lines or not self._may_answer(lines[0]):
                    if self._input_ended and not lines:
                        self.close()
                        return
                    self._wakeup = loop.create_future()
                    await self._wakeup
                    continue
                line = lines[0]
                if line is None:  # the client may be sending still: its input is dropped a while
                    self.close(_error("0", BAD_REQUEST, f"request line longer than {MAX_LINE} bytes"), linger=True)
                    return
                if line is _CUT_LINE:
                    self.close(_error("0", BAD_REQUEST, "request line cut off by the end of the stream "
                                                        "(no newline): not executed"))
                    return
                answers: list = []
                size = 0
                produce_fast = server._produce_fast
                answer_now = server.answer_now
                answer: bytes | _Produced | None
                while len(answers) < MAX_GROUP_LINES and size < GROUP_REPLY_BYTES:
                    answer = produce_fast(line, session)
                    if answer is not None:
                        size += 64
                    else:
                        answer = answer_now(line, session, False)
                        if answer is None:
                            break
                        size += len(answer) if type(answer) is bytes else 64
                    lines.popleft()
                    answers.append(answer)
                    if not lines:
                        if not self._input:
                            break
                        self._next_lines()
                    line = lines[0]
                    if line is None or line is _CUT_LINE:
                        break
                if answers:
                    reply = server.finish_group(answers)
                else:  # the first line waits (CONSUME, PRODUCE acks=all, AUTH)
                    lines.popleft()
                    reply = await server.handle_line(line, session)
                    if self.closed:
                        return
                    if session.auth_failed:  # slow down token guessing, without blocking the loop
                        await asyncio.sleep(server.auth_failure_delay)
                        if self.closed:
                            return
                if self._pending and session.established:
                    self._settle_pending()
                if not self._reading:
                    self._set_reading()
                transport.write(reply)
                self._account_output()
                if session.close:
                    self.close()
                    return
                if lines or self._input:
                    await asyncio.sleep(0)  # let other connections (and both ports) in between groups
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - a fault of the broker: this connection ends, the broker goes on
            log.exception("V1 connection failed")
            self.close(_error("0", INTERNAL_ERROR, "the broker failed answering this connection"))

    def _may_answer(self, line: object) -> bool:
        """Whether the next line may be answered now: this connection's unsent replies are under
        max_output_bytes, and those of every V1 connection under max_total_output_bytes. Past the
        broker-wide cap a connection holding no unsent replies still gets small answers (so an
        honest client keeps being served), never a CONSUME."""
        if not self._writable:
            return False
        server = self.server
        if server.output_bytes <= server.max_total_output_bytes:
            return True
        self._account_output()
        if server.output_bytes <= server.max_total_output_bytes:
            return True
        if not self._output_counted and not (type(line) is bytes and _command_of(line) == b"CONSUME"):
            return True
        server.wait_for_output(self)
        return False

    def _account_output(self) -> None:
        """Count this connection's unsent replies (its transport's buffer) in the broker-wide total."""
        transport = self.transport
        size = transport.get_write_buffer_size() if transport is not None and not self.closed else 0
        counted = self._output_counted
        if size != counted:
            self._output_counted = size
            server = self.server
            server.output_bytes += size - counted
            if size < counted:
                server.output_freed()
            elif server.output_bytes > server.counters["peak_output_bytes"]:
                server.counters["peak_output_bytes"] = server.output_bytes

    def _set_reading(self) -> None:
        """Read while the lines waiting for their answers are under their budget."""
        reading = not self.closed and not self._input_ended and self._queued_bytes <= MAX_QUEUED_LINES_BYTES
        if reading != self._reading and self.transport is not None and not self.transport.is_closing():
            self._reading = reading
            if reading:
                self.transport.resume_reading()
                if self._partial_since is not None:
                    self._partial_since = time.monotonic()  # it was waiting for us, not the client for it
            else:
                if not self._input_ended:
                    self.server.counters["input_pauses"] += 1
                self.transport.pause_reading()

    # deadlines and closing

    def check_deadlines(self, now: float) -> None:
        """Close the connection whose line is too slow to arrive, whose replies the client does
        not take, or that has not authenticated in time on a broker with tokens."""
        server = self.server
        counters = server.counters
        if self._partial_since is not None and self._reading and now - self._partial_since > server.line_timeout:
            counters["line_timeouts"] += 1
            log.warning("closing a V1 connection whose request line took over %.0fs (%d bytes arrived)",
                        server.line_timeout, len(self._unfinished))
            self.close(_error("0", BAD_REQUEST, f"request line not completed within {server.line_timeout:g}s"))
        elif self._blocked_since is not None and self._took_nothing_since_blocked(now) and \
                now - self._blocked_since > server.line_timeout:
            counters["output_timeouts"] += 1
            log.warning("closing a V1 connection that took none of its replies for %.0fs (%d bytes held)",
                        server.line_timeout, self.held_bytes)
            self.close(abort=True)
        elif self._pending and not self._lines and not self._input and now - self.accepted_at > server.handshake_timeout:
            # nothing complete waits for an answer (that would be the broker's delay, not the client's)
            if server.auth_tokens is not None:
                counters["handshake_timeouts"] += 1
                log.warning("closing a V1 connection that did not AUTH within %.0fs", server.handshake_timeout)
                self.close(_error("0", UNAUTHORIZED, f"no AUTH within {server.handshake_timeout:g}s"))
            else:
                counters["idle_timeouts"] += 1
                log.warning("closing a V1 connection that sent no valid request within %.0fs",
                            server.handshake_timeout)
                self.close(_error("0", BAD_REQUEST, f"no valid request within {server.handshake_timeout:g}s"))

    def _settle_pending(self) -> None:
        self._pending = False
        self.server.pending -= 1

    def _unsent(self) -> int:
        """Reply bytes the client has not taken: the transport's buffer and the socket's send queue."""
        transport = self.transport
        if transport is None:
            return 0
        unsent = transport.get_write_buffer_size()
        sock = transport.get_extra_info("socket")
        if _OUTQ is not None and sock is not None:
            try:
                unsent += struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
            except OSError:
                pass
        return unsent

    def _took_nothing_since_blocked(self, now: float) -> bool:
        """Whether the client has taken none of its replies since output went over budget (a slow
        reader that makes progress is not timed out; it holds no more than the budget)."""
        unsent = self._unsent()
        if unsent < self._blocked_bytes:
            self._blocked_since, self._blocked_bytes = now, unsent
            return False
        return True

    def close(self, last: bytes | None = None, abort: bool = False, linger: bool = False) -> None:
        """Close after sending what is queued and `last`; `abort` drops them. A peer that does
        not read what is left within CLOSE_GRACE is aborted, so its unsent replies are freed.
        With `linger`, `last` goes out and the stream is shut (FIN), then what the client still
        sends is read and dropped (LINGER_SECONDS, LINGER_BYTES, MAX_LINGERING) before the close."""
        transport = self.transport
        server = self.server
        if linger and last is not None and not abort and transport is not None and not transport.is_closing() \
                and transport.can_write_eof() and server.lingering < MAX_LINGERING:
            transport.write(last)
            transport.write_eof()
            server.lingering += 1
            self._linger_left = LINGER_BYTES
            asyncio.get_running_loop().call_later(LINGER_SECONDS, self._end_linger)
            self._cleanup()
            transport.resume_reading()
            return
        close_transport(transport, abort, None if last is None or transport is None else
                        lambda: transport.write(last))
        self._cleanup()

    def _end_linger(self) -> None:
        if self._linger_left < 0:
            return
        self._linger_left = -1
        self.server.lingering -= 1
        close_transport(self.transport, False)

    def _cleanup(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._lines.clear()
        self._input.clear()
        self._unfinished = bytearray()
        self._queued_bytes = 0
        self._partial_since = self._blocked_since = None
        self._wake()  # the worker ends (after the request it may be answering)
        server = self.server
        if self in server.connections:
            server.connections.discard(self)
            if self._pending:
                self._settle_pending()
            server.per_address[self.address] -= 1
            if not server.per_address[self.address]:
                del server.per_address[self.address]
            if self._output_counted:
                server.output_bytes -= self._output_counted
                self._output_counted = 0
                server.output_freed()
            server.output_waiters.discard(self)
        self.session.close_readers()

    @property
    def held_bytes(self) -> int:
        """Input held (unfinished and waiting lines) and replies not yet taken by the socket."""
        output = self.transport.get_write_buffer_size() if self.transport is not None and not self.closed else 0
        return len(self._unfinished) + self._queued_bytes + output


class V1Server:
    """The V1 listener and its state: partition roles and replicas, consumer groups, offsets.

    It reads the broker's settings: `auth_tokens`: when set, a connection must `AUTH <token>`
    before any other command, within `handshake_timeout`; `v1_consume_max_bytes`: the most record
    bytes one CONSUME reply carries; the Pulsar port's `max_output_bytes`, `handshake_timeout`,
    `frame_timeout` (a request line standing for a frame) and `max_connections` (or the broker's
    `max_connections`, lowered to fit the descriptor limit): see V1Connection."""

    def __init__(self, core: BrokerCore, settings: BrokerSettings | None = None, *,
                 max_connections: int | None = None, auth_failure_delay: float = AUTH_FAILURE_DELAY) -> None:
        settings = settings or BrokerSettings()
        max_connections = settings.connection_limit if max_connections is None else max_connections
        if settings.v1_partitions < 1:
            raise ValueError("a V1 topic needs at least one partition")
        check_replication(settings.replication_factor, settings.min_insync_replicas)
        if settings.v1_consume_max_bytes < 1:
            raise ValueError("consume_max_bytes must be at least 1")
        for name, value in (("max_output_bytes", settings.max_output_bytes),
                            ("handshake_timeout", settings.handshake_timeout),
                            ("line_timeout", settings.frame_timeout), ("max_connections", max_connections),
                            ("max_connections_per_address", settings.v1_max_connections_per_address),
                            ("max_total_output_bytes", settings.v1_max_total_output_bytes)):
            if value <= 0:
                raise ValueError(f"{name} must be positive")
        self.core = core
        self.partitions = settings.v1_partitions
        self.replication_factor = settings.replication_factor
        self.min_insync = settings.min_insync_replicas
        self.replication_timeout = settings.replication_timeout
        self.replica_lag_time = settings.replica_lag_time
        self.session_timeout = settings.session_timeout
        self.consume_max_bytes = settings.v1_consume_max_bytes
        self.max_connections = max_connections
        self.max_connections_per_address = settings.v1_max_connections_per_address
        self.auth_failure_delay = auth_failure_delay
        self.max_output_bytes = settings.max_output_bytes
        self.handshake_timeout = settings.handshake_timeout
        self.line_timeout = settings.frame_timeout
        auth_tokens = settings.auth_tokens  # V1 asks for AUTH too
        self.auth_tokens = None if auth_tokens is None else [t.encode() for t in auth_tokens]
        self.state: dict[tuple[str, int], PartitionState] = {}
        self.groups_path = os.path.join(core.data_dir, "groups.json")
        self.offsets_path = os.path.join(core.data_dir, "offsets.json")
        self.groups: dict = _load_group_file(self.groups_path, "the V1 groups: members and assignments",
                                             "members join again")
        self.offsets: dict = _load_group_file(self.offsets_path, "the V1 groups' committed offsets",
                                              "their groups consume again from an older or no committed offset")
        # written off the event loop, each write holding every change made meanwhile
        self._groups_file = metafile.BatchedFile(core.metadata, self.groups_path, self._groups_snapshot)
        self._offsets_file = metafile.BatchedFile(core.metadata, self.offsets_path, lambda: self.offsets)
        now = time.monotonic()
        for group in self.groups.values():  # members get a fresh session after a restart
            group["members"] = {member: {"seen": now} for member in group.get("members", ())}
            group["assignments"] = group.get("assignments", group.pop("assignment", {}))  # older files
        self._server: asyncio.AbstractServer | None = None
        self.connections: set[V1Connection] = set()
        self.per_address: collections.Counter[str | None] = collections.Counter()
        self.max_total_output_bytes = settings.v1_max_total_output_bytes
        self.output_bytes = 0  # unsent replies of every connection (as last measured: an upper bound)
        self.output_waiters: set[V1Connection] = set()  # connections waiting for the total to fall
        self._output_check: asyncio.TimerHandle | None = None
        self.pending = 0  # connections not established yet (see Session.established)
        self.lingering = 0  # closed connections dropping what their clients still send (V1Connection.close)
        self._watcher: asyncio.Task | None = None
        # what hostile or slow clients cost (stats())
        self.counters = dict.fromkeys(("refused_connections", "handshake_timeouts", "line_timeouts",
                                       "output_timeouts", "oversized_lines", "output_pauses", "input_pauses",
                                       "cut_lines", "idle_timeouts", "auth_failures", "output_cap_waits",
                                       "peak_output_bytes"), 0)
        # One worker: big decompressions run one at a time, off the event loop.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulsarwire-v1")
        self._round_robin = 0
        self._targets: dict[str, tuple[str, int]] = {}  # PRODUCE's topic argument -> (broker topic, partitions)
        self._fast_targets: dict[bytes, tuple[str, int, list[str]]] = {}  # the same, and the partitions' names
        # records _produce_fast staged, per partition: (bodies, publish times, their _Produced)
        self._staged: dict[Topic, tuple[list, list, list]] = {}
        self._checked_targets: set[bytes] = set()  # fast targets whose partition count this group checked
        # recent keys: their murmur3 (pure Python: worth remembering) and metadata field
        self._keys: dict[bytes, tuple[int, bytes]] = {}
        self._publish_time = 0  # the last publish time (ms) and it as a metadata field
        self._publish_time_field = b""
        self._commands: dict[str, Callable[[list[str]], str]] = {  # those answered without waiting
            "PING": self.ping, "SYNC": self.sync, "HEARTBEAT": self.heartbeat, "OFFSET": self.offset, "REPLICA_FETCH": self.replica_fetch,
            "SET_PARTITION_ROLE": self.set_partition_role,
        }

        self._stored_commands = {"JOIN": self.join, "LEAVE": self.leave, "COMMIT": self.commit}

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: V1Connection(self), host, port)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._output_check is not None:
            self._output_check.cancel()
        workers = [c._worker for c in self.connections if c._worker is not None]
        for connection in list(self.connections):
            connection.close(abort=True)
        for worker in workers:
            worker.cancel()
        if workers:
            await asyncio.wait(workers, timeout=5)
        if self._server is not None:
            await self._server.wait_closed()
        self._executor.shutdown(wait=True, cancel_futures=True)
        for batched in (self._groups_file, self._offsets_file):
            try:
                batched.write_now()
            except StorageError:
                pass  # logged by the writer

    # connection

    @property
    def max_pending(self) -> int:
        """Connections not established yet that may be open at once: the rest is kept for established ones."""
        return self.max_connections - self.max_connections // ESTABLISHED_SHARE

    def refusal(self, address: str | None) -> str | None:
        """Why a new connection from `address` is refused, or None to serve it."""
        if len(self.connections) >= self.max_connections:
            return f"this broker serves at most {self.max_connections} V1 connections"
        if self.per_address[address] >= self.max_connections_per_address:
            return f"this broker serves at most {self.max_connections_per_address} V1 connections from one address"
        if self.pending >= self.max_pending:
            return (f"{self.pending} V1 connections have not sent a valid request yet; the other "
                    f"{self.max_connections - self.max_pending} places are kept for established connections")
        return None

    def wait_for_output(self, connection: V1Connection) -> None:
        """`connection` waits until the unsent replies of all connections fall under the cap: they
        drain without telling, so they are measured again every OUTPUT_CHECK_INTERVAL meanwhile."""
        if connection not in self.output_waiters:
            self.counters["output_cap_waits"] += 1
            self.output_waiters.add(connection)
        if self._output_check is None:
            self._output_check = asyncio.get_running_loop().call_later(OUTPUT_CHECK_INTERVAL, self._measure_output)

    def _measure_output(self) -> None:
        self._output_check = None
        for connection in list(self.connections):
            connection._account_output()
        self.output_freed()
        if self.output_waiters and self._output_check is None:
            self._output_check = asyncio.get_running_loop().call_later(OUTPUT_CHECK_INTERVAL, self._measure_output)

    def output_freed(self) -> None:
        """Unsent replies went down: wake the connections waiting for the cap, if under it now."""
        if self.output_waiters and self.output_bytes <= self.max_total_output_bytes:
            waiting, self.output_waiters = self.output_waiters, set()
            for connection in waiting:
                connection._wake()

    def watch(self) -> None:
        """Start the sweep that closes connections past their deadlines (while any are open)."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._sweep())

    async def _sweep(self) -> None:
        step = max(0.05, min(1.0, self.handshake_timeout / 4, self.line_timeout / 4))
        try:
            while self.connections:
                await asyncio.sleep(step)
                now = time.monotonic()
                for connection in list(self.connections):
                    connection.check_deadlines(now)
                    connection._account_output()
                self.output_freed()
        except asyncio.CancelledError:
            pass

    def stats(self) -> dict:
        """Open connections, what they hold (input and unsent replies), and the counters."""
        return dict(self.counters, connections=len(self.connections), pending_connections=self.pending,
                    lingering_connections=self.lingering,
                    output_bytes=sum(c.transport.get_write_buffer_size() for c in self.connections
                                     if c.transport is not None and not c.closed),
                    held_bytes=sum(c.held_bytes for c in self.connections),
                    paused_connections=sum(1 for c in self.connections if not c._writable))

    async def handle_line(self, raw: bytes, session: Session | None = None) -> bytes:
        """One request line in, one response line out (never raises)."""
        if session is None:  # a line of its own: its readers end with it
            session = Session()
            try:
                return await self.handle_line(raw, session)
            finally:
                session.close_readers()
        answer = self.answer_now(raw, session)
        if answer is None:
            return await self.answer_later(raw, session)
        return self.finish_group([answer])

    def answer_now(self, raw: bytes, session: Session, fast: bool = True) -> bytes | _Produced | None:
        """The answer to a request that needs no waiting: its reply line, or for PRODUCE acks=0/1 a
        _Produced (the record is appended; finish_group renders it once the group is committed).
        None for one that waits (CONSUME, PRODUCE acks=all, AUTH, and any whose topic is being
        created or opened): answer_later then. Never raises."""
        try:
            return self._answer_now(raw, session, fast)
        except _Waits:
            return None

    def _answer_now(self, raw: bytes, session: Session, fast: bool) -> bytes | _Produced | None:
        if fast:
            produced = self._produce_fast(raw, session)
            if produced is not None:
                return produced
        if self._staged:
            self.store_staged()  # what comes next sees every record before it
        try:
            correlation, command, args = parse_request(raw)
        except V1Error as exc:
            return _error("0", exc.code, exc.message)
        if self.auth_tokens is None:
            session.established = True  # a valid request
        try:
            if command == "PRODUCE":
                if len(args) == 3 and args[2] == "acks=all":
                    return None
                self._check_authenticated(session)
                return self._append(correlation, args)
            if command in _WAITING_COMMANDS:
                return None
            self._check_authenticated(session)
            handler = self._commands.get(command)
            if handler is None:
                raise V1Error(UNKNOWN_COMMAND, f"unknown command {_show(command)}")
            return _response(correlation, handler(args))
        except V1Error as exc:
            return _error(correlation, exc.code, exc.message)
        except _Waits:
            raise
        except Exception as exc:  # noqa: BLE001 - a fault must not kill the connection
            log.exception("V1 %s failed", command)
            return _error(correlation, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")

    async def answer_later(self, raw: bytes, session: Session) -> bytes:
        """The reply to a request answer_now left (it parses: answer_now checked). One whose
        topic is being created or opened is answered once that is done."""
        for _ in range(MAX_WAITS_PER_REQUEST):
            try:
                answer = self._answer_now(raw, session, True)
                if answer is not None:
                    return self.finish_group([answer])
                return await self._answer_waiting(raw, session)
            except _Waits as waits:
                try:
                    await waits.ready()
                except V1Error as exc:
                    return _error(parse_request(raw)[0], exc.code, exc.message)
                except Exception as exc:  # noqa: BLE001 - e.g. a full disk: this request fails, the connection goes on
                    return _error(parse_request(raw)[0], INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        return _error(parse_request(raw)[0], INTERNAL_ERROR, "the topic did not stay open; try again")

    async def _answer_waiting(self, raw: bytes, session: Session) -> bytes:
        if self._staged:
            self.store_staged()
        correlation, command, args = parse_request(raw)
        payload: str | list[bytes]
        try:
            if command == "AUTH":
                payload = self.auth(args, session)
            else:
                self._check_authenticated(session)
                if command == "CONSUME":
                    payload = await self.consume(args, session)
                elif command in self._stored_commands:
                    payload = await self._stored_commands[command](args)
                else:
                    payload = await self.produce_all(correlation, args)
        except V1Error as exc:
            return _error(correlation, exc.code, exc.message)
        except _Waits:
            raise
        except Exception as exc:  # noqa: BLE001 - a fault must not kill the connection
            log.exception("V1 %s failed", command)
            return _error(correlation, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        return _response(correlation, payload)

    def _check_authenticated(self, session: Session) -> None:
        if self.auth_tokens is not None and not session.authenticated:
            raise V1Error(UNAUTHORIZED, "this broker requires authentication: send AUTH <token> first")

    def finish_group(self, answers: list) -> bytes:
        """The reply lines of a group of answers from answer_now, after one group commit: a
        record's receipt leaves only once written (else INTERNAL_ERROR in its place)."""
        if self._staged:
            self.store_staged()
        self._checked_targets.clear()
        self.core.commit()
        if not any(type(answer) is _Produced for answer in answers):
            return b"".join(answers)
        high_watermarks: dict[int, int] = {}  # per PartitionState touched (by id): its hw after the commit
        out = []
        for answer in answers:
            if type(answer) is not _Produced:
                out.append(answer)
                continue
            correlation, partition, offset, state, log_topic, batch = answer
            if type(correlation) is str:
                correlation = correlation.encode()
            failure = batch if type(batch) is not CommitBatch else batch.error
            if failure is not None:
                out.append(_error(correlation.decode(), INTERNAL_ERROR, f"the record is not stored: {failure}"))
                continue
            hw = high_watermarks.get(id(state))
            if hw is None:
                log_end = log_topic.log.next_entry_id
                self._wake(state, log_end)
                hw = high_watermarks[id(state)] = self._hw(state, log_end)
            out.append(b"V1|%s|OK|partition=%d offset=%d hw=%d\n" % (correlation, partition, offset, hw))
        return b"".join(out)

    def auth(self, args: list[str], session: Session) -> str:
        if len(args) != 1:
            raise _usage("AUTH")
        if self.auth_tokens is not None:
            offered = args[0].encode()
            # compare with every token, so the time taken does not tell which one nearly matched
            matched = [hmac.compare_digest(offered, token) for token in self.auth_tokens]
            if not any(matched):
                self.counters["auth_failures"] += 1
                session.close = session.auth_failed = True
                raise V1Error(UNAUTHORIZED, "authentication failed")
        session.authenticated = session.established = True
        return "authenticated=true"

    # topics and replication

    def _full_name(self, topic: str) -> str:
        """The broker topic that a V1 topic argument names; BAD_REQUEST for one V1 cannot use."""
        if _SHORT_TOPIC.fullmatch(topic):
            full = DEFAULT_NAMESPACE + topic
        elif _FULL_TOPIC.fullmatch(topic):
            full = topic
        else:
            raise _bad(f"invalid topic {_show(topic)}: a name of letters, digits and _.=:- "
                       "or persistent://<tenant>/<namespace>/<name>")
        if PARTITION_MARKER in full:
            raise _bad(f"topic {_show(topic)} names a single partition; give the topic and a partition number")
        longest = f"{full}{PARTITION_MARKER}{self.partitions + 99999}"
        if len(urllib.parse.quote(longest, safe="")) > _MAX_FILE_NAME:
            raise _bad(f"topic {_show(topic)} is too long")
        try:
            self.core.check_topic_name(full)
        except InvalidTopicName as exc:
            raise _bad(f"invalid topic {_show(topic)}: {exc}") from None
        return full

    @staticmethod
    def _canonical(full: str) -> str:
        """How groups and offsets name a topic (the short name in the default namespace)."""
        return full[len(DEFAULT_NAMESPACE):] if full.startswith(DEFAULT_NAMESPACE) else full

    def _partition_count(self, full: str) -> int | None:
        """Partitions of V1 topic `full`; None when it does not exist yet. A non-partitioned
        Pulsar topic of that name is no V1 topic: V1 must neither read nor re-register it."""
        count = self.core.partitioned_count(full)
        if count is None and self.core.non_partitioned_exists(full):
            raise _bad(f"{self._canonical(full)} is a non-partitioned Pulsar topic; "
                       "V1 only uses partitioned topics")
        return count

    def _check_partition(self, partition: int, count: int) -> None:
        if not 0 <= partition < count:
            raise _bad(f"partition {partition} out of range 0..{count - 1}")

    def _check_existing_partition(self, full: str, partition: int) -> None:
        """BAD_REQUEST for a negative partition, or one out of range of topic `full` where it
        exists (OFFSET of a topic not written yet answers -1)."""
        _not_negative(partition, "partition")
        count = self._partition_count(full)
        if count is not None:
            self._check_partition(partition, count)

    def _create(self, full: str) -> int:
        """The partition count of `full`; one that does not exist is created as a V1 topic, and
        the request waits (_Waits) until that is on disk."""
        count = self._partition_count(full)
        if count is None:
            creating = self.core.create_partitioned_topic(full, self.partitions)
            raise _Waits(lambda: asyncio.wrap_future(creating))
        return count

    def _log(self, full: str, partition: int) -> Topic:
        name = f"{full}{PARTITION_MARKER}{partition}"
        topic = self.core.topics.get(name)
        if topic is None and self.core.needs_opening(name):  # opened off the event loop, then asked again
            raise _Waits(lambda: self.core.open_topic(name))
        topic = self.core.topic(name)
        if topic is None:  # someone registered the partition's own name as a partitioned topic
            raise _bad(f"partition {partition} of {self._canonical(full)} is unusable")
        return topic

    def _state(self, full: str, partition: int) -> PartitionState:
        key = (full, partition)
        state = self.state.get(key)
        if state is None:
            state = self.state[key] = PartitionState()
        return state

    def _isr(self, state: PartitionState) -> list[int]:
        """The leader, and the replicas that fetched within replica_lag_time and hold everything
        below the high watermark (a replica behind it, new or fallen back, is not in sync: counting
        it would pull the high watermark back under records already committed)."""
        now = time.monotonic()
        return [0] + sorted(r for r, (acked, seen) in state.replicas.items()
                            if now - seen <= self.replica_lag_time and acked >= state.hw)

    def _hw(self, state: PartitionState, log_end: int) -> int:
        """The lowest offset every ISR member acknowledged, never lower than before."""
        acked = [log_end] + [state.replicas[r][0] for r in self._isr(state) if r != 0]
        state.hw = min(max(state.hw, min(acked)), log_end)
        return state.hw

    def _wake(self, state: PartitionState, log_end: int) -> None:
        hw = self._hw(state, log_end)
        isr_size = len(self._isr(state))
        for waiter in list(state.waiters):
            offset, future = waiter
            if hw > offset and isr_size >= self.min_insync and not future.done():
                future.set_result(None)
                state.waiters.remove(waiter)

    # commands

    def ping(self, args: list[str]) -> str:
        if args:
            raise _usage("PING")
        return "PONG"

    def _append(self, correlation: str, args: list[str]) -> "_Produced":
        """Validate a PRODUCE and append its record (acks=all waits afterwards: produce_all)."""
        if len(args) not in (2, 3):
            raise _usage("PRODUCE")
        topic, record = args[0], args[1]
        if len(args) == 3 and args[2] not in ACK_MODES:
            raise _bad(f"ack mode must be exactly acks=0, acks=1 or acks=all, got {_show(args[2])}")
        key, colon, value = record.partition(":")
        if not colon:
            raise _bad(f"PRODUCE needs a <key>:<value> record, got {_show(record)}")
        if "," in value or "\r" in value:
            raise _bad(f"a value cannot hold {',' if ',' in value else chr(13)!r}: a CONSUME reply could not "
                       f"carry it (its records are separated by commas, without escaping)")
        full, count = self._produce_target(topic)
        if key:
            key_bytes = key.encode()
            partition = murmur3_32(key_bytes) % count
        else:
            key_bytes = b""
            partition = self._round_robin % count
        log_topic, state = self._partition_of(full, partition)  # may wait (_Waits): then asked again, same turn
        if not key:
            self._round_robin += 1
        if state.role != "leader":
            raise V1Error(NOT_LEADER, f"partition {partition} of {topic} is a follower on this broker")
        if log_topic.terminated:
            raise _bad(f"partition {partition} of {topic} is terminated and takes no more records")
        sequence_id = log_topic.log.next_entry_id
        publish_time = int(time.time() * 1000)
        body = v1_entry_body(sequence_id, publish_time, key_bytes, value.encode())
        offset = log_topic.append(body, None, publish_time, None, 1, PRODUCER_NAME, sequence_id)
        return _Produced((correlation, partition, offset, state, log_topic, log_topic.log.batch))

    def _produce_fast(self, raw: bytes, session: Session) -> "_Produced | None":
        """The common PRODUCE (`V1|<id>|PRODUCE|<topic> <key>:<value>[ acks=0|acks=1]`, to a leader
        partition of a topic produced to before), appended with the fewest steps; None for anything
        else, which the general path answers (with the same outcome for these lines)."""
        sections = raw.split(b"|")
        if len(sections) != 4 or sections[2] != b"PRODUCE" or sections[0] != b"V1" or not sections[1]:
            return None
        if self.auth_tokens is not None and not session.authenticated:
            return None
        args = sections[3].split(b" ")
        if len(args) == 3:
            if args[2] != b"acks=1" and args[2] != b"acks=0":
                return None
        elif len(args) != 2:
            return None
        record = args[1]
        if len(record.translate(None, b",\r\t")) != len(record):  # one pass (a comma in a key: the general path)
            return None
        key, colon, value = record.partition(b":")
        if not colon:
            return None
        if not raw.isascii():
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return None
        target = self._fast_targets.get(args[0])
        if target is None:
            return None
        full, count, names = target
        if args[0] not in self._checked_targets:  # once a group: nothing else runs during one
            if self.core.partitioned_count(full) != count:
                return None
            self._checked_targets.add(args[0])
        if key:
            known = self._keys.get(key)
            if known is None:
                if len(self._keys) >= MAX_REMEMBERED_KEYS:
                    self._keys.clear()
                known = self._keys[key] = (murmur3_32(key), b"2" + _varint(len(key)) + key)
            hashed, key_field = known
            partition = hashed % count
        else:
            key_field = b""
            partition = self._round_robin % count
            self._round_robin += 1  # the general path would take the same turn
        log_topic = self.core.topics.get(names[partition])
        state = self.state.get((full, partition))
        if log_topic is None or state is None or state.role != "leader" or log_topic.terminated:
            if not key:
                self._round_robin -= 1
            return None
        if not session.established:
            session.established = True
        staged = self._staged.get(log_topic)
        if staged is None:
            staged = self._staged[log_topic] = ([], [], [])
        bodies = staged[0]
        offset = log_topic.log.next_entry_id + len(bodies)  # the sequence id too
        publish_time = int(time.time() * 1000)
        if publish_time != self._publish_time:
            self._publish_time = publish_time
            self._publish_time_field = b"\x18" + _varint(publish_time)
        if 0x4000 <= offset < 0x200000:  # the common size, without a call
            sequence_field = bytes((offset & 0x7F | 0x80, (offset >> 7) & 0x7F | 0x80, offset >> 14))
        else:
            sequence_field = _varint(offset)
        time_field = self._publish_time_field
        size = 3 + len(sequence_field) + len(time_field) + len(key_field)  # of the metadata
        bodies.append(b"".join((size.to_bytes(4, "big"), b"\n\x00\x10", sequence_field, time_field, key_field, value)))
        staged[1].append(publish_time)
        produced = _Produced((sections[1], partition, offset, state, log_topic, None))
        staged[2].append(produced)
        return produced

    def store_staged(self) -> None:
        """Append the records _produce_fast staged, a run per partition (before anything else reads
        or writes the logs). Each _Produced gets the CommitBatch it belongs to, or the StorageError
        that kept it out (then so are those after it in its partition: no gap)."""
        staged, self._staged = self._staged, {}
        self._checked_targets.clear()
        for log_topic, (bodies, publish_times, produced) in staged.items():
            topic_log = log_topic.log
            first = produced[0][2]
            stored = 0
            failure: Exception | None = None
            if self.core.topics.get(log_topic.name) is not log_topic or topic_log.next_entry_id != first:
                failure = StorageError(f"partition {log_topic.name} changed before its records were stored")
            else:
                try:
                    stored = log_topic.append_plain(bodies, [crc32c(body) for body in bodies], publish_times,
                                                    PRODUCER_NAME, produced[-1][2])
                except StorageError as exc:
                    failure = exc
            batch = topic_log.batch
            for record in produced[:stored]:
                record[5] = batch
            for i in range(stored, len(produced)):  # a new segment starts (or storing failed)
                record = produced[i]
                if failure is None:
                    try:
                        log_topic.append(bodies[i], None, publish_times[i], None, 1, PRODUCER_NAME, record[2])
                        record[5] = topic_log.batch
                        continue
                    except StorageError as exc:
                        failure = exc
                record[5] = failure

    def _produce_target(self, topic: str) -> tuple[str, int]:
        """The broker topic a PRODUCE names and its partition count (the topic created if new);
        validated names are remembered (bounded), the hot path of a stream of PRODUCEs."""
        known = self._targets.get(topic)
        if known is not None and self.core.partitioned_count(known[0]) == known[1]:
            return known
        full = self._full_name(topic)
        count = self._create(full)
        if len(self._targets) >= MAX_REMEMBERED_TOPICS:
            self._targets.clear()
            self._fast_targets.clear()
        self._targets[topic] = (full, count)
        self._fast_targets[topic.encode()] = (full, count, [f"{full}{PARTITION_MARKER}{p}" for p in range(count)])
        return full, count

    def _partition_of(self, full: str, partition: int) -> tuple[Topic, PartitionState]:
        key = (full, partition)
        state = self.state.get(key)
        topic = self.core.topics.get(f"{full}{PARTITION_MARKER}{partition}")
        if state is None or topic is None:
            topic, state = self._log(full, partition), self._state(full, partition)
        return topic, state

    async def produce_all(self, correlation: str, args: list[str]) -> str:
        """PRODUCE with acks=all: appended and committed, then answered once the high watermark
        passed the record with at least min_insync_replicas in the ISR."""
        produced = self._append(correlation, args)
        _, partition, offset, state, log_topic, batch = produced
        self.core.commit()  # written before it is acknowledged
        if batch.error is not None:
            raise V1Error(INTERNAL_ERROR, f"the record is not stored: {batch.error}")
        log_end = log_topic.log.next_entry_id
        self._wake(state, log_end)
        future = asyncio.get_running_loop().create_future()
        waiter = (offset, future)
        state.waiters.append(waiter)
        self._wake(state, log_end)
        try:
            await asyncio.wait_for(future, self.replication_timeout)
        except asyncio.TimeoutError:
            if waiter in state.waiters:
                state.waiters.remove(waiter)
            raise V1Error(REPLICATION_TIMEOUT,
                          f"offset {offset} not replicated to {self.min_insync} in-sync replicas within "
                          f"{self.replication_timeout}s; the record is stored") from None
        return f"partition={partition} offset={offset} hw={self._hw(state, log_topic.log.next_entry_id)}"

    async def consume(self, args: list[str], session: Session | None = None) -> str | list[bytes]:
        if len(args) != 3:
            raise _usage("CONSUME")
        partition, offset = _int(args[1], "partition"), _int(args[2], "offset")
        full = self._full_name(args[0])
        _not_negative(partition, "partition")
        _not_negative(offset, "offset")
        count = self._partition_count(full)
        self._check_partition(partition, self.partitions if count is None else count)
        if count is None:  # nothing produced yet: nothing committed (the topic is not created)
            return "messages= hw=0"
        log_topic = self._log(full, partition)
        topic_log = log_topic.log
        hw = self._hw(self._state(full, partition), topic_log.next_entry_id)
        records: list[bytes] = []
        used = 0
        position = max(offset, topic_log.first_entry_id)
        end = min(hw, position + MAX_CONSUME_ENTRIES)
        reader = None if session is None else session.reader(topic_log)
        room = self.consume_max_bytes
        read, read_pending = topic_log.read, topic_log.read_pending
        plain = _plain_v1_value_start
        while position < end:
            # the hot path: entries V1 wrote, in the entry cache, their values ready to show as they are
            append = records.append
            for entry in topic_log.cached_entries(position, end):
                start = entry.plain_value_start
                if start is None:
                    start = entry.plain_value_start = plain(entry.body)
                if start < 0:
                    break
                record = b"%d:%s" % (position, entry.body[start:])
                size = used + len(record) + 1  # and its comma
                if size > room:
                    break
                append(record)
                used = size
                position += 1
            if position >= end:
                break
            if read_pending(position, reader) is not None:
                await topic_log.landed(position, reader)  # read off the loop; read() then has it
            try:
                entry = read(position, reader)
            except (StorageError, KeyError):
                entry = None  # the general path below reports it
            if entry is not None:
                shown = _plain_v1_record(entry)
                if shown is not None and used + len(shown) + 1 <= room:
                    records.append(shown)
                    used += len(shown) + 1  # and its comma
                    position += 1
                    continue
            try:
                rendered = await self._entry_records(topic_log, position, room - used, reader, entry)
            except _TooLarge as exc:
                if records:
                    break  # the next CONSUME starts here
                raise V1Error(RECORD_TOO_LARGE,
                              f"offset={position} bytes={exc.size} budget={self.consume_max_bytes}: the record "
                              f"is larger than one CONSUME reply may carry (--v1-consume-max-bytes); "
                              f"CONSUME from {position + 1} to skip it") from None
            except (StorageError, CodecError, KeyError) as exc:
                if records:
                    break
                raise V1Error(CORRUPT_RECORD, f"offset={position}: the record does not decode ({exc}); "
                                              f"CONSUME from {position + 1} to skip it") from None
            records.extend(rendered)
            used += sum(len(r) + 1 for r in rendered)
            position += 1
        return [b"messages=", b",".join(records), b" hw=%d" % hw]

    async def _entry_records(self, topic_log: TopicLog, position: int, room: int,
                             reader: LogReader | None = None, entry: Entry | None = None) -> list[bytes]:
        """The entry's messages as `offset:value` texts within `room` bytes (else _TooLarge).
        The declared size is checked before anything is decompressed, and big
        decompressions run on the worker thread so that the event loop keeps serving."""
        if entry is None:
            entry = await topic_log.read_off_loop(position, reader)
        size = int.from_bytes(entry.body[:4], "big")
        try:
            metadata = entry_metadata(entry)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError
            raise CodecError(f"metadata does not parse: {exc}") from None
        payload = memoryview(entry.body)[4 + size:]
        compressed = metadata.compression != compression.NONE
        declared = metadata.uncompressed_size if compressed else len(payload)
        if declared > room:
            raise _TooLarge(declared)
        if compressed and declared > OFF_LOOP_BYTES:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, _render, position, metadata, payload, room)
        return _render(position, metadata, payload, room)

    def replica_fetch(self, args: list[str]) -> str:
        if len(args) != 4:
            raise _usage("REPLICA_FETCH")
        partition, replica = _int(args[1], "partition"), _int(args[2], "replica_id")
        offset = _int(args[3], "offset")
        full = self._full_name(args[0])
        _not_negative(partition, "partition")
        if not 1 <= replica < self.replication_factor:
            raise _bad(f"replica_id must be in 1..{self.replication_factor - 1} (0 is the leader), got {replica}"
                       if self.replication_factor > 1 else "this broker has no replicas (replication factor 1)")
        _not_negative(offset, "offset")
        count = self._partition_count(full)
        self._check_partition(partition, self.partitions if count is None else count)
        self._create(full)  # a follower may fetch before anything is produced
        state = self._state(full, partition)
        if state.role != "leader":
            raise V1Error(NOT_LEADER, f"partition {partition} of {args[0]} is a follower on this broker")
        log_end = self._log(full, partition).log.next_entry_id
        acked = min(offset, log_end)
        state.replicas[replica] = (acked, time.monotonic())
        self._wake(state, log_end)
        hw = self._hw(state, log_end)
        isr = self._isr(state)
        return (f"replica={replica} acked_offset={acked} hw={hw} isr={_list(isr)} "
                f"under_replicated={'true' if len(isr) < self.replication_factor else 'false'}")

    def set_partition_role(self, args: list[str]) -> str:
        if len(args) != 3:
            raise _usage("SET_PARTITION_ROLE")
        partition, role = _int(args[1], "partition"), args[2]
        if role not in ROLES:
            raise _bad(f"role must be exactly leader or follower, got {_show(role)}")
        full = self._full_name(args[0])
        _not_negative(partition, "partition")
        count = self._partition_count(full)
        self._check_partition(partition, self.partitions if count is None else count)
        self._create(full)
        state = self._state(full, partition)
        state.role = role
        if role == "follower":
            for _, future in state.waiters:
                if not future.done():
                    future.set_exception(V1Error(NOT_LEADER, "the partition became a follower; the record is stored"))
            state.waiters.clear()
        hw = self._hw(state, self._log(full, partition).log.next_entry_id)
        return f"topic={args[0]} partition={partition} role={role} hw={hw}"

    # consumer groups

    def _expire(self, group: dict, now: float) -> None:
        expired = [m for m, info in group["members"].items() if now - info["seen"] > self.session_timeout]
        for member in expired:
            log.info("V1 group member %s timed out", member)
            del group["members"][member]
        if expired:
            self._rebalance(group)

    def _rebalance(self, group: dict) -> None:
        group["generation"] += 1
        members = sorted(group["members"])
        topic = group["topic"]  # as validated when the group was created (older files: as given)
        full = topic if "://" in topic else DEFAULT_NAMESPACE + topic
        count = self.core.partitioned_count(full) or self.partitions
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
        group["assignments"] = assignment
        self._save_groups()

    def _assignment(self, group: dict, member: str) -> str:
        return f"generation={group['generation']} assigned={_list(group['assignments'].get(member, []))}"

    def _member_of(self, name: str, topic: str, member: str, generation: int) -> dict:
        """The group, once `member` is shown to be in it at its current generation (the
        member's session is then renewed); GENERATION_MISMATCH otherwise."""
        canonical = self._canonical(self._full_name(topic))
        group = self.groups.get(name)
        if group is None:
            raise V1Error(GENERATION_MISMATCH, f"unknown member {_show(member)}: no group {_show(name)}; JOIN first")
        now = time.monotonic()
        self._expire(group, now)
        if group["topic"] != canonical:
            raise _bad(f"group {_show(name)} consumes {group['topic']}, not {topic}")
        if member not in group["members"]:
            raise V1Error(GENERATION_MISMATCH,
                          f"unknown member {_show(member)} of group {_show(name)}; JOIN again")
        if generation != group["generation"]:
            raise V1Error(GENERATION_MISMATCH, f"generation {generation} is stale: group {_show(name)} is at "
                                               f"generation {group['generation']}; JOIN again")
        group["members"][member]["seen"] = now
        return group

    async def join(self, args: list[str]) -> str:
        if len(args) not in (3, 4):
            raise _usage("JOIN")
        name, topic, member = args[:3]
        assignor = None
        if len(args) == 4:
            if args[3] not in ASSIGNORS:
                raise _bad(f"assignor must be exactly assignor=round_robin or assignor=range, got {_show(args[3])}")
            assignor = ASSIGNORS[args[3]]
        full = self._full_name(topic)
        canonical = self._canonical(full)
        self._partition_count(full)  # refuses a Pulsar topic
        now = time.monotonic()
        group = self.groups.get(name)
        if group is not None:
            self._expire(group, now)
            if group["topic"] != canonical and group["members"]:
                raise _bad(f"group {_show(name)} consumes {group['topic']}, not {topic}")
        self._create(full)  # the group's partition count is the topic's
        changed = False
        if group is None:
            group = self.groups[name] = {"topic": canonical, "assignor": assignor or "round_robin",
                                         "generation": 0, "members": {}, "assignments": {}}
            changed = True
        elif group["topic"] != canonical:
            group["topic"] = canonical  # an empty group may move on to another topic
            changed = True
        if member not in group["members"]:
            changed = True
        if assignor is not None and assignor != group["assignor"]:
            group["assignor"] = assignor
            changed = True
        group["members"][member] = {"seen": now}
        if changed:
            self._rebalance(group)
            return await self._groups_stored(self._assignment(group, member))
        return self._assignment(group, member)

    def sync(self, args: list[str]) -> str:
        if len(args) != 4:
            raise _usage("SYNC")
        generation = _int(args[3], "generation")
        group = self._member_of(args[0], args[1], args[2], generation)
        return self._assignment(group, args[2])

    def heartbeat(self, args: list[str]) -> str:
        if len(args) != 4:
            raise _usage("HEARTBEAT")
        generation = _int(args[3], "generation")
        self._member_of(args[0], args[1], args[2], generation)
        return "heartbeat=ok"

    async def leave(self, args: list[str]) -> str:
        if len(args) != 4:
            raise _usage("LEAVE")
        generation = _int(args[3], "generation")
        group = self._member_of(args[0], args[1], args[2], generation)
        del group["members"][args[2]]
        self._rebalance(group)
        return await self._groups_stored("left=true")

    async def commit(self, args: list[str]) -> str:
        if len(args) != 6:
            raise _usage("COMMIT")
        generation = _int(args[3], "generation")
        partition, offset = _int(args[4], "partition"), _int(args[5], "offset")
        self._full_name(args[1])
        _not_negative(partition, "partition")
        _not_negative(offset, "offset")
        name, member = args[0], args[2]
        group = self._member_of(name, args[1], member, generation)
        if partition not in group["assignments"].get(member, []):
            raise V1Error(GENERATION_MISMATCH, f"partition {partition} is not assigned to {_show(member)} in "
                                               f"generation {generation}")
        self.offsets.setdefault(name, {}).setdefault(group["topic"], {})[str(partition)] = offset
        error = await self._offsets_file.changed()  # durable before it is acknowledged
        if error is not None:
            raise V1Error(INTERNAL_ERROR, f"offset not committed: {error}")
        return "committed=true"

    def offset(self, args: list[str]) -> str:
        if len(args) != 3:
            raise _usage("OFFSET")
        partition = _int(args[2], "partition")
        full = self._full_name(args[1])
        self._check_existing_partition(full, partition)
        canonical = self._canonical(full)
        committed = self.offsets.get(args[0], {}).get(canonical, {}).get(str(partition), -1)
        return f"offset={committed}"

    # housekeeping

    def tick(self) -> None:
        """Expire members whose session timed out, and let ISR changes release waiters."""
        now = time.monotonic()
        for group in self.groups.values():
            self._expire(group, now)
        self._groups_file.retry()
        self._offsets_file.retry()
        for (full, partition), state in self.state.items():
            if state.waiters:
                topic = self.core.topics.get(f"{full}{PARTITION_MARKER}{partition}")
                if topic is not None:
                    self._wake(state, topic.log.next_entry_id)

    def _save_groups(self) -> asyncio.Future:
        """A group changed: the future is done once groups.json holds the change (its result:
        None, or the error that kept it from the disk)."""
        return self._groups_file.changed()

    def _groups_snapshot(self) -> dict:
        """groups.json: per group its topic, generation, assignor, members and assignments."""
        return {name: {"topic": g["topic"], "generation": g["generation"], "assignor": g["assignor"],
                       "members": sorted(g["members"]), "assignments": g["assignments"]}
                for name, g in self.groups.items()}

    async def _groups_stored(self, answer: str) -> str:
        """`answer`, once the group change it reports is on disk."""
        error = await self._groups_file.changed()
        if error is not None:
            raise V1Error(INTERNAL_ERROR, f"the group's new state is not stored: {error}")
        return answer


def _load_group_file(path: str, what: str, cost: str) -> dict:
    """groups.json or offsets.json; when damaged, its previous copy, else nothing (what it held
    costs only the V1 groups: `cost`)."""
    loaded = metafile.load(path, metafile.expect(dict))
    if loaded.source == metafile.PREVIOUS_COPY:
        metafile.report_damage(loaded, what, f"restored from the previous copy: changes after it are lost ({cost})")
    elif loaded.source == metafile.LOST:
        metafile.report_damage(loaded, what, f"lost (no good copy): the V1 groups start empty ({cost})")
    return loaded.data or {}
