"""A TCP listener that can always accept and refuse.

asyncio's own server, when `accept` fails for want of descriptors (EMFILE), logs a traceback for
every connection waiting in the backlog and retries each a second later, so a flood fills the log
and waiting clients get nothing. This listener keeps one descriptor in reserve: with none left it
gives the reserve back, accepts one waiting connection, refuses it (a short error for the plaintext
Pulsar port, a close otherwise), takes the reserve again and stops accepting for a moment; it says
so in one warning a second at most. Accepted connections go to a protocol as with `create_server`.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import ssl
import time
from typing import Callable

log = logging.getLogger("pulsarwire.broker")

ACCEPTS_PER_TICK = 32  # connections accepted before the loop serves anything else
PAUSE_WITHOUT_DESCRIPTORS = 0.1  # seconds without accepting after the descriptors ran out
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class DescriptorReserve:
    """One descriptor held back (on /dev/null) for the moment every other one is taken."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self.restore()

    def release(self) -> bool:
        """Give the reserve back to the process; False when it was not held."""
        if self._fd is None:
            return False
        os.close(self._fd)
        self._fd = None
        return True

    def restore(self) -> None:
        if self._fd is None:
            try:
                self._fd = os.open(os.devnull, os.O_RDONLY)
            except OSError:
                self._fd = None  # tried again on the next refusal

    def close(self) -> None:
        self.release()


class Listener:
    """Accepts on `host:port` and hands each connection to a new `protocol_factory()` protocol.
    `refusal` is what a connection refused for want of descriptors is sent before it is closed.
    The interface of asyncio's Server that the broker uses: sockets, close, wait_closed,
    serve_forever."""

    def __init__(self, protocol_factory: Callable[[], asyncio.Protocol], host: str, port: int, *,
                 reserve: DescriptorReserve, refusal: bytes = b"", counters: dict[str, int] | None = None,
                 backlog: int = 1024) -> None:
        self._factory = protocol_factory
        self._reserve = reserve
        self._refusal = refusal
        self.counters = counters if counters is not None else {}
        # every address the host name stands for (as asyncio's server), all on one port
        self.sockets: list[socket.socket] = []
        try:
            for family, _, _, _, address in dict.fromkeys(
                    (info[0], info[1], info[2], info[3], info[4][:2])
                    for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)):
                if self.sockets:
                    address = (str(address[0]), self.sockets[0].getsockname()[1])
                sock = socket.create_server((str(address[0]), int(address[1])), family=family, backlog=backlog)
                sock.setblocking(False)
                self.sockets.append(sock)
        except BaseException:
            for sock in self.sockets:
                sock.close()
            raise
        self._loop = asyncio.get_running_loop()
        self._closed = self._loop.create_future()
        self._accepting = False
        self._last_warning = -1.0
        self._unlogged = 0
        self._pending: set[asyncio.Task] = set()
        self._resume_accepting()

    def _resume_accepting(self) -> None:
        if not self._accepting and not self._closed.done():
            self._accepting = True
            for sock in self.sockets:
                self._loop.add_reader(sock.fileno(), self._accept_ready, sock)

    def _pause_accepting(self, seconds: float) -> None:
        if self._accepting:
            self._accepting = False
            for sock in self.sockets:
                self._loop.remove_reader(sock.fileno())
        self._loop.call_later(seconds, self._resume_accepting)

    def _accept_ready(self, listening: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_TICK):
            try:
                conn, _ = listening.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_DESCRIPTORS:
                    log.warning("accept failed: %s", exc)
                    return
                self._refuse_without_descriptors(listening)
                return
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                # asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and those accepted
                # from socket.create_server say 0: answers written one after another then waited
                # for the client's delayed ACK (40 ms for the 3rd to 8th of 8 producer closes)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._serve(conn))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except asyncio.CancelledError:
            conn.close()
            raise
        except Exception as exc:  # noqa: BLE001 - one connection's failure, not the listener's
            log.info("dropping an accepted connection: %s", exc)
            conn.close()

    def _refuse_without_descriptors(self, listening: socket.socket) -> None:
        """No descriptor left: refuse one waiting connection with the reserve, then pause."""
        self.counters["refused_no_descriptors"] = self.counters.get("refused_no_descriptors", 0) + 1
        if self._reserve.release():
            try:
                conn, _ = listening.accept()
            except OSError:
                conn = None
            if conn is not None:
                try:
                    if self._refusal:
                        conn.send(self._refusal)
                except OSError:
                    pass
                conn.close()
            self._reserve.restore()
        now = time.monotonic()
        if now - self._last_warning >= 1.0:
            more = f" ({self._unlogged} more since the last warning)" if self._unlogged else ""
            log.warning("no descriptors left: refusing connections on port %d%s",
                        listening.getsockname()[1], more)
            self._last_warning, self._unlogged = now, 0
        else:
            self._unlogged += 1
        self._pause_accepting(PAUSE_WITHOUT_DESCRIPTORS)

    def close(self) -> None:
        if self._closed.done():
            return
        if self._accepting:
            for sock in self.sockets:
                self._loop.remove_reader(sock.fileno())
            self._accepting = False
        for sock in self.sockets:
            sock.close()
        for task in self._pending:
            task.cancel()
        self._closed.set_result(None)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    async def serve_forever(self) -> None:
        await asyncio.shield(self._closed)


TLS_READ_BUFFER_BYTES = 64 * 1024  # each TLS session's read buffer (asyncio's own: 256 KiB)

try:
    from asyncio import sslproto as _sslproto

    class _SmallBufferSSLProtocol(_sslproto.SSLProtocol):
        max_size = TLS_READ_BUFFER_BYTES  # allocated whole from the accept, handshake or not
except (ImportError, AttributeError):  # another Python's asyncio: its own start_tls, its own buffer
    _SmallBufferSSLProtocol = None  # type: ignore[assignment, misc]


async def start_tls_server(transport: asyncio.Transport, protocol: asyncio.BaseProtocol,
                           context: ssl.SSLContext, handshake_timeout: float) -> asyncio.Transport | None:
    """The server side of a TLS handshake on an accepted plain transport, as `loop.start_tls`
    does, with a read buffer of TLS_READ_BUFFER_BYTES: a connection that never finishes its
    handshake holds a quarter of what asyncio's own would (it is counted in the output budget)."""
    loop = asyncio.get_running_loop()
    if _SmallBufferSSLProtocol is None:
        return await loop.start_tls(transport, protocol, context, server_side=True,
                                    ssl_handshake_timeout=handshake_timeout)
    waiter = loop.create_future()
    tls = _SmallBufferSSLProtocol(loop, protocol, context, waiter, server_side=True, call_connection_made=False,
                                  ssl_handshake_timeout=handshake_timeout)  # type: ignore[arg-type]
    transport.pause_reading()
    transport.set_protocol(tls)
    made = loop.call_soon(tls.connection_made, transport)
    resumed = loop.call_soon(transport.resume_reading)
    try:
        await waiter
    except BaseException:
        transport.close()
        made.cancel()
        resumed.cancel()
        raise
    return tls._app_transport
