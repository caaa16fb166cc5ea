"""Producers: the per-partition producer (sequence ids, batching, chunking,
receipts, resend after reconnect, send timeouts) and the user-facing `Producer`
that routes messages over partitions and bounds what is pending."""
from __future__ import annotations

import asyncio
import collections
import enum
import itertools
import logging
import sys
import time
from typing import Any, Callable, Iterable

from .. import codec, compression, timers
from .._proto import PulsarApi_pb2 as pb
from ..errors import (
    AlreadyClosedError, ConnectionClosedError, MessageTooBigError, ProducerQueueFullError, PulsarWireError,
    TimeoutError,
)
from ..messages import MessageId, MessageIds, Span, make_message_id
from ..routing import HashingScheme, OutgoingMessage, Router, RoutingMode
from ..schema import Schema, as_schema
from ..session import SendFailed, SendReceipt
from .connection import ClientContext, Connection
from .options import FATAL_ERRORS, CompressionType, ProducerAccessMode, now_ms
from .reconnect import Reconnecting

log = logging.getLogger("pulsarwire")


class _OpSend:
    """One Send frame in flight: a single message, a batch, or one chunk."""

    __slots__ = ("sequence_id", "highest_sequence_id", "num_messages", "frame", "futures", "created",
                 "first_chunk", "batched", "bulk")

    def __init__(self, sequence_id: int, highest_sequence_id: int, num_messages: int, frame: bytes,
                 futures: list[Answer | None], first_chunk: str | None = None, batched: bool = False,
                 bulk: list[BulkSpan] | None = None) -> None:
        self.sequence_id = sequence_id
        self.highest_sequence_id = highest_sequence_id
        self.num_messages = num_messages
        self.frame = frame
        # one per message (None for a message of a send_many call); empty for all but a message's last chunk
        self.futures = futures
        self.created = time.monotonic()
        self.first_chunk = first_chunk
        self.batched = batched  # a batch entry, even of one message: ids carry batch indexes
        self.bulk = bulk  # send_many spans: [_BulkSend, first input index, first index in the batch, count]


class _BulkSend:
    """The receipts of one send_many call: one future for all, resolved when the last is acknowledged."""

    __slots__ = ("future", "remaining", "spans")

    def __init__(self, future: asyncio.Future[MessageIds], count: int) -> None:
        self.future = future
        self.remaining = count
        self.spans: list[Span] = []

    def acknowledged(self, first: int, count: int, ledger_id: int, entry_id: int, partition: int,
                     batch_first: int, batch_size: int, topic: str | None) -> None:
        self.spans.append((first, count, ledger_id, entry_id, partition, batch_first, batch_size, topic))
        self.remaining -= count
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(MessageIds(self.spans))

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def one_done(self, index: int) -> Callable[[asyncio.Future[MessageId]], None]:
        """A callback for the future of input `index` sent on its own (not batched)."""
        def done(future: asyncio.Future[MessageId]) -> None:
            if future.cancelled():
                self.fail(ConnectionClosedError("cancelled"))
                return
            error = future.exception()
            if error is not None:
                self.fail(error)
                return
            mid = future.result()
            self.acknowledged(index, 1, mid.ledger_id, mid.entry_id, mid.partition, mid.batch_index,
                              mid.batch_size, mid.topic)
        return done


# [_BulkSend, first input index, first index in the batch, count]: send_many messages of one batch
BulkSpan = list[Any]
_NO_OPTIONS: dict[str, Any] = {}


