"""EntryReader: whole entries of one topic-partition, as the broker sent them.

No Message object per message: a bulk consumer (the Spark source) takes entries
and splits them itself (`codec.split_columns`), so its cost per message is the
codec's. The subscription is non-durable; position checks are the caller's.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
from typing import NamedTuple

from .. import codec
from .._proto import PulsarApi_pb2 as pb
from ..errors import CodecError, ConnectionClosedError, PulsarWireError
from ..messages import MessageId, signed64
from .connection import ClientContext, Connection
from .options import ConsumerType, InitialPosition
from .reconnect import Reconnecting

log = logging.getLogger("pulsarwire")


class Entry(NamedTuple):
    """One entry: its position, metadata, and payload as carried (still compressed)."""

    ledger_id: int
    entry_id: int
    metadata: pb.MessageMetadata
    payload: memoryview
    size: int  # the frame's size: what the entry costs in memory

    @property
    def num_messages(self) -> int:
        md = self.metadata
        return md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 1


class EntryReader(Reconnecting):
    """Entries of one (partition) topic from `start` (inclusive), on a non-durable subscription.

    Flow control counts messages as the broker does; permits return as entries
    are taken, and at most `max_queued_bytes` of entries wait in memory (beyond
    one entry, which may be larger). After a reconnect, reading resumes just
    after the last entry received.
    """

    def __init__(self, context: ClientContext, topic: str, start: MessageId, *, receiver_queue_size: int = 1000,
                 max_queued_bytes: int = 64 << 20) -> None:
        self.context = context
        self.topic = topic
        self.consumer_id = next(context.ids)
        self.conn: Connection | None = None
        self._subscription = f"entries-{os.urandom(5).hex()}"
        self._start = start
        self._last: tuple[int, int] | None = None  # the last entry received
        self._queue: collections.deque[Entry] = collections.deque()
        self._queued_bytes = 0
        self._window = max(2, receiver_queue_size)
        self._max_queued_bytes = max_queued_bytes
        self._permits_owed = 0  # messages taken but not yet returned to the broker
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self.disconnect: BaseException | None = None  # why the connection is down, while it is
        self.end_of_topic = False
        self.is_active = True
        self._closed = False
        self._reconnecting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._connect()

    async def _connect(self) -> None:
        conn = await self.context.pool.lookup(self.topic)
        start = self._start if self._last is None else MessageId(*self._last)
        await conn.subscribe(self, self.topic, self._subscription, ConsumerType.Exclusive, durable=False,
                             initial_position=InitialPosition.Earliest, start=(start.ledger_id, start.entry_id))
        self.conn = conn
        self.disconnect = None
        self._permits_owed = 0
        room = self._window - sum(e.num_messages for e in self._queue)
        conn.session.flow(self.consumer_id, max(1, room))
        conn.flush()

    def connection_lost(self, conn: Connection) -> None:
        self.disconnect = ConnectionClosedError(f"connection to the broker of {self.topic} lost")
        super().connection_lost(conn)
        self._wake()

    def _give_up(self, error: BaseException) -> None:
        self._error = error
        self._wake()

    # incoming (ConsumerHandler: called by the connection)

    def on_message(self, command: pb.CommandMessage, frame: codec.Frame) -> None:
        mid = command.message_id
        position = (signed64(mid.ledgerId), signed64(mid.entryId))
        if self._last is not None and position <= self._last:
            return  # already received before a reconnect
        self._last = position
        metadata, payload = frame.metadata, frame.payload
        assert metadata is not None and payload is not None  # the session delivers only Message frames with a payload
        entry = Entry(position[0], position[1], metadata, payload, frame.size)
        self._queue.append(entry)
        self._queued_bytes += entry.size
        self._wake()

    def on_corrupt(self, message_id: pb.MessageIdData, error: CodecError) -> None:
        self._error = error  # a reader must not skip what it cannot read
        self._wake()

    def on_end_of_topic(self) -> None:
        self.end_of_topic = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # taking entries

    def take(self, max_entries: int) -> list[Entry]:
        """Up to `max_entries` entries already received (none waited for)."""
        out: list[Entry] = []
        queue = self._queue
        while queue and len(out) < max_entries:
            out.append(queue.popleft())
        if out:
            self._queued_bytes -= sum(e.size for e in out)
            self._return_permits(sum(e.num_messages for e in out))
        return out

    def _return_permits(self, count: int) -> None:
        self._permits_owed += count
        if self._queued_bytes >= self._max_queued_bytes:
            return
        if self._permits_owed * 2 >= self._window and self.conn is not None:
            self.conn.session.flow(self.consumer_id, self._permits_owed)
            self.conn.flush()
            self._permits_owed = 0

    async def wait(self, timeout: float) -> bool:
        """Wait until an entry is queued (True) or `timeout` seconds pass (False).

        Raises the error that stopped the reader; a dropped connection is
        waited out (the reader reconnects) and reported by `disconnect`."""
        if self._error is not None:
            raise self._error
        if self._queue:
            return True
        if self._closed:
            raise ConnectionClosedError("entry reader is closed")
        self._waiter = self.context.loop.create_future()
        try:
            await asyncio.wait_for(self._waiter, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error
        return bool(self._queue)

    async def get_last_message_id(self) -> MessageId:
        conn = self.conn
        if conn is None:
            raise ConnectionClosedError("entry reader is not connected")
        return await conn.last_message_id(self.consumer_id, self.topic)

    async def close(self) -> None:
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        conn, self.conn = self.conn, None
        self.context.handles.discard(self)
        if conn is not None and not conn.closed:
            try:
                await conn.request(conn.session.close_consumer, self.consumer_id)
            except PulsarWireError as exc:
                log.debug("closing entry reader on %s: %s", self.topic, exc)
            finally:
                conn.consumers.pop(self.consumer_id, None)
