"""Producers: the per-partition producer (sequence ids, batching, chunking,
receipts, resend after reconnect, send timeouts) and the user-facing `Producer`
that routes messages over partitions and bounds what is pending."""
from __future__ import annotations

import asyncio
import collections
import enum
import logging
import time
from typing import TYPE_CHECKING, Any

from .. import codec, compression
from .._proto import PulsarApi_pb2 as pb
from ..errors import (
    AlreadyClosedError, ConnectionClosedError, MessageTooBigError, ProducerQueueFullError, PulsarWireError,
    TimeoutError,
)
from ..messages import MessageId, signed64
from ..routing import HashingScheme, Router, RoutingMode
from ..session import SendFailed, SendReceipt
from .options import FATAL_ERRORS, CompressionType, now_ms
from .reconnect import Reconnecting

if TYPE_CHECKING:
    from .client import Client
    from .connection import Connection

log = logging.getLogger("pulsarwire")


class _OpSend:
    """One Send frame in flight: a single message, a batch, or one chunk."""

    __slots__ = ("sequence_id", "highest_sequence_id", "num_messages", "frame", "futures", "created",
                 "first_chunk", "batched")

    def __init__(self, sequence_id, highest_sequence_id, num_messages, frame, futures, first_chunk=None,
                 batched=False):
        self.sequence_id = sequence_id
        self.highest_sequence_id = highest_sequence_id
        self.num_messages = num_messages
        self.frame = frame
        self.futures = futures  # one per message; empty for all but a message's last chunk
        self.created = time.monotonic()
        self.first_chunk = first_chunk
        self.batched = batched  # a batch entry, even of one message: ids carry batch indexes


