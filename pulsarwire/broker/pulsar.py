"""The broker's Pulsar binary protocol front end: a service holding its settings and
connections, one `BrokerConnection` per client connection, and the links through
which the domain reaches this connection's producers and consumers.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import errno
import os
try:
    import fcntl
    import termios
    _SIOCOUTQ = termios.TIOCOUTQ if hasattr(termios, "TIOCOUTQ") else None  # the same request on sockets
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]
    _SIOCOUTQ = None
import hmac
import json
import logging
import re
import struct
import select
import ssl
import time
from typing import TYPE_CHECKING, Any, Callable, cast

from crc32c import crc32c

from .. import codec
from .._proto import PulsarApi_pb2 as pb
from .._version import __version__
from ..errors import BadMetadataError, ChecksumMismatchError, FrameTooLargeError, PulsarWireError
from ..messages import ack_set_bits
from ..reads import BROKER_BULK_READ_SIZE, adapt_reads, tune_reads
from . import staging
from .compatibility import IncompatibleSchema, version_for
from .core import DUPLICATE, BrokerCore, InvalidTopicName, UnknownTenant, close_transport, highest_sequence
from .listener import TLS_READ_BUFFER_BYTES, start_tls_server
from .settings import BrokerSettings
from .storage import StorageError
from .entries import EARLIEST, LATEST, MalformedBatchError, start_entry
from .subscription import ConsumerLink, Subscription
from .topic import SHARED, ProducerBusyError, ProducerFencedError, ProducerLink, Topic

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from .storage import Entry, FileOps

log = logging.getLogger("pulsarwire.broker")
_NO_ENTRY = (1 << 64) - 1  # entry id -1 as the wire's uint64 carries it
T = pb.BaseCommand
SERVER_VERSION = f"pulsarwire-broker-{__version__}"
MAX_PROTOCOL_VERSION = 21
# Limits on what one client can make the broker hold: those a user sets are in settings.py
# (Broker keywords and CLI flags of the same names), these are fixed.
MAX_SEND_RUN = 256  # Send frames stored together: their receipts may pass the output budget by this many
# output one connection may queue per round while the broker is squeezed (then it waits until all is sent)
SQUEEZED_OUTPUT_BYTES = 64 * 1024
RELAX_BELOW = 0.75  # the share of the total output budget under which squeezed connections take output again
# requests (Send frames aside, stored in runs) one connection has handled in one turn of the event
# loop: the rest wait for the next turn, so that a flood of small requests never holds the loop long
MAX_REQUESTS_PER_TURN = 256
# nor longer than this many seconds (requests that do more than answer, e.g. a subscription's cursor)
MAX_SECONDS_PER_TURN = 0.005
# topics one connection has being opened (off the event loop) at once: past it, its frames wait
MAX_OPENS_PER_CONNECTION = 32
# bytes dispatched to consumers in one turn of the event loop, all connections together: more waits
# for the next turn, so that a burst to many consumers never keeps the loop from other clients long
DISPATCH_BYTES_PER_TURN = 4 * 1024 * 1024
# a frame this big, with nothing queued before it on its connection, goes to the socket at once
# rather than at the end of the loop's turn (see BrokerConnection.write)
DIRECT_WRITE_BYTES = 64 * 1024
SPACE_PROBE_INTERVAL = 0.5  # seconds between checks whether a full disk has room again
SPACE_PROBE_BYTES = 64 * 1024  # what a check writes (and gives back) to see whether the disk has room
_U64 = 0xFFFFFFFFFFFFFFFF
_I64_MAX = 0x7FFFFFFFFFFFFFFF


def message_id(topic: Topic, entry_id: int) -> pb.MessageIdData:
    """An entry's id, with its topic's partition index as Pulsar gives it (-1, left out, when the
    topic is not a partition): the official client compares ids by partition too."""
    data = pb.MessageIdData(ledgerId=topic.ledger_of(entry_id), entryId=entry_id & _U64)
    if topic.partition >= 0:
        data.partition = topic.partition
    return data


def start_position(mid: pb.MessageIdData) -> int:
    """A wire message id as a domain start position: EARLIEST, LATEST or an entry id."""
    if mid.entryId >= 1 << 63 or mid.ledgerId >= 1 << 63:
        return EARLIEST  # earliest is (-1, -1)
    if mid.entryId == _I64_MAX or mid.ledgerId == _I64_MAX:
        return LATEST
    return mid.entryId


class PulsarService:
    """The Pulsar front end's settings and live connections, shared by its listeners."""

    def __init__(self, core: BrokerCore, settings: BrokerSettings | None = None) -> None:
        settings = self.settings = settings or BrokerSettings()
        if settings.max_total_output_bytes < settings.max_output_bytes:
            raise ValueError("max_total_output_bytes must hold at least one connection's max_output_bytes")
        if not 0 <= settings.authenticated_share < 1:
            raise ValueError("authenticated_share must be at least 0 and below 1")
        if settings.max_connections_per_address is not None and settings.max_connections_per_address < 1:
            raise ValueError("max_connections_per_address must be positive")
        if settings.idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")
        if settings.max_input_bytes < settings.max_message_size + codec.FRAME_PADDING:
            raise ValueError("max_input_bytes must hold at least one frame of the max message size")
        for name, value in (("max_connections", settings.connection_limit),
                            ("max_output_bytes", settings.max_output_bytes),
                            ("handshake_timeout", settings.handshake_timeout),
                            ("frame_timeout", settings.frame_timeout)):
            if value <= 0:
                raise ValueError(f"{name} must be positive")
        if settings.max_frame_before_connect < 64:
            raise ValueError("max_frame_before_connect must be at least 64 bytes (a CONNECT must fit)")
        self.core = core
        # copies of settings read per connection or frame; max_connections the broker may lower
        # to fit the descriptor limit
        self.max_connections = settings.connection_limit
        self.max_output_bytes = settings.max_output_bytes
        self.handshake_timeout = settings.handshake_timeout
        self.max_frame_before_connect = settings.max_frame_before_connect
        self.frame_timeout = settings.frame_timeout
        self.max_input_bytes = settings.max_input_bytes
        self._max_per_address = settings.max_connections_per_address
        self.authenticated_share = settings.authenticated_share
        self.idle_timeout = settings.idle_timeout
        self.per_address: collections.Counter[str] = collections.Counter()  # live connections by peer address
        # not past CONNECT (or refused it), oldest first
        self.unauthenticated: dict[BrokerConnection, None] = {}
        self.input_bytes = 0  # bytes of unfinished frames held by every connection
        # unsent output of every connection (as each last measured its own), and its broker-wide bound:
        # past it the broker is squeezed, and a connection holding any output takes no more until
        # it has sent all it holds (what the entry cache leaves of the memory budget)
        self.max_total_output_bytes = settings.max_total_output_bytes
        self.output_total = 0
        self.squeezed = False
        self.turn_bytes = 0  # dispatched in this turn of the loop
        self._turn_waiting: dict[BrokerConnection, None] = {}  # connections to dispatch to next turn
        self._turn_scheduled = False
        # the disk was found full: sends are neither stored nor answered (the client's send timeout
        # fires) until a probe finds room, then connections that went unanswered are closed, and
        # their clients resend what they still hold
        self.out_of_space = False
        self._space_probed_at = 0.0
        self._space_watch: asyncio.Task | None = None
        self._input_paused: set[BrokerConnection] = set()
        # what hostile or slow clients cost: refused/closed connections, pauses, peak output held
        self.counters: collections.Counter[str] = collections.Counter()
        self._last_refusal_log = -1.0
        self._logged_suppressed = 0
        self._sweeper: asyncio.Task | None = None
        auth_tokens = settings.auth_tokens
        if auth_tokens is not None and (not auth_tokens or any(not token for token in auth_tokens)):
            raise ValueError("auth tokens must be non-empty strings (an empty one would admit a CONNECT without a token)")
        self.auth_tokens = None if auth_tokens is None else [t.encode() for t in auth_tokens]
        self.auth_basic = settings.auth_basic  # username -> password
        self.auth_tls = settings.auth_tls  # accept a client certificate the TLS listener verified
        self.max_message_size = settings.max_message_size
        self.keep_alive_interval = settings.keep_alive_interval
        self.connections: set[BrokerConnection] = set()
        self.lookup_url = ""  # what lookups answer: this broker, or a proxy in front of it
        self.service_url_tls = ""
        # Pulsar's advertisedListeners: name -> the pulsar:// or pulsar+ssl:// URL a lookup naming
        # that listener answers (a lookup naming another listener fails, as in Pulsar)
        self.advertised_listeners: dict[str, str] = dict(settings.advertised_listeners or {})
        # Pulsar's anonymousUserRole: the role of a CONNECT offering no credentials, or offering
        # them by a method this broker does not serve (None: such a CONNECT is refused)
        self.anonymous_role: str | None = settings.anonymous_role
        # authorization (Pulsar's authorizationEnabled), on when grants is not None: a role may
        # look up, produce and consume in a namespace granted to it; super users everywhere
        self.grants: dict[str, frozenset[str]] | None = None if settings.grants is None else {
            namespace: frozenset(roles) for namespace, roles in settings.grants.items()}
        self.super_user_roles: frozenset[str] = frozenset(settings.super_user_roles)

    @property
    def max_connections_per_address(self) -> int:
        """Connections one peer address may hold (default: half of max_connections, at least 8)."""
        if self._max_per_address is not None:
            return self._max_per_address
        return max(8, self.max_connections // 2)

    @property
    def max_unauthenticated(self) -> int:
        """Connections that have not CONNECTed (or were refused authentication) held at once: the
        rest of max_connections is kept for those that have."""
        return max(1, self.max_connections - int(self.max_connections * self.authenticated_share))

    def admit(self, conn: "BrokerConnection") -> str | None:
        """Take a place for a new connection, or say why there is none (its peer address holds its
        share, or every place is held by a connection past CONNECT). When the places connections
        before CONNECT may hold are taken, or all are, the one that has waited longest makes room:
        connections that never CONNECT cannot lock a client out, as a client CONNECTs at once."""
        if conn.address is not None and self.per_address[conn.address] >= self.max_connections_per_address:
            self.counters["refused_address_connections"] += 1
            return (f"too many connections from {conn.address}: at most {self.max_connections_per_address} "
                    "from one address")
        if len(self.connections) >= self.max_connections or len(self.unauthenticated) >= self.max_unauthenticated:
            if not self.unauthenticated:
                self.counters["refused_connections"] += 1
                return f"too many connections: this broker serves at most {self.max_connections}"
            oldest = next(iter(self.unauthenticated))
            self.counters["displaced_unauthenticated_connections"] += 1
            oldest.displace(f"too many connections waiting to CONNECT: this one waited longest of "
                            f"{len(self.unauthenticated)}")
        self.connections.add(conn)
        self.unauthenticated[conn] = None
        if conn.address is not None:
            self.per_address[conn.address] += 1
        return None

    def release(self, conn: "BrokerConnection") -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.unauthenticated.pop(conn, None)
            if conn.address is not None:
                self.per_address[conn.address] -= 1
                if self.per_address[conn.address] <= 0:
                    del self.per_address[conn.address]

    def dispatched(self, size: int) -> None:
        self.turn_bytes += size
        if not self._turn_scheduled:
            self._turn_scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def wait_for_turn(self, conn: "BrokerConnection") -> None:
        self._turn_waiting[conn] = None
        if not self._turn_scheduled:
            self._turn_scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A new turn: dispatch to the connections that waited for it, first come first served (those
        that do not get theirs in this turn wait for the next)."""
        self._turn_scheduled = False
        self.turn_bytes = 0
        waiting, self._turn_waiting = self._turn_waiting, {}
        for conn in waiting:
            if self.turn_bytes >= DISPATCH_BYTES_PER_TURN:
                self._turn_waiting[conn] = None
            elif not conn.closed:
                conn.redispatch()
        if self._turn_waiting and not self._turn_scheduled:
            self._turn_scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def output_changed(self, delta: int) -> None:
        """A connection's unsent output grew or shrank by `delta`: squeeze or relax the broker."""
        self.output_total += delta
        if not self.squeezed:
            if self.output_total > self.max_total_output_bytes:
                self.squeezed = True
                self.counters["output_budget_squeezes"] += 1
                self.log_refusal(f"unsent output of all connections is over {self.max_total_output_bytes} "
                                 "bytes: connections holding output get no more until they take it")
                for conn in list(self.connections):
                    conn.squeeze()
        elif delta < 0 and self.output_total <= self.max_total_output_bytes * RELAX_BELOW:
            self.squeezed = False
            for conn in list(self.connections):
                conn.relax()

    def storage_failed(self, error: BaseException) -> None:
        """A send was not stored: when for want of space, the broker is out of space until a probe
        finds room again."""
        if self.out_of_space or not _out_of_space(error):
            return
        self.out_of_space = True
        self._space_probed_at = time.monotonic()
        self.counters["out_of_space"] += 1
        log.error("the disk is full: sends are not stored, nor answered, until it has room again (%s)", error)
        if self._space_watch is None or self._space_watch.done():
            self._space_watch = asyncio.ensure_future(self._watch_space())

    def still_out_of_space(self) -> bool:
        """Whether sends that arrived must still wait: a probe for each arrival (one per run of sends
        read together), so that sends arriving once room returned are stored at once."""
        if self.out_of_space:
            self._probe_space()
        return self.out_of_space

    def _probe_space(self) -> None:
        self._space_probed_at = time.monotonic()
        if not _has_room(self.core.files.ops, os.path.join(self.core.data_dir, ".space-probe")):
            return
        self.out_of_space = False
        unanswered = [conn for conn in self.connections if conn.unanswered_sends]
        log.warning("the disk has room again: storing; closing %d connections whose sends went unanswered "
                    "(their clients send them again)", len(unanswered))
        for conn in unanswered:
            conn.close()

    async def _watch_space(self) -> None:
        try:
            while self.out_of_space:
                await asyncio.sleep(SPACE_PROBE_INTERVAL)
                if self.out_of_space:
                    self._probe_space()
        except asyncio.CancelledError:
            pass

    def refusal_frame(self) -> bytes:
        """What a connection refused before it is served is sent: ServiceNotReady."""
        cmd = T(type=T.ERROR, error=pb.CommandError(request_id=_U64, error=pb.ServiceNotReady,
                                                    message="no room for another connection: try again later"))
        return codec.encode_command(cmd)

    def log_refusal(self, message: str) -> None:
        """A warning about a refused connection, at most one a second: a flood must not flood the log
        (the counters count every one)."""
        now = time.monotonic()
        if now - self._last_refusal_log >= 1.0:
            suppressed = self.counters["refusals_not_logged"] - self._logged_suppressed
            self._logged_suppressed = self.counters["refusals_not_logged"]
            log.warning("%s%s", message, f" ({suppressed} more refused since the last warning)" if suppressed else "")
            self._last_refusal_log = now
        else:
            self.counters["refusals_not_logged"] += 1

    @property
    def auth_enabled(self) -> bool:
        return self.auth_tokens is not None or self.auth_basic is not None or self.auth_tls

    def authenticate(self, method: str, data: bytes, peer_certificate: dict | None) -> str | None:
        """The role a CONNECT proves, or None. Methods: token, basic (`user:password`), tls."""
        if method == "token" and self.auth_tokens is not None:
            # compare with every token, so the time taken does not tell which one nearly matched
            matched = [hmac.compare_digest(data, token) for token in self.auth_tokens]
            return token_role(data) if data and any(matched) else None
        if method == "basic" and self.auth_basic is not None:
            user, sep, password = data.decode("utf-8", "replace").partition(":")
            expected = self.auth_basic.get(user)
            if sep and expected is not None and hmac.compare_digest(expected.encode(), password.encode()):
                return user
            return None
        if method == "tls" and self.auth_tls and peer_certificate:
            subject = dict(pair for rdn in peer_certificate.get("subject", ()) for pair in rdn)
            return subject.get("commonName", "tls")
        return None

    def serves_method(self, method: str) -> bool:
        return (method == "token" and self.auth_tokens is not None) or \
            (method == "basic" and self.auth_basic is not None) or (method == "tls" and self.auth_tls)

    def authorized(self, role: str | None, topic_or_namespace: str) -> bool:
        """Whether `role` may use the namespace of a topic (or the namespace named)."""
        if self.grants is None or role in self.super_user_roles:
            return True
        return role is not None and role in self.grants.get(namespace_of(topic_or_namespace), ())

    def protocol(self, ssl_context: ssl.SSLContext | None = None) -> Callable[[], "BrokerConnection"]:
        """Connections of a listener; with `ssl_context` each does its TLS handshake after it is
        accepted, so a handshake counts against the connection limit and the handshake timeout
        from the first byte (a listener made with ssl= would hide it until it completes)."""
        return lambda: BrokerConnection(self, ssl_context)

    def close_all(self) -> None:
        if self._space_watch is not None:
            self._space_watch.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self.connections):
            conn.close()

    def stats(self) -> dict[str, int]:
        """The counters, plus what live connections hold now: unsent output and unfinished input."""
        live = list(self.connections)
        return dict(self.counters, connections=len(live), unauthenticated_connections=len(self.unauthenticated),
                    max_total_output_bytes=self.max_total_output_bytes, squeezed=int(self.squeezed),
                    output_bytes=sum(c.output_bytes for c in live),
                    input_bytes=self.input_bytes,
                    paused_connections=sum(1 for c in live if not c.writable))

    def release_input(self) -> None:
        """Let connections paused for the input budget read again once half of it is free."""
        if self._input_paused and self.input_bytes <= self.max_input_bytes // 2:
            paused, self._input_paused = self._input_paused, set()
            for conn in paused:
                conn.set_input_paused(False)

    def watch(self) -> None:
        """Start the sweep that closes connections past their handshake or frame deadline."""
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.ensure_future(self._sweep())

    async def _sweep(self) -> None:
        step = max(0.05, min(1.0, self.handshake_timeout / 4, self.frame_timeout / 4, self.idle_timeout / 4))
        try:
            while True:
                await asyncio.sleep(step)
                now = time.monotonic()
                for conn in list(self.connections):
                    try:
                        conn.measure_output()  # what drained since its last write
                        conn.check_deadlines(now)
                    except Exception as exc:  # noqa: BLE001 - the sweep must outlive any one connection
                        log.error("closing a connection: its deadline check failed: %s: %s",
                                  type(exc).__name__, exc)
                        conn.close(abort=True)
                self.release_input()
        except asyncio.CancelledError:
            pass


