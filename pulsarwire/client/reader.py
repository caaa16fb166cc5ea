"""The Reader: a topic read from a message id on a non-durable subscription."""
from __future__ import annotations

from ..messages import Message, MessageId
from .consumer import Consumer


class Reader:
    """Reads a topic from a message id on a non-durable subscription."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def topic(self) -> str:
        return self._consumer.topic()

    def is_connected(self) -> bool:
        return not self._consumer.closed and self._consumer.is_connected()

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        return self._read(await self._consumer.receive(timeout_millis))

    def _read(self, message: Message) -> Message:
        # As the official readers do: a cumulative acknowledgement (grouped), so the broker's
        # non-durable subscription stops tracking what was read; a reader that reconnects
        # starts from its own position, not from this one.
        self._consumer.acknowledge_cumulative(message)
        return message

    async def has_message_available(self) -> bool:
        return await self._consumer.has_message_available()

    async def seek(self, target: MessageId | int) -> None:
        await self._consumer.seek(target)

    async def get_last_message_id(self) -> MessageId:
        """The id of the last message in the topic (entry_id -1 when it is empty)."""
        return await self._consumer.get_last_message_id()

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> Message:
        return self._read(await self._consumer.__anext__())

    async def close(self) -> None:
        await self._consumer.close()