class PartitionProducer(Reconnecting):
    """Producer on one (partition) topic."""

    def __init__(self, parent: "Producer", topic: str, partition: int) -> None:
        self.parent = parent
        self.client = parent.client
        self.topic = topic
        self.partition = partition
        self.producer_id = next(self.client._ids)
        self.producer_name = parent._producer_name
        self.conn: Connection | None = None
        self.pending: collections.deque[_OpSend] = collections.deque()
        initial = parent._initial_sequence_id
        # As the official client: the first message takes initial + 1 (initial is the last one
        # already published), and without an initial id the broker's last one decides.
        self.last_sequence_id = -1 if initial is None else initial
        self._next_sequence_id: int | None = None if initial is None else initial + 1
        self._epoch = 0
        self._batch = codec.BatchBuilder()
        self._batch_futures: list[asyncio.Future] = []
        self._batch_first_sequence = 0
        self._batch_timer: asyncio.TimerHandle | None = None
        self._reconnecting: asyncio.Task | None = None
        self._closed = False
        self._failed: BaseException | None = None
        self._timeout_task: asyncio.Task | None = None
        self._chunk_ids: dict[str, MessageId] = {}

    async def start(self) -> None:
        await self._connect()
        if self.parent._send_timeout:
            self._timeout_task = asyncio.ensure_future(self._check_send_timeouts())

    async def _connect(self) -> None:
        conn = await self.client._lookup(self.topic)
        fields: dict[str, Any] = dict(topic=self.topic, producer_id=self.producer_id, epoch=self._epoch,
                                      producer_access_mode=self.parent._access_mode)
        if self.producer_name:
            fields["producer_name"] = self.producer_name
            fields["user_provided_producer_name"] = self.parent._user_named
        if self.parent._metadata:
            fields["metadata"] = [pb.KeyValue(key=k, value=v) for k, v in self.parent._metadata.items()]
        conn.producers[self.producer_id] = self
        try:
            response = await conn.request(conn.session.create_producer, **fields)
        except BaseException:
            conn.producers.pop(self.producer_id, None)
            raise
        self._epoch += 1
        self.producer_name = response.producer_name
        if self._next_sequence_id is None:
            self.last_sequence_id = max(self.last_sequence_id, response.last_sequence_id)
            self._next_sequence_id = response.last_sequence_id + 1
        self.conn = conn
        for op in self.pending:  # resend in order, same sequence ids: the broker dedups
            conn.write_frame(op.frame)

    def _give_up(self, error: BaseException) -> None:
        self._fail_all(error)

    # sending

    def _take_sequence_id(self, requested: int | None) -> int:
        assert self._next_sequence_id is not None, "sequence ids start once the producer is created"
        if requested is not None:
            self._next_sequence_id = max(self._next_sequence_id, requested + 1)
            return requested
        sequence_id = self._next_sequence_id
        self._next_sequence_id += 1
        return sequence_id

    def send(self, payload: bytes, options: dict, future: asyncio.Future) -> None:
        if self._failed is not None:
            future.set_exception(self._failed)
            return
        parent = self.parent
        sequence_id = self._take_sequence_id(options.get("sequence_id"))
        limit = self.conn.max_message_size if self.conn else codec.DEFAULT_MAX_MESSAGE_SIZE
        # As the official client, a message over batching_max_allowed_size_in_bytes still goes in
        # a batch (of one), so its id has batch index 0; only delayed or too-big ones go alone.
        batchable = parent._batching and options.get("deliver_at") is None and len(payload) <= limit - 1024
        if batchable:
            if self._batch.num_messages and self._batch.size + len(payload) > parent._batching_max_bytes:
                self.flush_batch()
            if self._batch.num_messages == 0:
                self._batch_first_sequence = sequence_id
            self._batch.add(payload, options.get("properties"), options.get("partition_key"),
                            options.get("event_timestamp") or 0, options.get("ordering_key"),
                            sequence_id)
            self._batch_futures.append(future)
            if self._batch.num_messages >= parent._batching_max_messages or \
                    self._batch.size >= parent._batching_max_bytes:
                self.flush_batch()
            elif self._batch_timer is None:
                self._batch_timer = self.client._loop.call_later(parent._batching_delay, self.flush_batch)
            return
        self.flush_batch()  # keep order: anything batched before goes first
        metadata = self._metadata(sequence_id, options)
        body = compression.compress(parent._compression, payload) if parent._compression else payload
        if parent._compression:
            metadata.compression = parent._compression
            metadata.uncompressed_size = len(payload)
        if len(body) > limit - 1024:
            if not parent._chunking:
                future.set_exception(MessageTooBigError(
                    f"message of {len(body)} bytes is over the broker's {limit}-byte limit; "
                    "enable chunking_enabled to send it"))
                self.parent._release(1)
                return
            self._send_chunks(metadata, body, limit - 1024, future)
            return
        frame = codec.encode_payload_command(self._send_command(sequence_id, sequence_id, 1), metadata, body)
        self._enqueue(_OpSend(sequence_id, sequence_id, 1, frame, [future]))

    def _send_chunks(self, metadata, body, chunk_size, future) -> None:
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

    def _metadata(self, sequence_id: int, options: dict) -> pb.MessageMetadata:
        md = pb.MessageMetadata(producer_name=self.producer_name, sequence_id=sequence_id,
                                publish_time=now_ms())
        if options.get("properties"):
            md.properties.extend(pb.KeyValue(key=k, value=v) for k, v in options["properties"].items())
        if options.get("partition_key") is not None:
            md.partition_key = options["partition_key"]
        if options.get("ordering_key") is not None:
            md.ordering_key = options["ordering_key"]
        if options.get("event_timestamp"):
            md.event_time = options["event_timestamp"]
        if options.get("deliver_at") is not None:
            md.deliver_at_time = options["deliver_at"]
        return md

    def _send_command(self, sequence_id: int, highest: int, count: int) -> pb.BaseCommand:
        cmd = pb.BaseCommand(type=pb.BaseCommand.SEND)
        cmd.send.producer_id = self.producer_id
        cmd.send.sequence_id = sequence_id
        cmd.send.num_messages = count
        if highest != sequence_id:
            cmd.send.highest_sequence_id = highest
        return cmd

    def flush_batch(self) -> None:
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        count = self._batch.num_messages
        if count == 0:
            return
        raw = self._batch.build()
        futures = self._batch_futures
        self._batch.clear()
        self._batch_futures = []
        first = self._batch_first_sequence
        highest = first + count - 1
        md = pb.MessageMetadata(producer_name=self.producer_name, sequence_id=first,
                                publish_time=now_ms(), num_messages_in_batch=count)
        if highest != first:
            md.highest_sequence_id = highest
        kind = self.parent._compression
        if kind:
            md.compression = kind
            md.uncompressed_size = len(raw)
            raw = compression.compress(kind, raw)
        frame = codec.encode_payload_command(self._send_command(first, highest, count), md, raw)
        self._enqueue(_OpSend(first, highest, count, frame, futures, batched=True))

    def _enqueue(self, op: _OpSend) -> None:
        self.pending.append(op)
        if self.conn is not None:
            self.conn.write_frame(op.frame)

    def _on_receipt(self, receipt: SendReceipt) -> None:
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
            if op.num_messages == 0 and op.first_chunk is not None and not op.futures:
                if op.first_chunk not in self._chunk_ids:
                    mid = receipt.message_id
                    self._chunk_ids[op.first_chunk] = MessageId(signed64(mid.ledgerId), signed64(mid.entryId),
                                                                self.partition, topic=self.topic)
                return  # earlier chunk: wait for the receipt of the last one
            self._chunk_ids.pop(op.first_chunk, None)
            self.last_sequence_id = max(self.last_sequence_id, op.highest_sequence_id)
            mid = receipt.message_id
            ledger, entry = signed64(mid.ledgerId), signed64(mid.entryId)  # a duplicate is (-1, -1)
            for index, future in enumerate(op.futures):
                if not future.done():
                    if op.batched:
                        future.set_result(MessageId(ledger, entry, self.partition, index,
                                                    len(op.futures), self.topic))
                    else:
                        future.set_result(MessageId(ledger, entry, self.partition, topic=self.topic))
            self.parent._release(len(op.futures))
            return

    def _on_send_error(self, event: SendFailed) -> None:
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
            for future in op.futures:
                if not future.done():
                    future.set_exception(error)
            released += len(op.futures)
        for future in self._batch_futures:
            if not future.done():
                future.set_exception(error)
        released += len(self._batch_futures)
        self._batch_futures = []
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
                        for future in op.futures:
                            if not future.done():
                                future.set_exception(error)
                        released += len(op.futures)
                    self.parent._release(released)
        except asyncio.CancelledError:
            pass

    async def wait_pending(self) -> None:
        futures = [f for op in self.pending for f in op.futures] + list(self._batch_futures)
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