class PulsarConsumer(ConsumerLink):
    def __init__(self, conn: "BrokerConnection", consumer_id: int, subscription: Subscription,
                 name: str, priority: int) -> None:
        super().__init__(subscription, name, priority)
        self.conn = conn
        self.consumer_id = consumer_id
        self.topic = subscription.topic

    @property
    def writable(self) -> bool:
        conn = self.conn
        service = conn.service
        if service.turn_bytes >= DISPATCH_BYTES_PER_TURN and conn.writable:
            service.wait_for_turn(conn)
            return False
        return conn.writable and (not service.squeezed or conn.takes_output())

    def deliver(self, entry: Entry, redelivery_count: int, ack_set: list[int] | None) -> None:
        cmd = pb.BaseCommand(type=pb.BaseCommand.MESSAGE)
        m = cmd.message
        m.consumer_id = self.consumer_id
        topic = self.topic
        entry_id = entry.entry_id
        m.message_id.ledgerId = topic.ledger_id if entry_id >= topic.ledger_start else topic.ledger_of(entry_id)
        m.message_id.entryId = entry_id
        if topic.partition >= 0:  # as Pulsar: the official client's ids take their partition from here
            m.message_id.partition = topic.partition
        if redelivery_count:
            m.redelivery_count = redelivery_count
        if ack_set:
            m.ack_set.extend(ack_set)
        body = entry.body
        conn = self.conn
        conn.service.dispatched(conn.write_entry(codec.encode_payload_frame_head(cmd, len(body), entry.checksum), body))

    def active_changed(self, active: bool) -> None:
        self.conn.command(T.ACTIVE_CONSUMER_CHANGE, "active_consumer_change",
                          pb.CommandActiveConsumerChange(consumer_id=self.consumer_id, is_active=active))

    def reached_end_of_topic(self) -> None:
        self.conn.command(T.REACHED_END_OF_TOPIC, "reachedEndOfTopic",
                          pb.CommandReachedEndOfTopic(consumer_id=self.consumer_id))

    def evict(self) -> None:
        self.conn.evict_consumer(self)


class PulsarProducer(ProducerLink):
    def __init__(self, conn: "BrokerConnection", producer_id: int, topic: Topic, name: str) -> None:
        self.conn = conn
        self.producer_id = producer_id
        self.topic = topic
        self.name = name
        self.epoch: int | None = None  # the topic epoch an exclusive producer holds the topic at
        self.schema_version: bytes | None = None  # of the schema it declared, if any

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return self.conn.closed

    def evict(self) -> None:
        self.conn.producers.pop(self.producer_id, None)
        self.conn.waiting_producers.pop(self.producer_id, None)
        self.conn.command(T.CLOSE_PRODUCER, "close_producer",
                          pb.CommandCloseProducer(producer_id=self.producer_id, request_id=0))