class Receipt:
    """A send's answer delivered by calling `callback(error, message_id)` at once, on the loop,
    where nobody needs a future (`send_nowait`); it stands where a send's future would."""

    __slots__ = ("callback", "_done", "_waiter", "quiet")

    def __init__(self, callback: Callable[[BaseException | None, MessageId | None], None]) -> None:
        self.callback = callback
        self._done = False
        self._waiter: asyncio.Future[None] | None = None
        self.quiet = False  # True: its callback reads no message id, answered with None for one

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def set_result(self, message_id: MessageId) -> None:
        self._answer(None, message_id)

    def set_exception(self, error: BaseException) -> None:
        self._answer(error, None)

    def _answer(self, error: BaseException | None, message_id: MessageId | None) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.callback(error, message_id)
        finally:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)

    def waiter(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future done once this receipt is answered (for flush and close)."""
        if self._waiter is None:
            self._waiter = loop.create_future()
            if self._done:
                self._waiter.set_result(None)
        return self._waiter


# what a send answers through: its future, or a Receipt's callback (None: a send_many message)
Answer = asyncio.Future[MessageId] | Receipt


def _message_parts(item: Any) -> tuple[bytes, str | None, dict[str, str] | None, int | None]:
    """(payload, key, properties, event_timestamp) of a send_many item: a payload, or a tuple of
    (payload, partition_key, properties, event_timestamp), the trailing ones optional."""
    if isinstance(item, tuple):
        if not 1 <= len(item) <= 4:
            raise TypeError("a send_many item is a payload or (payload, partition_key, properties, "
                            "event_timestamp)")
        payload, key, properties, event_timestamp = (item + (None, None, None))[:4]
    else:
        payload, key, properties, event_timestamp = item, None, None, None
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"content must be bytes, not {type(payload).__name__}")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"partition_key must be str, not {type(key).__name__}")
    if properties is not None and not isinstance(properties, dict):
        raise TypeError(f"properties must be a dict, not {type(properties).__name__}")
    if event_timestamp is not None and (not isinstance(event_timestamp, int) or isinstance(event_timestamp, bool)
                                        or event_timestamp < 0):
        raise TypeError(f"event_timestamp must be a non-negative int (ms), not {event_timestamp!r}")
    return bytes(payload) if not isinstance(payload, bytes) else payload, key, properties, event_timestamp


class PartitionProducer(Reconnecting):
    """Producer on one (partition) topic."""

    def __init__(self, parent: "Producer", topic: str, partition: int) -> None:
        self.parent = parent
        self.context = parent.context
        self.topic = topic
        self.partition = partition
        self.producer_id = next(self.context.ids)
        self.producer_name = parent._producer_name
        self.conn: Connection | None = None
        self.pending: collections.deque[_OpSend] = collections.deque()
        self._written = 0  # pending[:_written] went out on self.conn; the rest waits for receipts
        self._wire_bytes = 0  # their frames' bytes, counted in the budget of _wire_conn
        self._wire_conn: Connection | None = None
        initial = parent._initial_sequence_id
        # As the official client: the first message takes initial + 1 (initial is the last one
        # already published), and without an initial id the broker's last one decides.
        self.last_sequence_id = -1 if initial is None else initial
        self._next_sequence_id: int | None = None if initial is None else initial + 1
        self._epoch = 0
        self._topic_epoch: int | None = None  # granted by the broker to an exclusive producer
        self._batch = codec.BatchBuilder()
        self._batch_futures: list[Answer | None] = []
        self._batch_bulk: list[BulkSpan] = []
        self._batch_first_sequence = 0
        self._batch_timer: asyncio.TimerHandle | timers.ThreadTimer | None = None
        self.batch_due_at = 0.0  # when (loop.time()) the open batch's timer sends it
        self._reconnecting: asyncio.Task[None] | None = None
        self._closed = False
        self._failed: BaseException | None = None
        self._timeout_task: asyncio.Task[None] | None = None
        self._chunk_ids: dict[str | None, MessageId] = {}  # by a chunked message's uuid (None never stored)
        self.schema_version: bytes | None = None
        self._started: asyncio.Future[None] | None = None  # set once start() runs (lazy producers)
        self.ready = False  # attached at least once: sequence ids are known

    async def start(self) -> None:
        started = self._started
        if started is None or (started.done() and started.exception() is not None):
            started = self._started = asyncio.ensure_future(self._start_once())  # first, or a failed lazy try
        await asyncio.shield(started)

    async def _start_once(self) -> None:
        await self._connect()
        self.ready = True
        if self.parent._send_timeout:
            self._timeout_task = asyncio.ensure_future(self._check_send_timeouts())

    async def _connect(self) -> None:
        conn = await self.context.pool.lookup(self.topic)
        fields: dict[str, Any] = dict(topic=self.topic, producer_id=self.producer_id, epoch=self._epoch,
                                      producer_access_mode=self.parent._access_mode)
        if self.producer_name:
            fields["producer_name"] = self.producer_name
            fields["user_provided_producer_name"] = self.parent._user_named
        if self.parent._metadata:
            fields["metadata"] = [pb.KeyValue(key=k, value=v) for k, v in self.parent._metadata.items()]
        if self._topic_epoch is not None:  # coming back: fenced if another exclusive producer came
            fields["topic_epoch"] = self._topic_epoch
        if self.parent._wire_schema is not None:
            fields["schema"] = self.parent._wire_schema
        if self.parent._initial_subscription_name:
            fields["initial_subscription_name"] = self.parent._initial_subscription_name
        conn.producers[self.producer_id] = self
        try:
            # WaitForExclusive: the broker answers once this producer has the topic, however long
            response = await conn.request(conn.session.create_producer, **fields,
                                          _wait=self.parent._access_mode == pb.WaitForExclusive)
        except BaseException:
            conn.producers.pop(self.producer_id, None)
            raise
        self._epoch += 1
        if response.HasField("topic_epoch"):
            self._topic_epoch = response.topic_epoch
        self.producer_name = response.producer_name
        if response.HasField("schema_version"):
            self.schema_version = response.schema_version
        if self._next_sequence_id is None:
            self.last_sequence_id = max(self.last_sequence_id, response.last_sequence_id)
            self._next_sequence_id = response.last_sequence_id + 1
        self.conn = conn
        self._forget_pending()  # what went out on an earlier connection (or attachment) goes again
        self.write_pending()  # resend in order, same sequence ids: the broker dedups

    def _give_up(self, error: BaseException) -> None:
        self._fail_all(error)

    # sending

    @property
    def _message_limit(self) -> int:
        """The most metadata and payload bytes the broker takes in one message (its own figure
        once connected)."""
        return self.conn.max_message_size if self.conn else codec.DEFAULT_MAX_MESSAGE_SIZE

    def _take_sequence_id(self, requested: int | None) -> int:
        assert self._next_sequence_id is not None, "sequence ids start once the producer is created"
        if requested is not None:
            self._next_sequence_id = max(self._next_sequence_id, requested + 1)
            return requested
        sequence_id = self._next_sequence_id
        self._next_sequence_id += 1
        return sequence_id

    def send(self, payload: bytes, options: dict[str, Any], future: Answer) -> bool:
        """Queue one message; True when a frame went out for it or for the batch it closed (the
        loop should write it soon: Producer.send_async yields then)."""
        if self._failed is not None:
            future.set_exception(self._failed)
            return False
        parent = self.parent
        sequence_id = self._take_sequence_id(options.get("sequence_id"))
        limit = self._message_limit
        # As the official client, a message over batching_max_allowed_size_in_bytes still goes in
        # a batch (of one), so its id has batch index 0; only delayed or too-big ones go alone.
        batchable = parent._batching and options.get("deliver_at") is None and \
            not options.get("partition_key_b64_encoded") and len(payload) + _options_size(options) <= limit - 1024
        if batchable:
            closed = False
            if self._batch.num_messages and self._batch.size + len(payload) > parent._batching_max_bytes:
                self.flush_batch()  # closed by its byte limit: this message opens the next
                closed = True
            if self._batch.num_messages == 0:
                self._batch_first_sequence = sequence_id
            self._batch.add(payload, options.get("properties"), options.get("partition_key"),
                            options.get("event_timestamp") or 0, options.get("ordering_key"),
                            sequence_id, options.get("null_value", False))
            self._batch_futures.append(future)
            if self._batch.num_messages >= parent._batching_max_messages or \
                    self._batch.size >= parent._batching_max_bytes:
                self.flush_batch()
                return True
            if self._batch_timer is None:
                self._batch_timer = self._arm_batch_timer()
            return closed
        self._send_alone(payload, options, future, sequence_id)
        return parent._batching  # what was batched went out before it

    def _send_alone(self, payload: bytes, options: dict[str, Any], future: Answer, sequence_id: int) -> None:
        """send() of a message that goes in no batch (batching off, delayed, or too big: chunked)."""
        parent, limit = self.parent, self._message_limit
        self.flush_batch()  # keep order: anything batched before goes first
        if not options:  # the common case: the frame written at once, no protobuf message built
            kind, body = parent._compress(payload)
            assert self.producer_name is not None  # named by the broker before anything is sent
            frame = codec.encode_send(self.producer_id, sequence_id, sequence_id, 1, self.producer_name, now_ms(),
                                      body, False, self.schema_version, kind, len(payload) if kind else 0)
            if codec.metadata_and_payload_size(frame) <= limit:
                self._enqueue(_OpSend(sequence_id, sequence_id, 1, frame, [future]))
                return
            metadata = self._metadata(sequence_id, options)  # too big: chunked, or refused, below
            _mark_compressed(metadata, kind, len(payload))
        else:
            metadata = self._metadata(sequence_id, options)
            body = parent._compressed(metadata, payload)
        # the broker's limit is on metadata and payload together, as the official client counts
        metadata_size = metadata.ByteSize()
        if len(body) + metadata_size > limit:
            # every chunk carries the metadata, plus about 1 KiB of chunk fields at most
            chunk_size = limit - metadata_size - 1024
            if not parent._chunking or chunk_size < 1024:
                future.set_exception(MessageTooBigError(
                    f"message of {len(body)} bytes (and {metadata_size} of metadata) is over the broker's "
                    f"{limit}-byte limit; " + ("its metadata leaves no room for chunks" if parent._chunking
                                               else "enable chunking_enabled to send it")))
                self.parent._release(1)
                return
            self._send_chunks(metadata, body, chunk_size, future)
            return
        frame = codec.encode_payload_command(self._send_command(sequence_id, sequence_id, 1), metadata, body)
        self._enqueue(_OpSend(sequence_id, sequence_id, 1, frame, [future]))

    def send_plain(self, payload: bytes, future: Answer) -> bool:
        """send() of a bytes payload without options: the per-message path of send_async, kept short."""
        parent = self.parent
        if self._failed is not None or not parent._batching or len(payload) >= parent._batching_max_bytes:
            return self.send(payload, _NO_OPTIONS, future)
        batch = self._batch
        closed = False
        if batch.num_messages and batch.size + len(payload) > parent._batching_max_bytes:
            self.flush_batch()  # as send(): a batch stays within its byte limit
            closed = True
        sequence_id = self._take_sequence_id(None)
        if batch.num_messages == 0:
            self._batch_first_sequence = sequence_id
        batch.add(payload, None, None, 0, None, sequence_id)
        self._batch_futures.append(future)
        if batch.num_messages >= parent._batching_max_messages or batch.size >= parent._batching_max_bytes:
            self.flush_batch()
            return True
        if self._batch_timer is None:
            self._batch_timer = self._arm_batch_timer()
        return closed

    def send_many(self, items: list[Any], start: int, stop: int, indexes: list[int] | None, bulk: _BulkSend) -> None:
        """Queue items[start:stop] in order, receipts to `bulk`; items are plain bytes payloads or
        (payload, key, properties) tuples checked by _message_parts. indexes[k] is items[k]'s place in
        the caller's list (None: k). Plain payloads go into the batch in one codec call; no future
        per message unless one is sent on its own (batching off, or too large for a batch)."""
        if self._failed is not None:
            bulk.fail(self._failed)
            self.parent._release(stop - start)
            return
        parent = self.parent
        batch = self._batch
        batching = parent._batching
        max_messages, max_bytes = parent._batching_max_messages, parent._batching_max_bytes
        k = start
        while k < stop:
            item = items[k]
            if batching and indexes is None and type(item) is bytes and len(item) < max_bytes:
                first_sequence_id = self._next_sequence_id
                assert first_sequence_id is not None, "sequence ids start once the producer is created"
                if batch.num_messages == 0:
                    self._batch_first_sequence = first_sequence_id
                added = batch.add_many(items, k, first_sequence_id, min(max_messages, batch.num_messages +
                                                                           stop - k), max_bytes)
                self._next_sequence_id = first_sequence_id + added
                self._bulk_span(bulk, k, added)
                k += added
            else:
                payload, key, properties, event_timestamp = item if type(item) is tuple else \
                    (item, None, None, None)
                index = k if indexes is None else indexes[k]
                k += 1
                if not batching or len(payload) >= max_bytes:
                    future = self.context.loop.create_future()
                    future.add_done_callback(bulk.one_done(index))
                    self.send(payload, {"partition_key": key, "properties": properties,
                                        "event_timestamp": event_timestamp}, future)
                    continue
                sequence_id = self._take_sequence_id(None)
                if batch.num_messages == 0:
                    self._batch_first_sequence = sequence_id
                batch.add(payload, properties, key, event_timestamp or 0, None, sequence_id)
                self._bulk_span(bulk, index, 1)
            if batch.num_messages >= max_messages or batch.size >= max_bytes:
                self.flush_batch()
            elif self._batch_timer is None and batch.num_messages:
                self._batch_timer = self._arm_batch_timer()

    def _bulk_span(self, bulk: _BulkSend, first: int, count: int) -> None:
        """Inputs first..first+count-1 of `bulk` are the batch's next messages."""
        spans = self._batch_bulk
        at = len(self._batch_futures)
        last = spans[-1] if spans else None
        if last is not None and last[0] is bulk and last[1] + last[3] == first and last[2] + last[3] == at:
            last[3] += count
        else:
            spans.append([bulk, first, at, count])
        self._batch_futures.extend(itertools.repeat(None, count))

    def _send_chunks(self, metadata: pb.MessageMetadata, body: bytes, chunk_size: int, future: Answer) -> None:
        sequence_id = metadata.sequence_id
        count = (len(body) + chunk_size - 1) // chunk_size
        metadata.uuid = f"{self.producer_name}-{sequence_id}"
        metadata.num_chunks_from_msg = count
        metadata.total_chunk_msg_size = len(body)
        for chunk_id in range(count):
            metadata.chunk_id = chunk_id
            command = self._send_command(sequence_id, sequence_id, 1)
            command.send.is_chunk = True
            frame = codec.encode_payload_command(command, metadata,
                                                 body[chunk_id * chunk_size:(chunk_id + 1) * chunk_size])
            last = chunk_id == count - 1
            self._enqueue(_OpSend(sequence_id, sequence_id, 1 if last else 0, frame,
                                  [future] if last else [], first_chunk=metadata.uuid))

    def _metadata(self, sequence_id: int, options: dict[str, Any]) -> pb.MessageMetadata:
        md = pb.MessageMetadata(producer_name=self.producer_name, sequence_id=sequence_id,
                                publish_time=now_ms())
        if options.get("properties"):
            md.properties.extend(pb.KeyValue(key=k, value=v) for k, v in options["properties"].items())
        if options.get("partition_key") is not None:
            md.partition_key = options["partition_key"]
            if options.get("partition_key_b64_encoded"):
                md.partition_key_b64_encoded = True
        if self.schema_version is not None:
            md.schema_version = self.schema_version
        if options.get("ordering_key") is not None:
            md.ordering_key = options["ordering_key"]
        if options.get("event_timestamp"):
            md.event_time = options["event_timestamp"]
        if options.get("deliver_at") is not None:
            md.deliver_at_time = options["deliver_at"]
        if options.get("null_value"):
            md.null_value = True
        return md

    def _send_command(self, sequence_id: int, highest: int, count: int) -> pb.BaseCommand:
        cmd = pb.BaseCommand(type=pb.BaseCommand.SEND)
        cmd.send.producer_id = self.producer_id
        cmd.send.sequence_id = sequence_id
        cmd.send.num_messages = count
        if highest != sequence_id:
            cmd.send.highest_sequence_id = highest
        return cmd

    def _arm_batch_timer(self) -> asyncio.TimerHandle | timers.ThreadTimer:
        """The publish delay of a batch just started: from now, or from when its first message
        was accepted in another thread (`Producer.accepted_at`), as the official client's
        timer starts at the call: the hop to the loop is not added to the delay."""
        parent, loop = self.parent, self.context.loop
        start = loop.time() if parent.accepted_at is None else parent.accepted_at
        self.batch_due_at = start + parent._batching_delay
        return timers.call_at(loop, self.batch_due_at, self._batch_due)

    def _batch_due(self) -> None:
        """The publish delay is over: the batch goes out now, written at once rather than with
        the next turn of the loop (nothing else is being gathered into it)."""
        self._batch_timer = None
        gather = self.parent.before_batch_due
        if gather is not None:
            gather()
        self.flush_batch()
        conn = self.conn
        if conn is not None:
            conn.flush_now()

    def flush_batch(self) -> None:
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        count = self._batch.num_messages
        if count == 0:
            return
        raw = self._batch.build()
        futures = self._batch_futures
        bulk = self._batch_bulk or None
        self._batch.clear()
        self._batch_futures = []
        self._batch_bulk = []
        first = self._batch_first_sequence
        highest = first + count - 1
        kind, body = self.parent._compress(raw)
        assert self.producer_name is not None  # named by the broker before anything is sent
        frame = codec.encode_send(self.producer_id, first, highest, count, self.producer_name, now_ms(), body,
                                  True, self.schema_version, kind, len(raw) if kind else 0)
        limit = self._message_limit
        if codec.metadata_and_payload_size(frame) > limit:
            # the broker would close the connection on this frame, and the resend after each
            # reconnect would meet the same fate: the batch's messages fail here instead
            _fail_op(futures, bulk, MessageTooBigError(
                f"a batch of {count} messages, {len(body)} bytes, is over the broker's {limit}-byte limit"))
            self.parent._release(len(futures))
            return
        self._enqueue(_OpSend(first, highest, count, frame, futures, batched=True, bulk=bulk))

    def _enqueue(self, op: _OpSend) -> None:
        pending = self.pending
        pending.append(op)
        conn = self.conn
        if conn is not None and self._written == len(pending) - 1:
            if conn.wire_bytes < conn.WIRE_BUDGET or not self._written:
                size = len(op.frame)
                conn.write_frame(op.frame)
                self._written += 1
                self._wire_bytes += size
                conn.wire_bytes += size
                self._wire_conn = conn
            else:
                conn.wait_for_wire(self)

    def write_pending(self) -> None:
        """Write pending frames not yet on the wire, in order, while the connection's budget for
        unacknowledged Send bytes lets them (one frame of this producer's always goes)."""
        conn = self.conn
        if conn is None:
            return
        pending = self.pending
        while self._written < len(pending):
            if conn.wire_bytes >= conn.WIRE_BUDGET and self._written:
                conn.wait_for_wire(self)
                return
            frame = pending[self._written].frame
            conn.write_frame(frame)
            self._written += 1
            self._wire_bytes += len(frame)
            conn.wire_bytes += len(frame)
            self._wire_conn = conn

    def _forget_pending(self) -> None:
        """Nothing of pending is on the wire any more (failed, timed out, or to go again on a new
        attachment): its bytes leave the budget they were counted in."""
        conn, size = self._wire_conn, self._wire_bytes
        self._written = self._wire_bytes = 0
        self._wire_conn = None
        if conn is not None and size:
            conn.wire_released(size)

    # ProducerHandler: called by the connection

    def on_receipt(self, receipt: SendReceipt) -> None:
        while self.pending:
            op = self.pending[0]
            if receipt.sequence_id < op.sequence_id:
                return  # a duplicate receipt for something already acknowledged
            if receipt.sequence_id > op.sequence_id:
                log.warning("producer %s: receipt for %d while %d is oldest; resending",
                            self.producer_name, receipt.sequence_id, op.sequence_id)
                if self.conn is not None:
                    self.conn.abort(PulsarWireError("out-of-order send receipt"))
                return
            self.pending.popleft()
            if self._written:
                self._written -= 1
                self._wire_bytes -= len(op.frame)
                if self._wire_conn is not None:
                    self._wire_conn.wire_released(len(op.frame))  # other producers waiting go first
                if self._written < len(self.pending):
                    self.write_pending()
            if op.num_messages == 0 and op.first_chunk is not None and not op.futures:
                if op.first_chunk not in self._chunk_ids:
                    self._chunk_ids[op.first_chunk] = MessageId(receipt.ledger_id, receipt.entry_id,
                                                                self.partition, topic=self.topic)
                return  # earlier chunk: wait for the receipt of the last one
            first_chunk = self._chunk_ids.pop(op.first_chunk, None) if op.first_chunk is not None else None
            self.last_sequence_id = max(self.last_sequence_id, op.highest_sequence_id)
            ledger, entry = receipt.ledger_id, receipt.entry_id  # a duplicate is (-1, -1)
            futures = op.futures
            # a batch of send_many's messages alone holds no future: nothing to look at one by one
            for index in range(len(futures) if futures.count(None) != len(futures) else 0):
                # (not enumerate: its tuple would hold a reference, see _unobserved)
                future = futures[index]
                if future is None:
                    continue  # a message of a send_many call: answered through op.bulk
                if type(future) is _FUTURE:
                    if future.done() or _unobserved(future):
                        continue
                elif future.quiet:  # type: ignore[union-attr]  # a Receipt (not a future) reading no id
                    future.set_result(None)  # type: ignore[arg-type]
                    continue
                if op.batched:
                    future.set_result(make_message_id(ledger, entry, self.partition, index,
                                                      len(futures), self.topic))
                elif first_chunk is not None:  # a chunked message's id names its first chunk too
                    future.set_result(MessageId(ledger, entry, self.partition, topic=self.topic,
                                                first_chunk=(first_chunk.ledger_id, first_chunk.entry_id)))
                else:
                    future.set_result(make_message_id(ledger, entry, self.partition, -1, 0, self.topic))
            if op.bulk is not None:
                batch_size = len(op.futures) if op.batched else 0
                for bulk, first, batch_first, count in op.bulk:
                    bulk.acknowledged(first, count, ledger, entry, self.partition,
                                      batch_first if batch_size else -1, batch_size, self.topic)
            self.parent._release(len(op.futures))
            return

    def on_send_error(self, event: SendFailed) -> None:
        log.warning("producer %s: send error for %d: %s", self.producer_name, event.sequence_id, event.error)
        if isinstance(event.error, FATAL_ERRORS):
            self._fail_all(event.error)
        elif self.conn is not None:  # the broker closes; pending messages are resent after reconnect
            self.conn.abort(event.error)

    def _fail_all(self, error: BaseException) -> None:
        self._failed = error
        released = 0
        while self.pending:
            op = self.pending.popleft()
            _fail_op(op.futures, op.bulk, error)
            released += len(op.futures)
        self._forget_pending()
        _fail_op(self._batch_futures, self._batch_bulk, error)
        released += len(self._batch_futures)
        self._batch_futures = []
        self._batch_bulk = []
        self._batch.clear()
        self.parent._release(released)

    async def _check_send_timeouts(self) -> None:
        timeout = self.parent._send_timeout
        try:
            while not self._closed:
                await asyncio.sleep(min(timeout / 4, 1.0))
                if self.pending and time.monotonic() - self.pending[0].created > timeout:
                    error = TimeoutError(f"send to {self.topic} not acknowledged within {timeout}s")
                    released = 0
                    while self.pending:
                        op = self.pending.popleft()
                        _fail_op(op.futures, op.bulk, error)
                        released += len(op.futures)
                    self._forget_pending()
                    self.parent._release(released)
        except asyncio.CancelledError:
            pass

    async def wait_pending(self) -> None:
        # futures, and Receipts replaced by their waiters below
        waiting: dict[int, Any] = {id(f): f for op in self.pending for f in op.futures if f is not None}
        waiting.update((id(f), f) for f in self._batch_futures if f is not None)
        loop = self.context.loop
        for key, receipt in list(waiting.items()):
            if isinstance(receipt, Receipt):
                waiting[key] = receipt.waiter(loop)
        waiting.update((id(span[0]), span[0].future) for op in self.pending if op.bulk for span in op.bulk)
        waiting.update((id(span[0]), span[0].future) for span in self._batch_bulk)
        futures = list(waiting.values())
        if futures:
            await asyncio.gather(*futures, return_exceptions=True)

    async def close(self) -> None:
        self.flush_batch()
        await self.wait_pending()
        self._closed = True
        for task in (self._timeout_task, self._reconnecting):
            if task is not None:
                task.cancel()
        conn = self.conn
        self.conn = None
        if conn is not None and not conn.closed:
            conn.producers.pop(self.producer_id, None)
            try:
                await conn.request(conn.session.close_producer, self.producer_id)
            except PulsarWireError:
                pass
        self._fail_all(ConnectionClosedError("producer closed"))


def _mark_compressed(md: pb.MessageMetadata, kind: int, uncompressed_size: int) -> None:
    """Say in `md` how its payload is compressed (nothing for kind 0, none)."""
    if kind:
        md.compression = kind  # type: ignore[assignment]
        md.uncompressed_size = uncompressed_size


def _options_size(options: dict[str, Any]) -> int:
    """About what a message's key, ordering key and properties add to it in a batch."""
    size = len(options.get("partition_key") or "") + len(options.get("ordering_key") or b"")
    for key, value in (options.get("properties") or {}).items():
        size += len(key) + len(value)
    return size


_FUTURE = asyncio.Future  # what loop.create_future() makes (a Receipt stands where one would: always answered)
_getrefcount = getattr(sys, "getrefcount", None)
# references to a future nobody else holds, as _unobserved counts them: its op's list, on_receipt's
# local name, _unobserved's argument and getrefcount's own
_ONLY_ON_RECEIPTS = 4


def _unobserved(future: asyncio.Future[Any]) -> bool:
    """Whether nobody can ever read this future's result (called from on_receipt only): no
    reference to it but on_receipt's own (send_async's caller dropped it, as a producer that
    awaits only flush() does) and no callback on it (a Task awaiting it, gather and
    add_done_callback each add one). Its MessageId is then not made, nor its result set: a
    third of send_async's cost a message. Where the interpreter does not count references,
    every future is answered."""
    return _getrefcount is not None and _getrefcount(future) <= _ONLY_ON_RECEIPTS \
        and not future._callbacks


def _fail_op(futures: list[Answer | None], bulk: list[BulkSpan] | None, error: BaseException) -> None:
    for future in futures:
        if future is not None and not future.done():
            future.set_exception(error)
    for span in bulk or ():
        span[0].fail(error)


async def open_producer(context: ClientContext, topic: str, **options: Any) -> Producer:
    """A started producer on `topic`, among the client's open handles."""
    producer = Producer(context, topic, **options)
    await producer._start()
    context.handles.add(producer)
    return producer


class Producer:
    """Sends messages to a topic (all partitions of it when partitioned)."""

    def __init__(self, context: ClientContext, topic: str, *, producer_name: str | None = None,
                 initial_sequence_id: int | None = None, send_timeout_millis: int = 30_000,
                 compression_type: int | str = CompressionType.NONE,
                 max_pending_messages: int = 1000, block_if_queue_full: bool = True,
                 batching_enabled: bool = True, batching_max_messages: int = 1000,
                 batching_max_allowed_size_in_bytes: int = 128 * 1024,
                 batching_max_publish_delay_ms: float = 10, chunking_enabled: bool = False,
                 message_routing_mode: RoutingMode = RoutingMode.RoundRobinPartition,
                 hashing_scheme: HashingScheme = HashingScheme.JavaStringHash,
                 properties: dict[str, str] | None = None, access_mode: int = pb.Shared,
                 schema: Schema | None = None, message_router: Callable[[Any, int], int] | None = None,
                 lazy_start_partitioned_producers: bool = False,
                 initial_subscription_name: str | None = None, compress_where_it_pays: bool = False) -> None:
        if chunking_enabled and batching_enabled:
            raise ValueError("chunking cannot be combined with batching")
        if message_router is not None and not callable(message_router):
            raise TypeError("message_router must be a callable (message, num_partitions) -> partition")
        self._schema = schema = as_schema(schema)
        self._wire_schema = schema.wire_schema() if schema is not None else None
        self._message_router = message_router
        self._lazy = lazy_start_partitioned_producers
        self._initial_subscription_name = initial_subscription_name
        self.context = context
        self._topic = topic
        self._producer_name = producer_name
        self._user_named = producer_name is not None
        # As the official client: 0 (its Python layer tests truthiness) and -1 (its "unset") leave
        # the broker's last sequence id in charge.
        self._initial_sequence_id = None if initial_sequence_id in (None, 0, -1) else initial_sequence_id
        self._send_timeout = send_timeout_millis / 1000
        self._compression: Any = compression.compression_type(
            compression_type.name if isinstance(compression_type, enum.Enum) else compression_type)
        # compress_where_it_pays: a batch its codec hardly shrinks goes uncompressed (WhereItPays)
        self._where_it_pays = compression.WhereItPays(self._compression) \
            if compress_where_it_pays and self._compression else None
        self._max_pending = max_pending_messages
        self._block = block_if_queue_full
        self._batching = batching_enabled
        self._batching_max_messages = batching_max_messages
        # as the Java client: a batch never grows past what the broker takes in one message
        self._batching_max_bytes = min(batching_max_allowed_size_in_bytes, codec.DEFAULT_MAX_MESSAGE_SIZE - 1024)
        self._batching_delay = batching_max_publish_delay_ms / 1000
        # set around send_nowait by a caller's hand-over: when (loop.time()) the message was
        # accepted in the caller's thread; a batch it starts counts its delay from then
        self.accepted_at: float | None = None
        # called as a batch's delay runs out, before it goes: sends accepted by then in another
        # thread and not yet handed over (pulsarwire.sync) join it, as they would have joined an
        # official client's batch
        self.before_batch_due: Callable[[], None] | None = None
        self._chunking = chunking_enabled
        self._metadata = properties or {}
        self._access_mode = int(ProducerAccessMode(access_mode))
        self._router = Router(hashing_scheme, message_routing_mode)
        self._partitions: list[PartitionProducer] = []
        self._in_flight = 0
        # a future per send waiting for room under max_pending_messages, set once there is room
        self._space_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        # send_async closed a batch: the next call lets the loop run first (see send_async)
        self._yield_due = False

    async def _start(self) -> None:
        topics = await self.context.pool.topic_partitions(self._topic)
        partitioned = len(topics) > 1 or topics[0] != self._topic
        self._partitions = [PartitionProducer(self, t, i if partitioned else -1) for i, t in enumerate(topics)]
        # lazy: each partition's producer attaches on the first message routed to it
        starting = self._partitions[:0] if self._lazy and partitioned else self._partitions
        try:
            await asyncio.gather(*(p.start() for p in starting))
        except BaseException:
            for p in self._partitions:
                p._closed = True
                if p._timeout_task:
                    p._timeout_task.cancel()
            raise

    def topic(self) -> str:
        return self._topic

    def producer_name(self) -> str:
        return next((p.producer_name for p in self._partitions if p.producer_name), "")

    def last_sequence_id(self) -> int:
        return max(p.last_sequence_id for p in self._partitions)

    def is_connected(self) -> bool:
        """Whether every partition's producer has a live connection now."""
        return not self._closed and all(p.conn is not None and not p.conn.closed for p in self._partitions)

    def _compressed(self, md: pb.MessageMetadata, payload: Any) -> Any:
        """`payload` as this producer sends it, `md` saying how it is compressed, if at all."""
        kind, packed = self._compress(payload)
        _mark_compressed(md, kind, len(payload))
        return packed

    def _compress(self, payload: Any) -> tuple[int, Any]:
        """(the compression kind, 0 for none; `payload` as this producer sends it)."""
        kind = self._compression
        if not kind:
            return 0, payload
        if self._where_it_pays is not None:
            return self._where_it_pays.compress(payload)
        return kind, compression.compress(kind, payload)

    def _release(self, count: int) -> None:
        if count:
            self._in_flight -= count
            waiters = self._space_waiters
            if waiters and self._in_flight < self._max_pending:
                # every waiter looks again (as a condition's notify_all), without a task each time
                # (a task per receipt was a twentieth of a sink's time at 100 B)
                while waiters:
                    waiter = waiters.popleft()
                    if not waiter.done():
                        waiter.set_result(None)

    async def _wait_for_space(self) -> None:
        while self._in_flight >= self._max_pending:
            waiter = self.context.loop.create_future()  # its own: a cancelled send cancels only it
            self._space_waiters.append(waiter)
            await waiter

    async def send_async(self, content: bytes, *, properties: dict[str, str] | None = None,
                         partition_key: str | None = None, ordering_key: bytes | None = None,
                         event_timestamp: int | None = None, sequence_id: int | None = None,
                         deliver_at: int | None = None, deliver_after_ms: int | None = None,
                         ) -> asyncio.Future[MessageId]:
        """Queue a message; returns a future for its MessageId (waits only for queue space).
        `content=None` sends a null value (the metadata's null_value set, no payload). Every wait
        comes before the message is queued: a call cancelled in one sends nothing, and one that
        returns has queued its message."""
        if self._yield_due:
            # The call before closed a batch (full by count, or by bytes before its message opened
            # the next) and wrote it: the loop reads receipts now, before more is queued. Without
            # this a producer with room for many pending sends queued them all before the loop ran
            # (half the rate at 100 B with batches of 5 000). Here, not after that call's message
            # was queued: a task cancelled in this wait has sent nothing.
            self._yield_due = False
            await asyncio.sleep(0)
        if self._closed:
            raise AlreadyClosedError("producer is closed")
        if type(content) is bytes and properties is None and partition_key is None and ordering_key is None \
                and event_timestamp is None and sequence_id is None and deliver_at is None \
                and deliver_after_ms is None and self._schema is None:
            options = _NO_OPTIONS  # the common case: nothing to check
        else:
            content, options = self._send_options(content, properties, partition_key, ordering_key,
                                                  event_timestamp, sequence_id, deliver_at, deliver_after_ms)
        if self._in_flight >= self._max_pending and not self._block:
            raise ProducerQueueFullError(f"{self._max_pending} messages pending")
        partitions = self._partitions
        target = partitions[0 if len(partitions) == 1 else self._partition_index(content, options)]
        if not target.ready:
            await target.start()  # a lazy partition's producer attaches on its first message
        conn = target.conn
        if conn is not None and not conn.can_write.is_set():
            await conn.drain()  # the connection's output is over its mark: this message waits
        if self._in_flight >= self._max_pending:  # the last wait: nothing takes the room it finds
            if not self._block:
                raise ProducerQueueFullError(f"{self._max_pending} messages pending")
            await self._wait_for_space()
        if self._closed:  # closed during a wait: answered as a call made after close()
            raise AlreadyClosedError("producer is closed")
        if options is not _NO_OPTIONS and options.get("deliver_after_ms") is not None:
            options["deliver_at"] = now_ms() + options.pop("deliver_after_ms")
        future = self.context.loop.create_future()
        self._in_flight += 1
        if options is _NO_OPTIONS:
            went_out = target.send_plain(content, future)
        else:
            went_out = target.send(content, options, future)
        if went_out:
            conn = target.conn
            if conn is not None:
                conn.flush_now()  # the closed batch is on the wire when this call returns
            self._yield_due = True
        return future

    def _send_options(self, content: Any, properties: dict[str, str] | None, partition_key: str | None,
                      ordering_key: bytes | None, event_timestamp: int | None, sequence_id: int | None,
                      deliver_at: int | None, deliver_after_ms: int | None) -> tuple[bytes, dict[str, Any]]:
        """Checked send options and the content to send (schema-encoded): _NO_OPTIONS when there are none."""
        _check_send_options(properties, partition_key, ordering_key, event_timestamp=event_timestamp,
                            sequence_id=sequence_id, deliver_at=deliver_at, deliver_after_ms=deliver_after_ms)
        b64_key = None
        null_value = content is None  # a tombstone: no payload, the metadata's null_value set
        if null_value:
            content = b""
        elif self._schema is not None:
            content, b64_key = self._schema.encode_message(content)
            if b64_key is not None:
                partition_key = b64_key
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise TypeError(f"content must be bytes, not {type(content).__name__}")
        content = bytes(content) if not isinstance(content, bytes) else content
        if properties is None and partition_key is None and ordering_key is None and event_timestamp is None \
                and sequence_id is None and deliver_at is None and deliver_after_ms is None and not null_value:
            return content, _NO_OPTIONS
        return content, {"properties": properties, "partition_key": partition_key, "ordering_key": ordering_key,
                         "event_timestamp": event_timestamp, "sequence_id": sequence_id, "deliver_at": deliver_at,
                         "deliver_after_ms": deliver_after_ms, "partition_key_b64_encoded": b64_key is not None,
                         "null_value": null_value}

    def send_nowait(self, content: bytes, receipt: Answer, *, properties: dict[str, str] | None = None,
                    partition_key: str | None = None, ordering_key: bytes | None = None,
                    event_timestamp: int | None = None, sequence_id: int | None = None,
                    deliver_at: int | None = None, deliver_after_ms: int | None = None) -> bool:
        """send_async without its waits, answering through `receipt` (a future, or a `Receipt`):
        False, with nothing queued, when the message would have to wait (no room under
        max_pending_messages, a lazy partition not attached yet). Raises as send_async does."""
        if self._closed:
            raise AlreadyClosedError("producer is closed")
        if type(content) is bytes and properties is None and partition_key is None and ordering_key is None \
                and event_timestamp is None and sequence_id is None and deliver_at is None \
                and deliver_after_ms is None and self._schema is None:
            options = _NO_OPTIONS
        else:
            content, options = self._send_options(content, properties, partition_key, ordering_key,
                                                  event_timestamp, sequence_id, deliver_at, deliver_after_ms)
        if self._in_flight >= self._max_pending:
            return False
        target = self._partitions[self._partition_index(content, options)]
        if not target.ready:
            return False
        if options is not _NO_OPTIONS and options.get("deliver_after_ms") is not None:
            options["deliver_at"] = now_ms() + options.pop("deliver_after_ms")
        self._in_flight += 1
        if options is _NO_OPTIONS:
            target.send_plain(content, receipt)
        else:
            target.send(content, options, receipt)
        return True

    async def send_many(self, messages: Iterable[Any]) -> asyncio.Future[MessageIds]:
        """Queue messages in order: payloads, or (payload, partition_key, properties) tuples.

        Returns one future for all their MessageIds (a `MessageIds` sequence, in input order),
        waiting only for queue space; past max_pending_messages it queues what fits, waits, and
        goes on (with block_if_queue_full=False it raises ProducerQueueFullError, queuing
        nothing, when they do not all fit). On a failure the future raises the first error;
        messages acknowledged before it stay stored. Plain bytes payloads on a batching
        producer take the fast path: no Python object per message.
        """
        if self._closed:
            raise ConnectionClosedError("producer is closed")
        items = messages if type(messages) is list else list(messages)
        count = len(items)
        future = self.context.loop.create_future()
        bulk = _BulkSend(future, count)
        if count == 0:
            future.set_result(MessageIds([]))
            return future
        plain = type(items[0]) is bytes and set(map(type, items)) == {bytes}
        if not plain:
            items = [item if type(item) is bytes else _message_parts(item) for item in items]
        if not self._block and self._in_flight + count > self._max_pending:
            raise ProducerQueueFullError(f"{self._in_flight} messages pending, {count} more do not fit "
                                         f"under {self._max_pending}")
        partitions = self._partitions
        start = 0
        while start < count:
            if self._in_flight >= self._max_pending:
                await self._wait_for_space()
                if self._closed:
                    bulk.fail(ConnectionClosedError("producer is closed"))
                    return future
            stop = min(count, start + self._max_pending - self._in_flight)
            self._in_flight += stop - start
            if len(partitions) == 1:
                partitions[0].send_many(items, start, stop, None, bulk)
                targets = partitions
            elif plain and self._message_router is None:
                # keyless payloads, the built-in router: round robin by contiguous slices, one per
                # partition (as the official client's round robin switches partition per batch,
                # not per message), so each partition batches its slice in one codec call
                parts = len(partitions)
                first = self._router.partition(None, parts)
                slices = 1 if self._router.single_partition else parts
                size = -(-(stop - start) // slices)
                targets = []
                for j, lo in enumerate(range(start, stop, size)):
                    target = await self._attached((first + j) % parts)
                    target.send_many(items, lo, min(stop, lo + size), None, bulk)
                    targets.append(target)
            else:
                routed: dict[int, tuple[list[Any], list[int]]] = {}
                for index in range(start, stop):
                    item = items[index]
                    if type(item) is tuple:
                        partition = self._partition_index(item[0], {"partition_key": item[1],
                                                                    "properties": item[2]})
                    else:
                        partition = self._partition_index(item, _NO_OPTIONS)
                    sub_items, sub_indexes = routed.setdefault(partition, ([], []))
                    sub_items.append(item)
                    sub_indexes.append(index)
                for partition, (sub_items, sub_indexes) in routed.items():
                    (await self._attached(partition)).send_many(sub_items, 0, len(sub_items), sub_indexes, bulk)
                targets = [partitions[p] for p in routed]
            start = stop
            for target in targets:
                conn = target.conn
                if conn is not None and not conn.can_write.is_set():
                    await conn.drain()
        await asyncio.sleep(0)  # let the loop write what went out and read receipts (bounds latency)
        return future

    def _partition_index(self, content: bytes, options: dict[str, Any]) -> int:
        """The partition a message goes to: the custom router's choice, else its key's hash (or
        round robin); every send path routes through here."""
        count = len(self._partitions)
        if count == 1:
            return 0
        router = self._message_router
        if router is None:
            return self._router.partition(options.get("partition_key"), count)
        index = router(OutgoingMessage(content, options), count)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
            raise ValueError(f"message_router returned {index!r}; expected a partition in 0..{count - 1}")
        return index

    async def _attached(self, partition: int) -> PartitionProducer:
        """The producer of `partition`, attached first if it is lazy and has not sent yet."""
        target = self._partitions[partition]
        if not target.ready:
            await target.start()
        return target

    async def send_columns(self, contents: list[Any], *, partition_keys: list[str | None] | None = None,
                           properties: list[dict[str, str] | None] | None = None,
                           event_timestamps: list[int | None] | None = None) -> asyncio.Future[MessageIds]:
        """send_many of column lists: the optional lists align with `contents`, None where a
        message has none. Returns send_many's one future for every receipt (a MessageIds)."""
        if partition_keys is None and properties is None and event_timestamps is None:
            return await self.send_many(contents)
        count = len(contents)
        for name, column in (("partition_keys", partition_keys), ("properties", properties),
                             ("event_timestamps", event_timestamps)):
            if column is not None and len(column) != count:
                raise ValueError(f"{name} has {len(column)} values for {count} contents")

        def aligned(values: list[Any] | None) -> Iterable[Any]:
            return itertools.repeat(None, count) if values is None else values
        return await self.send_many(list(zip(contents, aligned(partition_keys), aligned(properties),
                                             aligned(event_timestamps))))

    async def send(self, content: bytes, **options: Any) -> MessageId:
        """Send one message and wait for the broker's receipt."""
        future = await self.send_async(content, **options)
        self.flush_batches(write_now=True)
        return await future

    def next_batch_due(self) -> float | None:
        """When (loop.time()) the earliest open batch goes out on its timer; None when none waits
        for one."""
        due = None
        for p in self._partitions:
            if p._batch_timer is not None and (due is None or p.batch_due_at < due):
                due = p.batch_due_at
        return due

    def batch_room(self) -> tuple[int, int]:
        """Messages and bytes that close the fullest open batch (a batch's worth when none is
        open): sends held for a batch are handed over once they would fill it."""
        messages, size = self._batching_max_messages, self._batching_max_bytes
        for p in self._partitions:
            batch = p._batch
            if batch.num_messages:
                messages = min(messages, self._batching_max_messages - batch.num_messages)
                size = min(size, self._batching_max_bytes - batch.size)
        return max(messages, 1), max(size, 1)

    def write_now(self) -> None:
        """Write the frames queued for the connections (batches closed, messages sent alone)
        without waiting for the loop's next turn."""
        for p in self._partitions:
            if p.conn is not None:
                p.conn.flush_now()

    def flush_batches(self, write_now: bool = False) -> None:
        """Close every open batch; `write_now`: and write them without waiting for the loop's next
        turn (for a caller who waits on the answer: nothing more is coming to join them)."""
        for p in self._partitions:
            p.flush_batch()
        if write_now:
            self.write_now()

    async def flush(self) -> None:
        """Send what is batched and wait until every pending message is acknowledged."""
        if self._closed:
            raise AlreadyClosedError("producer is closed")
        self.flush_batches()
        await asyncio.gather(*(p.wait_pending() for p in self._partitions))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(p.close() for p in self._partitions), return_exceptions=True)
        self.context.handles.discard(self)


def _check_send_options(properties: object, partition_key: object, ordering_key: object,
                        **integers: object) -> None:
    """A clear TypeError for a wrongly typed send option, the same with either codec twin (the
    encoders would fail each its own way, or take an int ordering key as that many zero bytes)."""
    if properties is not None:
        if not isinstance(properties, dict):
            raise TypeError(f"properties must be a dict of str to str, not {type(properties).__name__}")
        for key, value in properties.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"properties must map str to str, not {type(key).__name__} to "
                                f"{type(value).__name__}")
    if partition_key is not None and not isinstance(partition_key, str):
        raise TypeError(f"partition_key must be a str, not {type(partition_key).__name__}")
    if ordering_key is not None and not isinstance(ordering_key, (bytes, bytearray, memoryview)):
        raise TypeError(f"ordering_key must be bytes, not {type(ordering_key).__name__}")
    for name, value in integers.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