class Producer:
    """Sends messages to a topic (all partitions of it when partitioned)."""

    def __init__(self, client: Client, topic: str, *, producer_name: str | None = None,
                 initial_sequence_id: int | None = None, send_timeout_millis: int = 30_000,
                 compression_type: int | str = CompressionType.NONE,
                 max_pending_messages: int = 1000, block_if_queue_full: bool = True,
                 batching_enabled: bool = True, batching_max_messages: int = 1000,
                 batching_max_allowed_size_in_bytes: int = 128 * 1024,
                 batching_max_publish_delay_ms: float = 10, chunking_enabled: bool = False,
                 message_routing_mode: RoutingMode = RoutingMode.RoundRobinPartition,
                 hashing_scheme: HashingScheme = HashingScheme.JavaStringHash,
                 properties: dict[str, str] | None = None, access_mode: int = pb.Shared) -> None:
        if chunking_enabled and batching_enabled:
            raise ValueError("chunking cannot be combined with batching")
        self.client = client
        self._topic = topic
        self._producer_name = producer_name
        self._user_named = producer_name is not None
        # As the official client: 0 (its Python layer tests truthiness) and -1 (its "unset") leave
        # the broker's last sequence id in charge.
        self._initial_sequence_id = None if initial_sequence_id in (None, 0, -1) else initial_sequence_id
        self._send_timeout = send_timeout_millis / 1000
        self._compression: Any = compression.compression_type(
            compression_type.name if isinstance(compression_type, enum.Enum) else compression_type)
        self._max_pending = max_pending_messages
        self._block = block_if_queue_full
        self._batching = batching_enabled
        self._batching_max_messages = batching_max_messages
        self._batching_max_bytes = batching_max_allowed_size_in_bytes
        self._batching_delay = batching_max_publish_delay_ms / 1000
        self._chunking = chunking_enabled
        self._metadata = properties or {}
        self._access_mode = access_mode
        self._router = Router(hashing_scheme, message_routing_mode)
        self._partitions: list[PartitionProducer] = []
        self._in_flight = 0
        self._space = asyncio.Condition()
        self._closed = False

    async def _start(self) -> None:
        topics = await self.client.get_topic_partitions(self._topic)
        partitioned = len(topics) > 1 or topics[0] != self._topic
        self._partitions = [PartitionProducer(self, t, i if partitioned else -1) for i, t in enumerate(topics)]
        try:
            await asyncio.gather(*(p.start() for p in self._partitions))
        except BaseException:
            for p in self._partitions:
                p._closed = True
                if p._timeout_task:
                    p._timeout_task.cancel()
            raise

    def topic(self) -> str:
        return self._topic

    def producer_name(self) -> str:
        return self._partitions[0].producer_name or ""

    def last_sequence_id(self) -> int:
        return max(p.last_sequence_id for p in self._partitions)

    def _release(self, count: int) -> None:
        if count:
            self._in_flight -= count
            if self._block:
                asyncio.ensure_future(self._notify_space())

    async def _notify_space(self) -> None:
        async with self._space:
            self._space.notify_all()

    async def send_async(self, content: bytes, *, properties: dict[str, str] | None = None,
                         partition_key: str | None = None, ordering_key: bytes | None = None,
                         event_timestamp: int | None = None, sequence_id: int | None = None,
                         deliver_at: int | None = None, deliver_after_ms: int | None = None) -> asyncio.Future:
        """Queue a message; returns a future for its MessageId (waits only for queue space)."""
        if self._closed:
            raise AlreadyClosedError("producer is closed")
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise TypeError(f"content must be bytes, not {type(content).__name__}")
        if self._in_flight >= self._max_pending:
            if not self._block:
                raise ProducerQueueFullError(f"{self._max_pending} messages pending")
            async with self._space:
                await self._space.wait_for(lambda: self._in_flight < self._max_pending)
        if deliver_after_ms is not None:
            deliver_at = now_ms() + deliver_after_ms
        options = {"properties": properties, "partition_key": partition_key, "ordering_key": ordering_key,
                   "event_timestamp": event_timestamp, "sequence_id": sequence_id, "deliver_at": deliver_at}
        partitions = self._partitions
        target = partitions[0] if len(partitions) == 1 else \
            partitions[self._router.partition(partition_key, len(partitions))]
        future = self.client._loop.create_future()
        self._in_flight += 1
        target.send(bytes(content) if not isinstance(content, bytes) else content, options, future)
        conn = target.conn
        if conn is not None and not conn._can_write.is_set():
            await conn.drain()
        return future

    async def send(self, content: bytes, **options) -> MessageId:
        """Send one message and wait for the broker's receipt."""
        future = await self.send_async(content, **options)
        self.flush_batches()
        return await future

    def flush_batches(self) -> None:
        for p in self._partitions:
            p.flush_batch()

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
        self.client._handles.discard(self)