class BrokerConnection(asyncio.Protocol):
    def __init__(self, service: PulsarService, ssl_context: ssl.SSLContext | None = None) -> None:
        self.service = service
        self.core = service.core
        self.tls = ssl_context is not None
        self._ssl_context = ssl_context
        self._handshake: asyncio.Task | None = None  # the TLS handshake, while it runs
        self._tls_buffer = 0  # bytes of the TLS session's read buffer, counted in the output budget
        self._early_input: list[bytes] = []
        self._adapt_reads = False  # set once connected: reads grow for bulk flows (reads.adapt_reads)
        self._socket_fd: int | None = None
        self.transport: asyncio.Transport | None = None
        self.reader = codec.FrameReader(service.max_message_size + codec.FRAME_PADDING, send_fast_path=True)
        self.connected = False
        self.refused = ""  # why authentication failed: every request is answered with that error
        self.role: str | None = None  # the role its CONNECT proved (with auth on)
        self.closed = False
        # False while unsent output is over the budget: no dispatch to it, no reading from it
        self.writable = True
        self.producers: dict[int, PulsarProducer] = {}
        self.waiting_producers: dict[int, PulsarProducer] = {}  # WaitForExclusive, not yet granted
        self.consumers: dict[int, PulsarConsumer] = {}
        self.last_received = time.monotonic()
        self.accepted_at = self.last_received
        self.last_request = self.last_received  # the last request but PING and PONG
        self.address: str | None = None  # the peer's address, for its share of the connections
        self._partial_since: float | None = None  # when the unfinished frame in the reader began
        self._keepalive: asyncio.Task | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._transport_bytes = 0  # the transport's buffer at the last flush: it only drains until the next
        self._flush_scheduled = False
        # receipts in _out wait on their group commit: (index in _out, batch, producer, sequence id)
        self._sends: list[tuple] = []
        self._batches: list = []  # the distinct commit batches those receipts belong to
        self._transport_paused = False  # between the transport's pause_writing and resume_writing
        self._input_paused = False  # while unfinished frames of all connections are over their budget
        self._input_held = 0  # this connection's share of service.input_bytes
        self._output_held = 0  # this connection's share of service.output_total
        self._backlog_retry: asyncio.TimerHandle | None = None  # a dispatch once the kernel sent more
        self._backlog_wait = 0.0
        self.unanswered_sends = 0  # sends dropped while the disk was full: closed once it has room
        self._reading = True
        self._yielding = False  # handled MAX_REQUESTS_PER_TURN requests: the rest in the next turn
        # requests waiting for their topic to open, by (command type, producer or consumer id)
        self._opening: set[tuple[int, int]] = set()
        self._opened_frame: Any = None  # the request being handled again, its topic open

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # a server's connection: a stream transport
        self.transport = transport
        self._adapt_reads = tune_reads(transport)
        # a plain socket's descriptor, for write_entry (a TLS connection writes through its transport)
        sock = transport.get_extra_info("socket") if self._adapt_reads and hasattr(os, "writev") else None
        self._socket_fd = sock.fileno() if sock is not None else None
        service = self.service
        self.relax()
        peer = transport.get_extra_info("peername")
        self.address = peer[0] if isinstance(peer, tuple) and peer else None
        refusal = service.admit(self)
        if refusal is not None:
            service.log_refusal(f"refusing a connection: {refusal}")
            if self.tls:  # no TLS session to answer in: a refusal costs no handshake
                self.close(abort=True)
                return
            self._error(_U64, pb.ServiceNotReady, refusal)
            self.close()
            return
        self.reader.max_frame_size = service.max_frame_before_connect
        service.watch()
        self._keepalive = asyncio.ensure_future(self._keep_alive())
        if self.tls:
            transport.pause_reading()  # start_tls takes the bytes from here on
            self._tls_buffer = TLS_READ_BUFFER_BYTES  # held from now on: counted in the output budget
            service.output_changed(TLS_READ_BUFFER_BYTES)
            self._handshake = asyncio.ensure_future(self._start_tls(transport))

    def displace(self, reason: str) -> None:
        """Close a connection that has not CONNECTed to make room for a newer one."""
        self.service.log_refusal(f"closing a connection: {reason}")
        if self._handshake is not None:  # no TLS session yet to answer in
            self.close(abort=True)
            return
        self._error(_U64, pb.ServiceNotReady, reason)
        self.close()

    async def _start_tls(self, raw: asyncio.Transport) -> None:
        """The server side of the TLS handshake, within what is left of the handshake timeout (the
        sweep also closes a connection that has not CONNECTed by then)."""
        service = self.service
        left = service.handshake_timeout - (time.monotonic() - self.accepted_at)
        assert self._ssl_context is not None  # only a TLS listener's connections start TLS
        try:
            transport = await start_tls_server(raw, self, self._ssl_context, max(left, 0.01))
        except asyncio.CancelledError:
            raw.abort()
            raise
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as exc:
            service.counters["tls_handshake_failures"] += 1
            log.info("TLS handshake failed: %s", exc)
            raw.abort()
            self._cleanup()
            return
        finally:
            self._handshake = None
        if transport is None:  # the socket closed during the handshake
            self._cleanup()
            return
        if self.closed:
            transport.abort()
            return
        self.transport = transport
        self._adapt_reads = False  # the TLS transport reads into its own buffer
        self._socket_fd = None  # and writes what it encrypts
        self.relax()
        early, self._early_input = self._early_input, []
        for data in early:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._handshake is not None:
            # TLS bytes that came with the handshake's end, before start_tls returned the transport
            # to answer on: read once it has
            self._early_input.append(data)
            return
        now = self.last_received = time.monotonic()
        if self._adapt_reads:
            adapt_reads(self.transport, len(data), BROKER_BULK_READ_SIZE)
        try:
            self.reader.feed(data)
        except PulsarWireError as exc:
            log.warning("closing connection: %s", exc)
            self.close()
            return
        if self._partial_since is None:
            self._partial_since = now
        self._process()

    def _process(self) -> None:
        """Handle the complete frames the reader holds, stopping while output is over budget.
        Plain Send frames read one after another are stored together (the hot path), before
        anything read after them is handled."""
        completed = False
        send_frame = codec.SendFrame
        sends: list = []
        handled = 0
        turn_ends = time.perf_counter() + MAX_SECONDS_PER_TURN
        try:
            while self.writable and not self.closed and len(self._opening) < MAX_OPENS_PER_CONNECTION:
                if handled >= MAX_REQUESTS_PER_TURN or (handled & 15 == 15 and time.perf_counter() > turn_ends):
                    self._yield_turn()  # the rest in the next turn: other connections go first
                    break
                try:
                    frame = self.reader.next_frame()
                except (ChecksumMismatchError, BadMetadataError) as exc:
                    self._store_sends(sends)
                    command = getattr(exc, "command", None)
                    if command is not None and command.type == T.SEND:
                        self._send_error(command.send.producer_id, command.send.sequence_id,
                                         pb.ChecksumError, str(exc))
                        continue
                    raise
                if frame is None:
                    break
                completed = True
                if type(frame) is send_frame and self.connected and not self.refused:
                    sends.append(frame)  # a plain Send frame read by the codec's fast path
                    if len(sends) >= MAX_SEND_RUN:
                        self._store_sends(sends)
                    continue
                self._store_sends(sends)
                if type(frame) is send_frame:
                    if not self.connected:
                        raise PulsarWireError("SEND before CONNECT")
                    self._send_error(frame.producer_id, frame.sequence_id, pb.AuthenticationError, self.refused)
                else:  # not a SendFrame: mypy narrows `type(frame) is` only where it holds
                    self._handle(frame)  # type: ignore[arg-type]
                    handled += 1
            self._store_sends(sends)
        except PulsarWireError as exc:
            self._store_sends(sends)
            if isinstance(exc, FrameTooLargeError) and not self.connected:
                self.service.counters["oversized_frames_before_connect"] += 1
            log.warning("closing connection: %s", exc)
            self.close()
        except Exception as exc:  # noqa: BLE001 - a defect costs this connection, never the loop's log
            # sends read but not stored get no receipt: the client resends them on its next connection
            sends.clear()
            self.service.counters["failed_connections"] += 1
            log.error("closing a connection after an internal error: %s: %s", type(exc).__name__, exc)
            log.debug("internal error", exc_info=True)
            self.close()
        if not self.reader.buffered:
            self._partial_since = None
        elif completed:  # the unfinished frame began after the last complete one
            self._partial_since = time.monotonic()
        if not self.closed:
            self._account_input()
        self.flush()

    def _yield_turn(self) -> None:
        """Stop reading until the next turn of the event loop, then handle the frames held."""
        if not self._yielding:
            self._yielding = True
            self._set_reading()
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._yielding = False
        if not self.closed:
            self._process()
            self._set_reading()

    def _peer_closed(self) -> bool:
        """Whether the peer has shut down its side: asyncio cannot see that while reading is paused."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None or not hasattr(select, "POLLRDHUP"):
            return False  # the frame timeout still bounds what it holds
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLRDHUP)
        return any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR)
                   for _, events in poller.poll(0))

    def check_deadlines(self, now: float) -> None:
        """Close a connection that has not completed its handshake, or whose frame is too slow;
        and one paused for reading whose peer has gone, so what it holds is freed at once."""
        service = self.service
        if not self._reading and self._peer_closed():
            self.close(abort=True)
        elif (not self.connected or self.refused) and now - self.accepted_at > service.handshake_timeout:
            service.counters["handshake_timeouts"] += 1
            log.warning("closing a connection %s after %.0fs", "refused authentication" if self.refused
                        else "that did not CONNECT", service.handshake_timeout)
            self.close(abort=True)
        elif self.writable and self._partial_since is not None and self.reader.buffered and \
                now - self._partial_since > service.frame_timeout:
            service.counters["frame_timeouts"] += 1
            log.warning("closing a connection whose frame took over %.0fs (%d bytes arrived)",
                        service.frame_timeout, self.reader.buffered)
            self.close(abort=True)
        elif now - self.last_request > service.idle_timeout and not self.producers and not self.consumers \
                and not self.waiting_producers:
            # past CONNECT, holding nothing and asking nothing: its place goes to another client (a
            # client opens a new connection when it needs one)
            service.counters["idle_timeouts"] += 1
            log.info("closing a connection idle for %.0fs", service.idle_timeout)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cleanup()

    def pause_writing(self) -> None:
        self._transport_paused = True
        self._pause()

    def resume_writing(self) -> None:
        self._transport_paused = False
        self.measure_output()
        self._resume()

    def squeeze(self) -> None:
        """The broker is over its total output budget: pause (no dispatch, no reading) as soon as
        anything is unsent, and resume only once all of it is sent."""
        if self.transport is not None and not self.closed and self._handshake is None:
            self.transport.set_write_buffer_limits(high=0, low=0)

    def relax(self) -> None:
        """This connection's own output budget, or the squeeze while the broker is squeezed."""
        if self.transport is None or self.closed or self._handshake is not None:
            return
        if self.service.squeezed:
            self.transport.set_write_buffer_limits(high=0, low=0)
        else:
            budget = self.service.max_output_bytes
            self.transport.set_write_buffer_limits(high=budget, low=budget // 2)

    def takes_output(self) -> bool:
        """While the broker is squeezed: whether this connection holds no unsent output and its
        peer is taking what the kernel holds for it, so an entry sent now will not stay in memory
        here (a consumer that does not read gets nothing more)."""
        if self._output_held or self._out_bytes:
            return False  # resume_writing dispatches again once all is sent
        if _kernel_backlog(self.transport) < SQUEEZED_OUTPUT_BYTES:
            self._backlog_wait = 0.0
            return True
        if self._backlog_retry is None:  # nothing else would tell when the kernel has sent it
            self._backlog_wait = min(max(2 * self._backlog_wait, 0.005), 0.5)
            self._backlog_retry = asyncio.get_running_loop().call_later(self._backlog_wait, self._backlog_sent)
        return False

    def _backlog_sent(self) -> None:
        self._backlog_retry = None
        self.redispatch()

    def redispatch(self) -> None:
        """Dispatch to this connection's consumers again (its turn came, or the kernel sent more)."""
        if not self.closed and self.writable:
            for consumer in list(self.consumers.values()):
                consumer.subscription.dispatch()
            self.flush()

    def measure_output(self) -> None:
        """Count what this connection holds unsent in the broker-wide output total."""
        held = 0 if self.closed or self.transport is None else \
            self._out_bytes + self.transport.get_write_buffer_size()
        if held != self._output_held:
            delta, self._output_held = held - self._output_held, held
            self.service.output_changed(delta)

    def _resume_unless_transport_paused(self) -> None:
        if not self._transport_paused:
            self._resume()

    def _set_reading(self) -> None:
        """Read while output is under its budget and the broker-wide input budget allows."""
        reading = self.writable and not self._input_paused and not self._yielding and \
            len(self._opening) < MAX_OPENS_PER_CONNECTION
        if reading != self._reading and self.transport is not None and not self.closed:
            self._reading = reading
            if reading:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def set_input_paused(self, paused: bool) -> None:
        self._input_paused = paused
        if not paused and self._partial_since is not None:
            self._partial_since = time.monotonic()  # it was waiting for us, not the client for it
        self._set_reading()

    def _account_input(self) -> None:
        """Count this connection's unfinished frame in the broker-wide input budget; pause its reading
        while the budget is spent (complete small frames never hold input, so they still pass)."""
        service = self.service
        held = self.reader.buffered
        service.input_bytes += held - self._input_held
        freed = held < self._input_held
        self._input_held = held
        if held and not self._input_paused and service.input_bytes > service.max_input_bytes:
            service.counters["input_pauses"] += 1
            service._input_paused.add(self)
            self.set_input_paused(True)
        elif freed:
            service.release_input()

    def _pause(self) -> None:
        if self.writable:
            self.writable = False
            self.service.counters["output_pauses"] += 1
            self._set_reading()

    def _resume(self) -> None:
        if self.writable or self.closed:
            return
        self.writable = True
        self._set_reading()
        if self._partial_since is not None:
            self._partial_since = time.monotonic()  # the client may have been stalled by us
        for consumer in list(self.consumers.values()):
            consumer.subscription.dispatch()
        self._process()  # frames read before the pause

    # output

    @property
    def output_bytes(self) -> int:
        """Output queued and not yet taken by the socket."""
        transport = self.transport
        buffered = transport.get_write_buffer_size() if transport is not None and not self.closed else 0
        return self._out_bytes + buffered

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if len(data) >= DIRECT_WRITE_BYTES and not self._out and self.transport is not None:
            self._write_now(data)
            return
        self._out.append(data)
        self._queued(len(data))

    def _write_now(self, head: bytes, body: bytes | memoryview = b"") -> None:
        """A big frame (a consumer's entry: `head` then the stored `body`) with nothing queued
        before it: to the transport at once. Queued for the flush at the end of the loop's turn,
        a FLOW's whole answer (a megabyte of 1 KiB messages) left in one write, joined first,
        after every entry of it was read and framed: the consumer waited some 0.5 ms for its
        first entry, and its permits came back that much later. On a plain socket the two go in
        one writev from where they lie: joined into a frame of their own first, a 1 KiB-message
        backlog's every byte was copied once more on the loop (half of the broker's memory
        copying); what the socket does not take is copied into the transport's buffer."""
        self.core.commit()  # as flush(): nothing leaves before what was appended is written
        transport = self.transport
        assert transport is not None  # checked by the callers
        sent = 0
        if body and self._socket_fd is not None and not transport.get_write_buffer_size() \
                and not transport.is_closing():
            try:
                sent = os.writev(self._socket_fd, (head, body))
            except OSError:  # it would block; or it failed, and the transport's write below fails too and closes
                pass
        if sent < len(head):
            transport.write(head[sent:])
            if body:
                transport.write(body)
        elif sent < len(head) + len(body):
            transport.write(memoryview(body)[sent - len(head):])
        if self.writable and self._took_output(transport) > self._output_budget():
            self._pause()
        self._settle_output()

    def write_entry(self, head: bytes, body: bytes | memoryview) -> int:
        """A consumer's entry frame: `head` (codec.encode_payload_frame_head) then the stored
        `body`, not joined where it can go to the socket at once (_write_now); the frame's size."""
        size = len(head) + len(body)
        if size >= DIRECT_WRITE_BYTES and self._socket_fd is not None and not self._out \
                and self.transport is not None and not self.closed:
            self._write_now(head, body)
        else:
            self.write(head + body)
        return size

    def _output_budget(self) -> int:
        return SQUEEZED_OUTPUT_BYTES if self.service.squeezed else self.service.max_output_bytes

    def _took_output(self, transport: asyncio.Transport) -> int:
        """What the transport holds unsent after a write (kept, and its peak counted)."""
        self._transport_bytes = output = transport.get_write_buffer_size()
        if output > self.service.counters["peak_connection_output_bytes"]:
            self.service.counters["peak_connection_output_bytes"] = output
        return output

    def _settle_output(self) -> None:
        """After a write: the broker-wide output total, and a resume where only the budget paused."""
        self.measure_output()
        if not self.writable and not self.closed and not self._transport_paused:
            # the transport holds at most the budget and will send no resume_writing: resume
            # (scheduled, as flush runs inside _process)
            asyncio.get_running_loop().call_soon(self._resume_unless_transport_paused)

    def _queued(self, size: int) -> None:
        """`size` bytes were put in self._out: pause past the output budget, schedule a flush."""
        self._out_bytes += size
        budget = self._output_budget()
        if self.writable and self._out_bytes + self._transport_bytes > budget:
            self._transport_bytes = self.transport.get_write_buffer_size() if self.transport is not None else 0
            if self._out_bytes + self._transport_bytes > budget:
                self._pause()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.closed:
            self.core.commit()  # nothing is acknowledged before it is written
            if self._sends and any(batch.error is not None for batch in self._batches):
                self._fail_uncommitted_sends()
            self.transport.writelines(self._out)
            self._out_bytes = 0
            self._took_output(self.transport)
        self._out.clear()
        self._sends.clear()
        self._batches.clear()
        self._out_bytes = 0
        self._settle_output()

    def _leave_unanswered(self, count: int) -> None:
        """Sends that arrived while the disk is full: not stored and not answered, so that a
        client's send timeout reports them (a SendError makes common clients reconnect and resend at
        once, over and over, and their timeouts never fire); the connection is closed once the disk
        has room, and its client resends what it still holds."""
        self.unanswered_sends += count
        self.service.counters["unanswered_sends"] += count

    def _fail_uncommitted_sends(self) -> None:
        """The file system refused a group commit: each of its sends is answered SendError
        in place of its receipt (the log and the dedup state were rolled back)."""
        for index, batch, producer_id, sequence_id in self._sends:
            if batch.error is not None:
                self.service.storage_failed(batch.error)
                cmd = T(type=T.SEND_ERROR)
                cmd.send_error.CopyFrom(pb.CommandSendError(
                    producer_id=producer_id, sequence_id=sequence_id, error=pb.PersistenceError,
                    message=f"not stored: {batch.error}"))
                self._out[index] = codec.encode_command(cmd)

    def command(self, kind: Any, field: str, sub: Message) -> None:
        cmd = T(type=kind)
        getattr(cmd, field).CopyFrom(sub)
        self.write(codec.encode_command(cmd))

    def close(self, abort: bool = False) -> None:
        """Close after sending what is queued; `abort` drops it. A peer that does not read what is
        left within CLOSE_GRACE is aborted, so its unsent output is freed."""
        close_transport(self.transport, abort, self.flush)
        self._cleanup()

    def _cleanup(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.writable = False
        # hand back what this connection held: unread input, unsent output
        self.reader = _CLOSED_READER
        self.service.input_bytes -= self._input_held
        self._input_held = 0
        self.service._input_paused.discard(self)
        self.service.release_input()
        self._out.clear()
        self._out_bytes = 0
        self.measure_output()  # closed: gives back all it held
        if self._tls_buffer:
            self.service.output_changed(-self._tls_buffer)
            self._tls_buffer = 0
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._handshake is not None:
            self._handshake.cancel()
        if self._backlog_retry is not None:
            self._backlog_retry.cancel()
        self.service.release(self)
        for producer in list(self.producers.values()) + list(self.waiting_producers.values()):
            producer.topic.remove_producer(producer)
        self.producers.clear()
        self.waiting_producers.clear()
        for consumer in list(self.consumers.values()):
            consumer.subscription.detach(consumer)
        self.consumers.clear()

    async def _keep_alive(self) -> None:
        interval = self.service.keep_alive_interval
        try:
            while not self.closed:
                await asyncio.sleep(interval)
                if time.monotonic() - self.last_received > 2 * interval:
                    log.info("closing a connection silent for %.0fs", 2 * interval)
                    self.close()
                    return
                if self.connected:
                    self.command(T.PING, "ping", pb.CommandPing())
        except asyncio.CancelledError:
            pass

    # dispatch by command type; before CONNECTED only CONNECT is allowed

    def _handle(self, frame: codec.Frame) -> None:
        kind = frame.command.type
        if kind != T.PING and kind != T.PONG:
            self.last_request = time.monotonic()
        if not self.connected and kind != T.CONNECT:
            raise PulsarWireError(f"command {kind} before CONNECT")
        if self.refused and kind not in (T.PING, T.PONG):
            self._refuse(frame.command)
            return
        if self.service.grants is not None and kind in _AUTHORIZED:
            target = _AUTHORIZED[kind](frame.command)
            if not self.service.authorized(self.role, target) and self._tenant_exists(target):
                self._fail_request(frame.command, pb.AuthorizationError,
                                   f"role {self.role!r} is not authorized on {namespace_of(target)[:128]}")
                return
        handler = _HANDLERS.get(kind)
        if handler is None:
            log.info("unsupported command %s", kind)
            request_id = _request_id(frame.command)
            if request_id is not None:
                self._error(request_id, pb.NotAllowedError, f"command {kind} is not supported")
            return
        if kind not in _WITHOUT_TEXT:
            undecodable = _undecodable_text(frame.command)
            if undecodable is not None:
                if kind == T.CONNECT:
                    raise PulsarWireError(f"CONNECT's {undecodable} is not UTF-8")
                self._fail_request(frame.command, pb.InvalidTopicName if "topic" in undecodable.lower()
                                   else pb.MetadataError, f"{undecodable} is not UTF-8 text")
                return
        try:
            handler(self, frame)
        except PulsarWireError:
            raise  # a protocol violation: the connection closes
        except Exception as exc:  # noqa: BLE001 - a request fails alone, never the connection
            code = _error_code(exc)
            # the file system refused (no descriptors left, disk full), a name or a metadata file
            # is bad, or a defect: the request is answered with a typed error at once (not left to
            # the client's timeout) and the connection stays up for the client to retry
            log.log(logging.INFO if code == pb.InvalidTopicName else logging.ERROR, "%s failed: %s: %s",
                    T.Type.Name(kind), type(exc).__name__, exc)
            log.debug("%s failed", T.Type.Name(kind), exc_info=True)
            self.service.counters["failed_requests"] += 1
            self._fail_request(frame.command, code, f"{pb.ServerError.Name(code)}: {exc}")

    def _error(self, request_id: int, code: Any, message: str) -> None:
        self.command(T.ERROR, "error", pb.CommandError(request_id=request_id, error=code, message=message))

    def _opens_topic(self, frame: codec.Frame, name: str, key: tuple[int, int]) -> bool:
        """Whether the request must wait for its topic to open: it is opened off the event loop
        and the request handled again once it is (answers go by request id, so later requests
        may be answered first; a producer's sends wait for its answer anyway)."""
        if frame is self._opened_frame or key in self._opening or not self.core.needs_opening(name) or \
                not self._tenant_exists(name):
            return False
        self._opening.add(key)
        if len(self._opening) >= MAX_OPENS_PER_CONNECTION:
            self._set_reading()  # its frames wait until one of its topics is open
        asyncio.ensure_future(self._handle_once_open(frame, name, key))
        return True

    async def _handle_once_open(self, frame: codec.Frame, name: str, key: tuple[int, int]) -> None:
        try:
            await self.core.open_topic(name)
        except Exception:  # noqa: BLE001 - handled again, the topic's own open answers the error
            pass
        self._handle_again(frame, key)

    def _waits_for_write(self, frame: codec.Frame, key: tuple[int, int], request_id: int,
                         written: concurrent.futures.Future | None) -> bool:
        """Whether the request must wait for a metadata write it made (None: none to wait for): the
        event loop goes on meanwhile and the request is handled again once it is on disk, or
        answered PersistenceError if it could not be written."""
        def failed(error: BaseException) -> None:
            self._error(request_id, pb.PersistenceError, f"not stored: {error}")
            self.flush()
        return self._handled_again_after(frame, key, written, failed)

    def _waits_for_read(self, frame: codec.Frame, key: tuple[int, int],
                        pending: concurrent.futures.Future | None) -> bool:
        """Whether the request must wait for a disk read it needs (None: none, TopicLog.read_pending):
        the event loop goes on meanwhile and the request is handled again once the read landed
        (one that failed is read again then, and its error answered)."""
        return self._handled_again_after(frame, key, pending, None)

    def _handled_again_after(self, frame: codec.Frame, key: tuple[int, int], future: concurrent.futures.Future | None,
                             failed: Callable[[BaseException], None] | None) -> bool:
        """Whether the request waits for `future` (None: nothing to wait for): it is handled again
        once that is done; `failed` answers it instead when the future failed (None: handled again)."""
        if future is None or key in self._opening:
            return False
        self._opening.add(key)

        def done(result: asyncio.Future) -> None:
            error = None if result.cancelled() else result.exception()  # retrieved either way
            if error is not None and failed is not None and key in self._opening and not self.closed:
                self._opening.discard(key)
                failed(error)
                return
            self._handle_again(frame, key)
        asyncio.wrap_future(future).add_done_callback(done)
        return True

    def _handle_again(self, frame: codec.Frame, key: tuple[int, int]) -> None:
        """Handle a request whose topic is open now, or whose write is on disk."""
        held = len(self._opening) >= MAX_OPENS_PER_CONNECTION
        if key not in self._opening or self.closed:
            return  # closed (CLOSE_PRODUCER/CLOSE_CONSUMER, or the connection) before it was open
        self._opening.discard(key)
        self._opened_frame = frame
        try:
            self._handle(frame)
        except Exception as exc:  # noqa: BLE001 - a protocol violation or defect costs this connection
            log.warning("closing connection: %s: %s", type(exc).__name__, exc)
            self.close()
        finally:
            self._opened_frame = None
        if held and not self.closed:
            self._next_turn()  # its frames held meanwhile
        self.flush()

    def _request_topic(self, request_id: int, name: str) -> Topic | None:
        """The topic a producer or subscribe request names, or None after answering its error."""
        try:
            self.core.check_tenant(name)
            topic = self.core.topic(name)
        except InvalidTopicName as exc:
            self._error(request_id, pb.InvalidTopicName, str(exc))
            return None
        except UnknownTenant as exc:
            self._error(request_id, pb.TopicNotFound, str(exc))
            return None
        if topic is None:
            self._error(request_id, pb.TopicNotFound, f"{name} is a partitioned topic; use a partition")
        return topic

    def _success(self, request_id: int) -> None:
        self.command(T.SUCCESS, "success", pb.CommandSuccess(request_id=request_id))

    def _send_error(self, producer_id: int, sequence_id: int, code: Any, message: str) -> None:
        self.command(T.SEND_ERROR, "send_error", pb.CommandSendError(
            producer_id=producer_id, sequence_id=sequence_id, error=code, message=message))

    def active_consumer_change(self, consumer_id: int, active: bool) -> None:
        self.command(T.ACTIVE_CONSUMER_CHANGE, "active_consumer_change",
                     pb.CommandActiveConsumerChange(consumer_id=consumer_id, is_active=active))

    # handlers

    def on_connect(self, frame: codec.Frame) -> None:
        c = frame.command.connect
        if self.connected:
            raise PulsarWireError("second CONNECT on one connection")
        if self.service.auth_enabled:
            peer = self.transport.get_extra_info("peercert") if self.tls and self.transport else None
            offered = c.auth_data if c.HasField("auth_data") else b""
            self.role = self.service.authenticate(c.auth_method_name, offered, peer)
            if self.role is None and self.service.anonymous_role is not None and \
                    not self.service.serves_method(c.auth_method_name):
                self.role = self.service.anonymous_role  # as Pulsar: no credentials, or of a method not served
            if self.role is None:
                # The official (C++) client treats any answer to CONNECT but CONNECTED as a broken
                # connection and retries until its operation timeout. So the handshake completes,
                # and every request on this connection is refused with AuthenticationError, which
                # clients raise at once; the handshake timeout closes the connection.
                log.warning("authentication failed (method %r)", c.auth_method_name)
                self.refused = "authentication failed: " + (
                    "no credentials offered" if not offered and c.auth_method_name != "tls"
                    else "the credentials are not accepted")
        self.connected = True
        if not self.refused:  # an unauthenticated connection keeps the small frame limit
            self.service.unauthenticated.pop(self, None)
            self.reader.max_frame_size = self.service.max_message_size + codec.FRAME_PADDING
        response = pb.CommandConnected(server_version=SERVER_VERSION,
                                       protocol_version=min(c.protocol_version, MAX_PROTOCOL_VERSION),
                                       max_message_size=self.service.max_message_size)
        self.command(T.CONNECTED, "connected", response)

    def _tenant_exists(self, name: str) -> bool:
        """Whether the tenant of a topic or namespace name exists: a topic of an unknown tenant is
        answered TopicNotFound whatever the role, as Pulsar answers it."""
        try:
            self.core.check_tenant(name)
        except UnknownTenant:
            return False
        return True

    def _refuse(self, command: pb.BaseCommand) -> None:
        """Answer one request on an unauthenticated connection with AuthenticationError."""
        self._fail_request(command, pb.AuthenticationError, self.refused)

    def _fail_request(self, command: pb.BaseCommand, code: Any, message: str) -> None:
        """Answer one request with error `code`, in the response its client waits for (a lookup
        or metadata response, a send error, a schema response, else CommandError). A command
        without a request id (FLOW, REDELIVER, ...) has no answer."""
        kind = command.type
        if kind == T.LOOKUP:
            self.command(T.LOOKUP_RESPONSE, "lookupTopicResponse", pb.CommandLookupTopicResponse(
                request_id=command.lookupTopic.request_id, response=pb.CommandLookupTopicResponse.Failed,
                error=code, message=message))
        elif kind == T.PARTITIONED_METADATA:
            self.command(T.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse",
                         pb.CommandPartitionedTopicMetadataResponse(
                             request_id=command.partitionMetadata.request_id,
                             response=pb.CommandPartitionedTopicMetadataResponse.Failed,
                             error=code, message=message))
        elif kind == T.SEND:
            self._send_error(command.send.producer_id, command.send.sequence_id, code, message)
        elif kind == T.GET_SCHEMA:
            self.command(T.GET_SCHEMA_RESPONSE, "getSchemaResponse", pb.CommandGetSchemaResponse(
                request_id=command.getSchema.request_id, error_code=code, error_message=message))
        elif kind == T.ACK and command.ack.HasField("request_id"):
            self.command(T.ACK_RESPONSE, "ackResponse", pb.CommandAckResponse(
                consumer_id=command.ack.consumer_id, request_id=command.ack.request_id, error=code,
                message=message))
        else:
            request_id = _request_id(command)
            if request_id is not None:
                self._error(request_id, code, message)

    def on_ping(self, frame: codec.Frame) -> None:
        self.command(T.PONG, "pong", pb.CommandPong())

    def on_pong(self, frame: codec.Frame) -> None:
        pass

    def on_lookup(self, frame: codec.Frame) -> None:
        c = frame.command.lookupTopic
        try:
            self.core.check_topic_name(c.topic)
            self.core.check_tenant(c.topic)
        except (InvalidTopicName, UnknownTenant) as exc:
            self.command(T.LOOKUP_RESPONSE, "lookupTopicResponse", pb.CommandLookupTopicResponse(
                request_id=c.request_id, response=pb.CommandLookupTopicResponse.Failed,
                error=pb.InvalidTopicName if isinstance(exc, InvalidTopicName) else pb.TopicNotFound,
                message=str(exc)))
            return
        response = pb.CommandLookupTopicResponse(request_id=c.request_id, authoritative=True,
                                                 response=pb.CommandLookupTopicResponse.Connect,
                                                 brokerServiceUrl=self.service.lookup_url)
        if self.service.service_url_tls:
            response.brokerServiceUrlTls = self.service.service_url_tls
        if c.advertised_listener_name:
            listener_url = self.service.advertised_listeners.get(c.advertised_listener_name)
            if listener_url is None:
                self.command(T.LOOKUP_RESPONSE, "lookupTopicResponse", pb.CommandLookupTopicResponse(
                    request_id=c.request_id, response=pb.CommandLookupTopicResponse.Failed,
                    error=pb.ServiceNotReady,
                    message=f"the broker has no advertised listener {c.advertised_listener_name[:64]!r}"))
                return
            response.ClearField("brokerServiceUrlTls")
            if listener_url.startswith("pulsar+ssl://"):
                response.brokerServiceUrl, response.brokerServiceUrlTls = "", listener_url
            else:
                response.brokerServiceUrl = listener_url
        self.command(T.LOOKUP_RESPONSE, "lookupTopicResponse", response)

    def on_partitioned_metadata(self, frame: codec.Frame) -> None:
        c = frame.command.partitionMetadata
        try:
            self.core.check_tenant(c.topic)
            if self._waits_for_write(frame, (T.PARTITIONED_METADATA, c.request_id), c.request_id,
                                     self.core.partitions_written(c.topic)):
                return  # created as partitioned (the broker's default partitions): answered once on disk
            partitions = self.core.partitions_of(c.topic)
        except (InvalidTopicName, UnknownTenant) as exc:
            self.command(T.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse",
                         pb.CommandPartitionedTopicMetadataResponse(
                             request_id=c.request_id, response=pb.CommandPartitionedTopicMetadataResponse.Failed,
                             error=pb.InvalidTopicName if isinstance(exc, InvalidTopicName) else pb.TopicNotFound,
                             message=str(exc)))
            return
        self.command(T.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse",
                     pb.CommandPartitionedTopicMetadataResponse(
                         request_id=c.request_id, partitions=partitions,
                         response=pb.CommandPartitionedTopicMetadataResponse.Success))

    def on_producer(self, frame: codec.Frame) -> None:
        c = frame.command.producer
        if self._opens_topic(frame, c.topic, (T.PRODUCER, c.producer_id)):
            return
        topic = self._request_topic(c.request_id, c.topic)
        if topic is None:
            return
        if topic.terminated:
            self._error(c.request_id, pb.TopicTerminatedError, f"{c.topic} is terminated")
            return
        existing = self.producers.get(c.producer_id)
        if existing is not None and existing.topic is topic:  # a retried create: answer again
            self._producer_granted(c.request_id, existing, existing.epoch)
            return
        waiting = self.waiting_producers.get(c.producer_id)
        if waiting is not None and waiting.topic is topic:
            self._producer_success(c.request_id, waiting, None)
            return
        accepted, schema_version = self._attach_schema(frame, (T.PRODUCER, c.producer_id), c.request_id, topic,
                                                       c.schema if c.HasField("schema") else None)
        if not accepted:
            return
        name = c.producer_name if c.HasField("producer_name") and c.producer_name else \
            self.core.new_producer_name(topic)
        holder = topic.producers.get(name)
        if holder is not None and getattr(holder, "conn", None) is not self and not holder.closed:
            self._error(c.request_id, pb.ProducerBusy, f"producer {name} is already connected to {c.topic}")
            return
        if c.HasField("initial_subscription_name") and c.initial_subscription_name:
            initial = topic.subscription(c.initial_subscription_name, pb.CommandSubscribe.Shared, True, True, None,
                                         wait=False)
            if self._waits_for_write(frame, (T.PRODUCER, c.producer_id), c.request_id, topic.stored(initial)):
                return
        producer = PulsarProducer(self, c.producer_id, topic, name)
        producer.schema_version = schema_version
        request_id = c.request_id

        def granted(epoch: int) -> None:  # a WaitForExclusive producer got the topic
            if self.waiting_producers.pop(producer.producer_id, None) is producer and not self.closed:
                self.producers[producer.producer_id] = producer
                producer.epoch = epoch
                self._producer_granted(request_id, producer, epoch)
                self.flush()

        def refused(error: Exception) -> None:
            if self.waiting_producers.pop(producer.producer_id, None) is producer and not self.closed:
                code = pb.ProducerFenced if isinstance(error, ProducerFencedError) else pb.PersistenceError
                self._error(request_id, code, str(error))
                self.flush()

        try:
            epoch = topic.add_producer(producer, c.producer_access_mode,
                                       c.topic_epoch if c.HasField("topic_epoch") else None, granted, refused)
        except ProducerBusyError as exc:
            self._error(c.request_id, pb.ProducerBusy, str(exc))
            return
        except ProducerFencedError as exc:
            self._error(c.request_id, pb.ProducerFenced, str(exc))
            return
        if epoch is None:
            self.waiting_producers[c.producer_id] = producer
        else:
            producer.epoch = epoch if c.producer_access_mode != SHARED else None
            self.producers[c.producer_id] = producer
            self._producer_granted(c.request_id, producer, producer.epoch)
            return
        self._producer_success(c.request_id, producer, producer.epoch)

    def _producer_granted(self, request_id: int, producer: PulsarProducer, epoch: int | None) -> None:
        """Answer a producer that holds the topic, once the topic's epoch is on disk (an exclusive
        producer's new epoch is written first: a restart must keep the ones it fenced out
        fenced); PersistenceError, and the producer gone, if it cannot be written."""
        def answer(error: BaseException | None) -> None:
            if self.producers.get(producer.producer_id) is not producer:
                return  # closed meanwhile: its close was answered
            if error is not None:
                del self.producers[producer.producer_id]
                producer.topic.remove_producer(producer)
                self._error(request_id, pb.PersistenceError, f"the topic's epoch is not stored: {error}")
            else:
                self._producer_success(request_id, producer, epoch)
        self._answer_once_stored(producer.topic.epoch_stored() if epoch is not None else None, answer)

    def _answer_once_stored(self, written: concurrent.futures.Future | None,
                            answer: Callable[[BaseException | None], None]) -> None:
        """`answer(error)` once a metadata write is on disk (error None) or failed, the event loop
        serving others meanwhile; at once when there is none (None). Not once the connection closed."""
        if written is None:
            answer(None)
            return

        def done(result: asyncio.Future) -> None:
            if not self.closed:
                answer(None if result.cancelled() else result.exception())
                self.flush()
        asyncio.wrap_future(written).add_done_callback(done)

    def _producer_success(self, request_id: int, producer: PulsarProducer, epoch: int | None) -> None:
        """Answer a create; a waiting producer (not ready yet) is answered again once it is granted."""
        response = pb.CommandProducerSuccess(
            request_id=request_id, producer_name=producer.name,
            # as Pulsar: a topic without deduplication tells no last sequence id
            last_sequence_id=producer.topic.last_sequence.get(producer.name, -1) if producer.topic.deduplication else -1)
        if producer.producer_id in self.waiting_producers:
            response.producer_ready = False
        elif epoch is not None:
            response.topic_epoch = epoch
        if producer.schema_version is not None:
            response.schema_version = producer.schema_version
        self.command(T.PRODUCER_SUCCESS, "producer_success", response)

    def on_send(self, frame: codec.Frame) -> None:
        """A Send frame decoded in full (the fast path declined it)."""
        s = frame.command.send
        md = frame.metadata
        if md is None:
            self._send_error(s.producer_id, s.sequence_id, pb.UnknownError, "SEND without payload")
            return
        self.store(s.producer_id, s.sequence_id,
                   s.highest_sequence_id if s.HasField("highest_sequence_id") else None,
                   md.num_messages_in_batch if md.HasField("num_messages_in_batch") else None,
                   s.is_chunk, md.chunk_id if md.HasField("chunk_id") else None, md.publish_time,
                   md.deliver_at_time if md.HasField("deliver_at_time") else None,
                   # set, as metadata is: a frame has both or neither
                   frame.metadata_and_payload, frame.checksum, md.compression)  # type: ignore[arg-type]

    def _store_sends(self, frames: list) -> None:
        """Store plain Send frames (codec.SendFrame) in order, each run of one producer's frames
        with one call to its topic, and queue their receipts; `frames` is emptied."""
        try:
            self._store_runs(frames)
        finally:
            frames.clear()

    def _store_runs(self, frames: list) -> None:
        if frames and self.service.out_of_space and self.service.still_out_of_space():
            self._leave_unanswered(len(frames))
            return
        start, end = 0, len(frames)
        while start < end:
            frame = frames[start]
            producer_id = frame.producer_id
            producer = self.producers.get(producer_id)
            if producer is None or producer.topic.terminated or producer.topic.fenced:
                self._store_frame(frame)
                start += 1
                continue
            topic = producer.topic
            run_end = start + 1
            while run_end < end and frames[run_end].producer_id == producer_id:
                run_end += 1
            ids = topic.append_sends(frames, start, run_end, producer.name)
            if not ids:  # the first needs the general path
                self._store_frame(frame)
                start += 1
                continue
            batch = topic.log.batch
            if not self._batches or self._batches[-1] is not batch:
                self._batches.append(batch)
            if not self.closed:
                self._queued(staging.queue_send_receipts(self._out, self._sends, batch, producer_id, frames, start, ids,
                                                         topic.ledger_id, DUPLICATE))
            start += len(ids)

    def _store_frame(self, frame: codec.SendFrame) -> None:
        self.store(frame.producer_id, frame.sequence_id, frame.highest_sequence_id, frame.num_messages_in_batch,
                   frame.is_chunk, frame.chunk_id, frame.publish_time, frame.deliver_at_time,
                   frame.metadata_and_payload, frame.checksum, frame.compression)

    def store(self, producer_id: int, sequence_id: int, highest_sequence_id: int | None, batch_count: int | None,
              is_chunk: bool, chunk_id: int | None, publish_time: int, deliver_at_time: int | None,
              body: bytes | memoryview, checksum: int | None, compression: int | None = None) -> None:
        """Append one entry (unless it is a duplicate) and answer with its receipt. `batch_count` is
        the metadata's num_messages_in_batch (None: not a batch); CommandSend's num_messages is not
        trusted."""
        producer = self.producers.get(producer_id)
        if producer is None:
            self._send_error(producer_id, sequence_id, pb.NotAllowedError, "unknown producer id")
            return
        if self.service.out_of_space and self.service.still_out_of_space():
            self._leave_unanswered(1)
            return
        topic = producer.topic
        if topic.terminated:
            self._send_error(producer_id, sequence_id, pb.TopicTerminatedError, "topic is terminated")
            return
        if topic.fenced and topic.refuses(producer, sequence_id):
            self._send_error(producer_id, sequence_id, pb.PersistenceError,
                             "an earlier send of this producer was not stored: resend it first")
            return
        try:
            entry_id = self.core.publish(topic, producer.name, sequence_id, highest_sequence_id,
                                         bool(is_chunk and chunk_id), body, checksum, publish_time,
                                         deliver_at_time, batch_count, compression)
        except StorageError as exc:
            topic.fence(producer)
            self._send_error(producer_id, sequence_id, pb.PersistenceError, f"not stored: {exc}")
            self.service.storage_failed(exc)
            return
        except MalformedBatchError as exc:
            # ChecksumError: the official client fails that one message and keeps its connection
            self._send_error(producer_id, sequence_id, pb.ChecksumError, f"not stored: {exc}")
            return
        # the receipt stands only if its group commit succeeds (see flush); a duplicate, judged
        # against pending sends too, waits on the same batch and is answered with the (-1, -1) id
        batch = topic.log.batch
        if not self._batches or self._batches[-1] is not batch:
            self._batches.append(batch)
        self._sends.append((len(self._out), batch, producer_id, sequence_id))
        self.write(codec.encode_send_receipt(producer_id, sequence_id,
                                             highest_sequence(sequence_id, highest_sequence_id),
                                             topic.ledger_id if entry_id != DUPLICATE else -1, entry_id))

    def on_close_producer(self, frame: codec.Frame) -> None:
        c = frame.command.close_producer
        self._opening.discard((T.PRODUCER, c.producer_id))  # not created once its topic is open
        producer = self.producers.pop(c.producer_id, None) or self.waiting_producers.pop(c.producer_id, None)
        if producer is not None:
            producer.topic.remove_producer(producer)
        self._success(c.request_id)

    def on_subscribe(self, frame: codec.Frame) -> None:
        c = frame.command.subscribe
        if self._opens_topic(frame, c.topic, (T.SUBSCRIBE, c.consumer_id)):
            return
        topic = self._request_topic(c.request_id, c.topic)
        if topic is None:
            return
        if c.consumer_id in self.consumers:
            self._answer_subscribe(c.request_id, self.consumers[c.consumer_id])  # a retried subscribe
            return
        if not self._attach_schema(frame, (T.SUBSCRIBE, c.consumer_id), c.request_id, topic,
                                   c.schema if c.HasField("schema") else None)[0]:
            return
        subscription = topic.subscription(c.subscription, c.subType, c.durable,
                                          c.initialPosition == pb.CommandSubscribe.Earliest,
                                          start_position(c.start_message_id)
                                          if c.HasField("start_message_id") else None, wait=False)
        if subscription.consumers and subscription.type != c.subType:
            self._error(c.request_id, pb.ConsumerBusy,
                        f"subscription {c.subscription} is of another type")
            return
        if subscription.type == pb.CommandSubscribe.Exclusive and subscription.consumers:
            self._error(c.request_id, pb.ConsumerBusy, f"exclusive subscription {c.subscription} is in use")
            return
        sticky = False
        if c.subType == pb.CommandSubscribe.Key_Shared:
            meta = c.keySharedMeta
            sticky = c.HasField("keySharedMeta") and meta.keySharedMode == pb.STICKY
            ranges = [(r.start, r.end) for r in meta.hashRanges] if sticky else []
            refusal = subscription.key_shared_refusal(sticky, ranges)
            if refusal is not None:
                self._error(c.request_id, pb.ConsumerAssignError, refusal)
                return
        subscription.type = c.subType
        if c.read_compacted:
            subscription.read_compacted = True  # its reads skip what compaction left out
        consumer = PulsarConsumer(self, c.consumer_id, subscription, c.consumer_name or str(c.consumer_id),
                                  c.priority_level)
        if sticky:
            consumer.hash_ranges = ranges
        self.consumers[c.consumer_id] = consumer
        subscription.add_consumer(consumer, sticky)
        self._answer_subscribe(c.request_id, consumer)

    def _answer_subscribe(self, request_id: int, consumer: PulsarConsumer) -> None:
        """Success once the subscription is on disk; the metadata writer stores a new one while
        the event loop goes on. Not stored: an error, and the consumer is gone again."""
        subscription = consumer.subscription
        stored = subscription.topic.stored(subscription)
        if stored is None:
            self._success(request_id)
            subscription.check_end_of_topic()
            return

        def answer(done: asyncio.Future) -> None:
            if self.closed or self.consumers.get(consumer.consumer_id) is not consumer:
                return
            error = None if done.cancelled() else done.exception()
            if error is None:
                self._answer_subscribe(request_id, consumer)
            else:
                self.consumers.pop(consumer.consumer_id, None)
                subscription.detach(consumer)
                self._error(request_id, pb.PersistenceError, f"the subscription is not stored: {error}")
            self.flush()
        asyncio.wrap_future(stored).add_done_callback(answer)

    def on_flow(self, frame: codec.Frame) -> None:
        c = frame.command.flow
        consumer = self.consumers.get(c.consumer_id)
        if consumer is not None:
            consumer.permits += c.messagePermits
            consumer.subscription.dispatch()
            consumer.subscription.check_end_of_topic()

    def on_ack(self, frame: codec.Frame) -> None:
        c = frame.command.ack
        consumer = self.consumers.get(c.consumer_id)
        refused = []
        if consumer is not None:
            subscription = consumer.subscription
            cumulative = c.ack_type == pb.CommandAck.Cumulative
            topic = subscription.topic
            for mid in c.message_id:
                if cumulative and mid.entryId == _NO_ENTRY:
                    continue  # "before the first entry" (a reader after a seek): nothing to move
                if mid.entryId < topic.log.next_entry_id and topic.ledger_of(mid.entryId) != mid.ledgerId:
                    # an id given before entries were lost, whose entry id a later ledger holds now
                    log.warning("an acknowledgement of (%d, %d) on %s ignored: entry %d is in ledger %d",
                                mid.ledgerId, mid.entryId, topic.name, mid.entryId, topic.ledger_of(mid.entryId))
                    continue
                if not subscription.ack(mid.entryId, ack_set_bits(mid.ack_set) if mid.ack_set else None,
                                        cumulative):
                    refused.append(mid.entryId)
            subscription.dispatch()
            subscription.check_end_of_topic()
            if refused:
                log.warning("refused acks of entries %s on %s: the topic ends before entry %d",
                            refused[:5], subscription.topic.name, subscription.topic.log.next_entry_id)
        if c.HasField("request_id"):
            response = pb.CommandAckResponse(consumer_id=c.consumer_id, request_id=c.request_id)
            if refused:
                response.error = pb.NotAllowedError
                response.message = f"no entry {refused[0]} on this topic: acknowledgement refused"
            self.command(T.ACK_RESPONSE, "ackResponse", response)

    def on_redeliver(self, frame: codec.Frame) -> None:
        c = frame.command.redeliverUnacknowledgedMessages
        consumer = self.consumers.get(c.consumer_id)
        if consumer is not None:
            consumer.subscription.redeliver(consumer, [m.entryId for m in c.message_ids] or None)

    def on_seek(self, frame: codec.Frame) -> None:
        c = frame.command.seek
        consumer = self.consumers.get(c.consumer_id)
        if consumer is None:
            self._error(c.request_id, pb.ConsumerNotFound, "unknown consumer id")
            return
        subscription = consumer.subscription
        topic_log = subscription.topic.log
        if c.HasField("message_id"):
            self._seek(consumer, c.request_id, start_entry(start_position(c.message_id), topic_log))
        elif c.HasField("message_publish_time"):  # a search that reads the log: off the event loop
            asyncio.ensure_future(self._seek_by_time(consumer, c.request_id, c.message_publish_time))
        else:
            self._error(c.request_id, pb.UnknownError, "seek needs a message id or a publish time")

    async def _seek_by_time(self, consumer: PulsarConsumer, request_id: int, publish_time: int) -> None:
        try:
            position = await consumer.subscription.topic.find_by_publish_time(publish_time)
        except Exception as exc:  # noqa: BLE001 - the seek fails alone, with a typed error
            if not self.closed:
                log.error("SEEK failed: %s: %s", type(exc).__name__, exc)
                code = _error_code(exc)
                self._error(request_id, code, f"{pb.ServerError.Name(code)}: {exc}")
                self.flush()
            return
        if not self.closed and self.consumers.get(consumer.consumer_id) is consumer:
            self._seek(consumer, request_id, position)
            self.flush()

    def _seek(self, consumer: PulsarConsumer, request_id: int, position: int) -> None:
        subscription = consumer.subscription
        subscription.seek(position)
        # As Pulsar does: close the consumers first, then answer, so that a client re-subscribes
        # from the seek position (the official client takes it as its start while the seek is
        # pending); a reader's non-durable subscription is kept meanwhile (topics.py).
        for other in list(subscription.consumers):
            other.evict()
        self._success(request_id)

    def on_unsubscribe(self, frame: codec.Frame) -> None:
        c = frame.command.unsubscribe
        consumer = self.consumers.get(c.consumer_id)
        if consumer is None:
            self._error(c.request_id, pb.ConsumerNotFound, "unknown consumer id")
            return
        subscription = consumer.subscription
        if len(subscription.consumers) > 1 and not c.force:
            self._error(c.request_id, pb.UnknownError, "subscription has other consumers")
            return
        for other in list(subscription.consumers):
            if isinstance(other, PulsarConsumer):
                other.conn.consumers.pop(other.consumer_id, None)
        subscription.consumers.clear()
        request_id = c.request_id

        def answer(error: BaseException | None) -> None:
            if error is not None:  # the cursors stay marked changed: the next save writes them
                self._error(request_id, pb.PersistenceError, f"the unsubscribe is not stored: {error}")
            else:
                self._success(request_id)
        self._answer_once_stored(subscription.topic.drop_subscription(subscription.name), answer)

    def on_close_consumer(self, frame: codec.Frame) -> None:
        c = frame.command.close_consumer
        self._opening.discard((T.SUBSCRIBE, c.consumer_id))  # not created once its topic is open
        consumer = self.consumers.pop(c.consumer_id, None)
        if consumer is not None:
            consumer.subscription.detach(consumer)
        self._success(c.request_id)

    def evict_consumer(self, consumer: PulsarConsumer) -> None:
        """Close a consumer from the broker's side (CloseConsumer): the client re-subscribes."""
        self.consumers.pop(consumer.consumer_id, None)
        consumer.subscription.detach(consumer)
        self.command(T.CLOSE_CONSUMER, "close_consumer",
                     pb.CommandCloseConsumer(consumer_id=consumer.consumer_id, request_id=0))

    def on_get_last_message_id(self, frame: codec.Frame) -> None:
        c = frame.command.getLastMessageId
        consumer = self.consumers.get(c.consumer_id)
        if consumer is None:
            self._error(c.request_id, pb.ConsumerNotFound, "unknown consumer id")
            return
        subscription = consumer.subscription
        topic_log = subscription.topic.log
        if self._waits_for_read(frame, (T.GET_LAST_MESSAGE_ID, c.request_id),
                                topic_log.read_pending(topic_log.last_entry_id)):
            return
        last_entry, batch_index = subscription.topic.last_position()
        last = message_id(subscription.topic, last_entry)
        if batch_index >= 0:
            last.batch_index = batch_index
        response = pb.CommandGetLastMessageIdResponse(request_id=c.request_id, last_message_id=last)
        response.consumer_mark_delete_position.CopyFrom(message_id(subscription.topic, subscription.cursor.mark_delete))
        self.command(T.GET_LAST_MESSAGE_ID_RESPONSE, "getLastMessageIdResponse", response)

    def on_get_topics_of_namespace(self, frame: codec.Frame) -> None:
        c = frame.command.getTopicsOfNamespace
        if not _NAMESPACE.fullmatch(c.namespace):
            self._error(c.request_id, pb.InvalidTopicName, f"invalid namespace {c.namespace!r}")
            return
        modes = pb.CommandGetTopicsOfNamespace
        topics = self.core.topics_of_namespace(c.namespace, persistent=c.mode != modes.NON_PERSISTENT,
                                               non_persistent=c.mode != modes.PERSISTENT)
        response = pb.CommandGetTopicsOfNamespaceResponse(request_id=c.request_id)
        if c.HasField("topics_pattern") and c.topics_pattern:
            matched = _filter_topics(topics, c.topics_pattern)
            if matched is not None:
                topics, response.filtered = matched, True
        response.topics_hash = topics_hash(topics)
        if c.HasField("topics_hash") and c.topics_hash == response.topics_hash:
            response.changed = False  # the client's list is current: no need to send it again
        else:
            response.topics.extend(topics)
        self.command(T.GET_TOPICS_OF_NAMESPACE_RESPONSE, "getTopicsOfNamespaceResponse", response)

    # schemas: one per topic; a producer or consumer may declare it, or the same one, or none

    def _attach_schema(self, frame: codec.Frame, key: tuple[int, int], request_id: int, topic: Topic,
                       schema: pb.Schema | None) -> tuple[bool, bytes | None]:
        """(accepted, the schema version of a declared schema); no version when none is declared.
        Not accepted after answering IncompatibleSchema, or while a new version (one the
        namespace's compatibility strategy admits) is written: the request is handled again
        once it is on disk (see _waits_for_write)."""
        if schema is None:
            return True, None
        if self._waits_for_write(frame, key, request_id, topic.schema_write):
            return False, None
        try:
            version, record = version_for(schema, topic.schemas, self.core.policies.schema_strategy(topic.name))
        except IncompatibleSchema as exc:
            self._error(request_id, pb.IncompatibleSchema, f"{topic.name}: {exc}")
            return False, None
        if record is not None:
            self._waits_for_write(frame, key, request_id, topic.register_schema(record))
            return False, None
        return True, version.to_bytes(8, "big")

    def on_get_schema(self, frame: codec.Frame) -> None:
        c = frame.command.getSchema
        name = c.topic
        partitions = self.core.partitioned_count(name)
        if partitions:
            name = f"{name}-partition-0"  # every partition carries the same schema
        exists = self.core.non_partitioned_exists(name)
        if exists and self._opens_topic(frame, name, (T.GET_SCHEMA, c.request_id)):
            return
        topic = self.core.topic(name) if exists else None
        response = pb.CommandGetSchemaResponse(request_id=c.request_id)
        versions = topic.schemas if topic is not None else []
        version = int.from_bytes(c.schema_version, "big") if c.HasField("schema_version") and c.schema_version \
            else len(versions) - 1
        if not 0 <= version < len(versions):
            response.error_code = pb.TopicNotFound
            response.error_message = f"no schema for {c.topic}"
        else:
            response.schema.CopyFrom(_schema_proto(versions[version]))
            response.schema_version = version.to_bytes(8, "big")
        self.command(T.GET_SCHEMA_RESPONSE, "getSchemaResponse", response)

    def on_auth_response(self, frame: codec.Frame) -> None:
        pass  # we never challenge; a refreshed token needs no answer


_CLOSED_READER = codec.FrameReader(8)  # what a closed connection holds instead of its buffers


_NAMESPACE = re.compile(r"[^/\s]+/[^/\s]+")
MAX_TOPICS_PATTERN = 256  # longer patterns are left to the client to apply, as Pulsar does
MAX_PATTERN_REPEATS = 2  # Python's re cannot be timed out: only patterns that cannot backtrack badly


def _cheap_to_match(regex: str) -> bool:
    """Whether matching `regex` costs at most about (name length)^2 steps: no backreference, no
    repeated group, at most MAX_PATTERN_REPEATS repetitions. Others are left to the client, so a
    client's pattern can never stall the broker."""
    repeats, i, previous = 0, 0, ""
    while i < len(regex):
        char = regex[i]
        if char == "\\":
            if regex[i + 1:i + 2].isdigit():
                return False
            i, previous = i + 2, "atom"
            continue
        if char == "[":  # a character class is one atom: skip to its closing bracket
            i += 2 if regex[i + 1:i + 2] == "^" else 1
            i += 1 if regex[i:i + 1] == "]" else 0
            while i < len(regex) and regex[i] != "]":
                i += 2 if regex[i] == "\\" else 1
            i, previous = i + 1, "atom"
            continue
        if char in "*+?{" and previous != "(":
            if previous == ")":
                return False
            repeats += 1
            if char == "{":
                i = regex.find("}", i)
                if i < 0:
                    return False
        previous = char if char in "()" else "atom"
        i += 1
    return repeats <= MAX_PATTERN_REPEATS


def _without_scheme(name: str) -> str:
    return name.split("://", 1)[1] if "://" in name else name


def _filter_topics(topics: list[str], pattern: str) -> list[str] | None:
    """The topics whose name (scheme aside) matches `pattern` in full, or None when the broker
    leaves filtering to the client (a pattern too long or too costly, or one Python cannot compile)."""
    if len(pattern) > MAX_TOPICS_PATTERN or not _cheap_to_match(_without_scheme(pattern)):
        return None
    try:
        regex = re.compile(_without_scheme(pattern))
    except re.error as exc:
        log.info("topics pattern %r left to the client: %s", pattern, exc)
        return None
    return [t for t in topics if regex.fullmatch(_without_scheme(t))]


def topics_hash(topics: list[str]) -> str:
    """A digest of a topic list, which a client sends back to learn whether it changed."""
    return struct.pack("<I", crc32c(",".join(sorted(topics)).encode())).hex()


def _schema_proto(record: dict) -> pb.Schema:
    return pb.Schema(type=record["type"], name=record["name"], schema_data=base64.b64decode(record["data"]),
                     properties=[pb.KeyValue(key=k, value=v) for k, v in sorted(record["properties"].items())])


# frequent commands with no text the broker reads
_WITHOUT_TEXT = frozenset((T.PING, T.PONG, T.FLOW, T.ACK, T.SEND, T.REDELIVER_UNACKNOWLEDGED_MESSAGES))


def _undecodable_text(message: Message, prefix: str = "") -> str | None:
    """The first string field of `message` that arrived as bytes (not UTF-8: protobuf then hands
    over the raw bytes), by its path; None when every one is text."""
    for field, value in message.ListFields():
        if field.type == field.TYPE_STRING:
            values = value if field.is_repeated else (value,)
            if any(isinstance(item, bytes) for item in values):
                return prefix + field.name
        elif field.type == field.TYPE_MESSAGE:
            for item in (value if field.is_repeated else (value,)):
                found = _undecodable_text(item, f"{prefix}{field.name}.")
                if found is not None:
                    return found
    return None


def _kernel_backlog(transport: asyncio.BaseTransport | None) -> int:
    """Bytes the kernel holds unsent for this connection's socket (Linux: SIOCOUTQ); 0 where unknown."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or _SIOCOUTQ is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def _out_of_space(error: BaseException | None) -> bool:
    """Whether a storage error (or what caused it) is a full disk or quota."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left" in str(error) or "Disk quota exceeded" in str(error):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _has_room(ops: FileOps, path: str) -> bool:
    """Whether SPACE_PROBE_BYTES can be written at `path` (then given back)."""
    try:
        fd = ops.open(path)
    except OSError:
        return False
    try:
        try:
            return ops.pwrite(fd, bytes(SPACE_PROBE_BYTES), 0) == SPACE_PROBE_BYTES
        except OSError:
            return False
        finally:
            ops.truncate(fd, 0)
    except OSError:
        return False
    finally:
        ops.close(fd)


def _error_code(exc: Exception) -> int:
    """The ServerError a failed request is answered with."""
    if isinstance(exc, InvalidTopicName):
        return pb.InvalidTopicName
    if isinstance(exc, (StorageError, OSError)):
        return pb.PersistenceError  # the file system refused: the client may retry
    if isinstance(exc, (ValueError, KeyError, TypeError, IndexError)):
        return pb.MetadataError  # what the request names or what is stored about it does not hold
    return pb.ServiceNotReady


def _request_id(command: pb.BaseCommand) -> int | None:
    for field, value in command.ListFields():
        if field.name != "type" and hasattr(value, "request_id"):
            return value.request_id
    return None


def namespace_of(name: str) -> str:
    """`tenant/namespace` of a topic name (full or short) or of a namespace name."""
    if "://" not in name and name.count("/") < 2:
        return name if "/" in name else "public/default"
    return "/".join((name.split("://", 1)[1] if "://" in name else name).split("/")[:2])


def token_role(token: bytes) -> str:
    """The role a configured token stands for: the `sub` claim of a JWT (the token matched one
    given to the broker, so its claims are the operator's), else `token`."""
    parts = token.split(b".")
    if len(parts) == 3:
        try:
            claims = json.loads(base64.urlsafe_b64decode(parts[1] + b"=" * (-len(parts[1]) % 4)))
            if isinstance(claims, dict) and isinstance(claims.get("sub"), str) and claims["sub"]:
                return claims["sub"]
        except ValueError:
            pass
    return "token"


# the commands authorization checks, and the topic or namespace each names
_AUTHORIZED: dict[int, Callable] = {
    T.LOOKUP: lambda command: command.lookupTopic.topic,
    T.PARTITIONED_METADATA: lambda command: command.partitionMetadata.topic,
    T.PRODUCER: lambda command: command.producer.topic,
    T.SUBSCRIBE: lambda command: command.subscribe.topic,
    T.GET_TOPICS_OF_NAMESPACE: lambda command: command.getTopicsOfNamespace.namespace,
}

_HANDLERS: dict[int, Callable] = {
    T.CONNECT: BrokerConnection.on_connect,
    T.PING: BrokerConnection.on_ping,
    T.PONG: BrokerConnection.on_pong,
    T.LOOKUP: BrokerConnection.on_lookup,
    T.PARTITIONED_METADATA: BrokerConnection.on_partitioned_metadata,
    T.PRODUCER: BrokerConnection.on_producer,
    T.SEND: BrokerConnection.on_send,
    T.CLOSE_PRODUCER: BrokerConnection.on_close_producer,
    T.SUBSCRIBE: BrokerConnection.on_subscribe,
    T.FLOW: BrokerConnection.on_flow,
    T.ACK: BrokerConnection.on_ack,
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: BrokerConnection.on_redeliver,
    T.SEEK: BrokerConnection.on_seek,
    T.UNSUBSCRIBE: BrokerConnection.on_unsubscribe,
    T.CLOSE_CONSUMER: BrokerConnection.on_close_consumer,
    T.GET_LAST_MESSAGE_ID: BrokerConnection.on_get_last_message_id,
    T.AUTH_RESPONSE: BrokerConnection.on_auth_response,
    T.GET_TOPICS_OF_NAMESPACE: BrokerConnection.on_get_topics_of_namespace,
    T.GET_SCHEMA: BrokerConnection.on_get_schema,
}
