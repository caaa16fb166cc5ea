"""The reconnect loop producers and consumers share."""
from __future__ import annotations

import asyncio
import logging

from ..errors import PulsarWireError
from .connection import ClientContext, Connection
from .options import FATAL_ERRORS

log = logging.getLogger("pulsarwire")


class Reconnecting:
    """What producers and consumers share: when their connection goes (or the broker closes
    them), look the topic up again and re-attach, backing off exponentially; give up only on
    errors that retrying cannot fix."""

    context: ClientContext
    topic: str
    conn: Connection | None
    _closed: bool
    _reconnecting: asyncio.Task | None

    async def _connect(self) -> None:
        raise NotImplementedError

    def _give_up(self, error: BaseException) -> None:
        raise NotImplementedError

    def connection_lost(self, conn: Connection) -> None:
        if self.conn is not conn and self.conn is not None:
            return
        self.conn = None
        if self._closed or self._reconnecting is not None:
            return
        self._reconnecting = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        attempt = 0
        try:
            while not self._closed:
                await asyncio.sleep(self.context.backoff.delay(attempt))
                attempt += 1
                try:
                    await self._connect()
                    log.info("%s on %s reconnected", type(self).__name__, self.topic)
                    return
                except FATAL_ERRORS as exc:
                    self._give_up(exc)
                    return
                except (PulsarWireError, OSError) as exc:
                    log.info("%s on %s: reconnect attempt %d failed: %s", type(self).__name__, self.topic,
                             attempt, exc)
        finally:
            self._reconnecting = None
