"""Clients on private event loops: connected, and retried while the broker cannot be reached."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, TypeVar

from .options import ClientSettings

if TYPE_CHECKING:
    from ..client.client import Client
    from ..client.options import Backoff

_T = TypeVar("_T")

log = logging.getLogger("pulsarwire.spark")


def _run(coroutine: Coroutine[Any, Any, _T]) -> _T:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


_RETRYABLE: tuple[type[BaseException], ...] = ()


def _retryable() -> tuple[type[BaseException], ...]:
    global _RETRYABLE
    if not _RETRYABLE:
        from ..errors import ConnectionClosedError, TimeoutError as PulsarTimeout
        _RETRYABLE = (ConnectionClosedError, PulsarTimeout, OSError)
    return _RETRYABLE


def _broker_backoff() -> Backoff:
    """The client's backoff formula, from 0.1s up to 2s between tries to reach the broker."""
    from ..client.options import Backoff  # imported late, as the client is
    return Backoff(0.1, 2.0)


async def _connected(settings: ClientSettings) -> Client:
    """A client whose connection to the broker is up, retried until connect.timeout.seconds
    have passed (then a clear error), however the broker fails: refused, reset, or a port that
    accepts and never answers. The caller closes it."""
    deadline = time.monotonic() + settings.connect_timeout
    backoff = _broker_backoff()
    attempt = 0
    while True:
        delay = backoff.delay(attempt)
        client = settings.client()
        try:
            await asyncio.wait_for(client.connect(), max(0.05, deadline - time.monotonic()))
            return client
        except _retryable() as exc:  # asyncio's timeout is an OSError too
            await client.close()
            if time.monotonic() + delay > deadline:
                why = exc if str(exc) else "no answer to the connection handshake"
                raise ConnectionError(f"cannot reach the Pulsar broker at {settings.url} within "
                                      f"{settings.connect_timeout:g}s (connect.timeout.seconds): {why}") from exc
            log.info("broker at %s not reachable (%s); retrying", settings.url, exc)
        except BaseException:
            await client.close()
            raise
        await asyncio.sleep(delay)
        attempt += 1


async def _with_client(settings: ClientSettings, work: Callable[[Client], Awaitable[_T]]) -> _T:
    """Run `work(client)` with a fresh connected client, retrying a broker that cannot be
    reached or drops the connection until connect.timeout.seconds have passed; then a clear error."""
    deadline = time.monotonic() + settings.connect_timeout
    backoff = _broker_backoff()
    attempt = 0
    while True:
        delay = backoff.delay(attempt)
        client = await _connected(settings)
        try:
            return await work(client)
        except _retryable() as exc:
            if time.monotonic() + delay > deadline:
                raise ConnectionError(f"cannot reach the Pulsar broker at {settings.url} within "
                                      f"{settings.connect_timeout:g}s (connect.timeout.seconds): {exc}") from exc
            log.info("broker at %s not reachable (%s); retrying", settings.url, exc)
        finally:
            await client.close()
        await asyncio.sleep(delay)
        attempt += 1


