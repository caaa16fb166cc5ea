"""A table view: the latest value of every key of a topic, read from the beginning (compacted
where the topic is compacted) and kept up to date; an empty message removes its key."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterator

from ..errors import ConnectionClosedError, TopicTerminatedError
from ..messages import Message
from .consumer import Consumer

log = logging.getLogger("pulsarwire")


async def open_table_view(consumer: Consumer) -> "TableView":
    """A table view over `consumer` (a compacted, non-durable reader from the earliest message),
    filled with what the topic holds now; the consumer is closed if that fails."""
    view = TableView(consumer)
    try:
        await view._start()
    except BaseException:
        await view.close()
        raise
    return view


class TableView:
    """Dict-like and read-only: `get`, `items`, `keys`, `values`, `len`, `in`; `for_each`,
    `listen` and `for_each_and_listen` take `callback(key, value)` (value None: removed)."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._data: dict[str, Any] = {}
        self._listeners: list[Callable[[str, Any], None]] = []
        self._task: asyncio.Task | None = None

    async def _start(self) -> None:
        """Read everything already in the topic, then follow it in the background."""
        while await self._has_more():
            self._apply(await self._consumer.receive())
        self._task = asyncio.ensure_future(self._follow())

    async def _has_more(self) -> bool:
        return await self._consumer.has_message_available()

    async def _follow(self) -> None:
        try:
            while True:
                self._apply(await self._consumer.receive())
        except (asyncio.CancelledError, ConnectionClosedError, TopicTerminatedError):
            pass
        except Exception as exc:  # noqa: BLE001 - the view stops following; say why
            log.warning("table view on %s stopped: %s", self._consumer.topic(), exc)

    def _apply(self, message: Message) -> None:
        key = message.partition_key()
        if key is None:
            return  # a table has keys only
        if len(message.payload_view()) == 0:
            value = None
            self._data.pop(key, None)
        else:
            value = message.value()
            self._data[key] = value
        for listener in list(self._listeners):
            try:
                listener(key, value)
            except Exception as exc:  # noqa: BLE001 - one listener must not stop the view
                log.warning("table view listener failed: %s", exc)

    # dict-like reading

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._data))

    def keys(self) -> list[str]:
        return list(self._data)

    def values(self) -> list[Any]:
        return list(self._data.values())

    def items(self) -> list[tuple[str, Any]]:
        return list(self._data.items())

    def size(self) -> int:
        return len(self._data)

    # callbacks

    def for_each(self, callback: Callable[[str, Any], None]) -> None:
        for key, value in list(self._data.items()):
            callback(key, value)

    def listen(self, callback: Callable[[str, Any], None]) -> None:
        self._listeners.append(callback)

    def for_each_and_listen(self, callback: Callable[[str, Any], None]) -> None:
        self.for_each(callback)
        self.listen(callback)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self._consumer.close()
