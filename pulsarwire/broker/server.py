"""The embedded broker as a server: it opens the core, starts the listeners of each
front end (Pulsar binary, Pulsar over TLS, V1 text) and runs the maintenance loop.

    async with Broker(data_dir) as broker:      # free ports on 127.0.0.1
        broker.service_url                      # pulsar://127.0.0.1:PORT

`port=None` turns the plaintext Pulsar listener off (then `tls_port` is required).
"""
from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any, Callable

from .core import BrokerCore
from .listener import DescriptorReserve, Listener
from .pulsar import PulsarService
from .settings import BrokerSettings
from .storage import SYNC_INTERVAL, descriptor_limit
from .topic import Topic
from .v1 import V1Server, check_replication

log = logging.getLogger("pulsarwire.broker")
# descriptors kept out of every budget: listeners, state-file writes, the interpreter's own
_SPARE_DESCRIPTORS = 32


def tls_context(cert_file: str, key_file: str, trust_certs_file: str | None = None) -> ssl.SSLContext:
    """A server TLS context; with `trust_certs_file`, client certificates are verified against it
    (a client may still connect without one, e.g. to use a token)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    if trust_certs_file:
        context.load_verify_locations(trust_certs_file)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


class Broker:
    """`Broker(data_dir, port=..., max_connections=...)`: each keyword a field of `BrokerSettings`
    (settings.py), which lists them with their defaults; or `settings=` a `BrokerSettings`, which
    keywords given beside it replace."""

    def __init__(self, data_dir: str, *, settings: BrokerSettings | None = None, **keywords: Any) -> None:
        settings = BrokerSettings.of(settings, keywords)
        check_replication(settings.replication_factor, settings.min_insync_replicas)  # before anything is opened
        if settings.max_total_output_bytes < settings.max_output_bytes:
            raise ValueError("memory_budget must hold the entry cache (max_cache_bytes) and one connection's "
                             "output (max_output_bytes)")
        self.settings = settings
        self.topic_idle_timeout = settings.topic_idle_timeout
        self.core = BrokerCore(data_dir, settings=settings)
        self.pulsar = PulsarService(self.core, settings)
        self._connections_fit_descriptors = settings.max_connections is None  # else the caller's choice stands
        for name, url in (settings.advertised_listeners or {}).items():
            if not name or not url.startswith(("pulsar://", "pulsar+ssl://")):
                raise ValueError(f"advertised listener {name!r}: takes a name and a pulsar:// or pulsar+ssl:// URL")
        if (settings.anonymous_role is not None or settings.grants is not None or settings.super_user_roles) \
                and not self.pulsar.auth_enabled:
            raise ValueError("anonymous_role, grants and super_user_roles need authentication "
                             "(auth_tokens, auth_basic or auth_tls)")
        if settings.anonymous_role is not None and not settings.anonymous_role:
            raise ValueError("anonymous_role must not be empty")
        for namespace in settings.grants or ():
            if namespace.count("/") != 1 or not all(namespace.split("/")):
                raise ValueError(f"grant on {namespace!r}: takes a namespace, tenant/namespace")
        self.data_dir = self.core.data_dir
        self.host = settings.host
        self.port = settings.port
        self.tls_port = settings.tls_port
        self.ssl_context = settings.ssl_context
        self.v1_port = settings.v1_port
        self.sync_policy = settings.sync_policy
        self.sync_interval = settings.sync_interval
        # V1's connection limit: the Pulsar port's, unless the descriptor limit lowers it
        self.v1_max_connections = settings.connection_limit
        self.v1: V1Server | None = None
        # admin REST API, HTTP lookup and /metrics (admin_http.py): off unless a port is given (0: a free one)
        self.http_port = settings.http_port
        self.max_http_connections = settings.max_http_connections
        self.admin: Any = None
        self.http_url = ""
        self._servers: list[Listener] = []
        self._reserve: DescriptorReserve | None = None  # one descriptor held back to refuse with
        self._background: asyncio.Task | None = None
        self.service_url = ""
        self.service_url_tls = ""
        self.advertised_url = settings.advertised_url  # what lookups answer, e.g. a proxy in front of us

    @property
    def topics(self) -> dict[str, Topic]:
        return self.core.topics

    # lifecycle

    async def start(self) -> "Broker":
        if self.port is None and self.tls_port is None:
            raise ValueError("with the plaintext port off (port=None) a tls_port is needed")
        if self.tls_port is not None and self.ssl_context is None:
            raise ValueError("tls_port needs an ssl_context")
        self.core.open()
        self._reserve = DescriptorReserve()
        try:
            await self._start_listeners()
        except BaseException:
            await self.stop()  # the data dir's lock too: a broker may start on it again
            raise
        return self

    async def _start_listeners(self) -> None:
        assert self._reserve is not None  # made by start()
        self._fit_descriptor_limit()
        if self.port is not None:
            server = Listener(self.pulsar.protocol(), self.host, self.port, reserve=self._reserve,
                              refusal=self.pulsar.refusal_frame(), counters=self.pulsar.counters)
            self._servers.append(server)
            self.port = server.sockets[0].getsockname()[1]
            self.service_url = f"pulsar://{self.host}:{self.port}"
        if self.tls_port is not None:
            # plain TCP: each connection does its handshake once accepted and counted (pulsar.py)
            tls_server = Listener(self.pulsar.protocol(self.ssl_context), self.host, self.tls_port,
                                  reserve=self._reserve, counters=self.pulsar.counters)
            self._servers.append(tls_server)
            self.tls_port = tls_server.sockets[0].getsockname()[1]
            self.service_url_tls = f"pulsar+ssl://{self.host}:{self.tls_port}"
            self.pulsar.service_url_tls = self.service_url_tls
        self.core.producer_name_prefix = f"pulsarwire-{self.port if self.port is not None else self.tls_port}"
        self.pulsar.lookup_url = self.advertised_url or self.service_url or self.service_url_tls
        if self.v1_port is not None:
            self.v1 = V1Server(self.core, self.settings, max_connections=self.v1_max_connections)
            self.v1_port = await self.v1.start(self.host, self.v1_port)
        if self.http_port is not None:
            from .admin_http import DEFAULT_MAX_HTTP_CONNECTIONS, AdminServer  # aiohttp only when served
            self.admin = AdminServer(self, max_connections=self.max_http_connections or DEFAULT_MAX_HTTP_CONNECTIONS)
            self.http_port = await self.admin.start(self.host, self.http_port)
            self.http_url = self.admin.url
        self._background = asyncio.ensure_future(self._maintain())
        log.info("broker on %s (data in %s)", self.service_url or self.service_url_tls, self.data_dir)

    def _fit_descriptor_limit(self) -> None:
        """By default connections (Pulsar and V1 together) plus open segment files fit in the
        descriptor limit: a connection past it is then refused with an error (ServiceNotReady,
        TOO_MANY_CONNECTIONS) instead of waiting unaccepted while the OS refuses every accept
        (EMFILE). The two protocols share the room in proportion to their limits."""
        room = max(descriptor_limit() - self.core.files.max_open_files - _SPARE_DESCRIPTORS, 2)
        pulsar_max = self.pulsar.max_connections
        v1_max = self.v1_max_connections if self.v1_port is not None else 0
        if pulsar_max + v1_max <= room:
            return
        if self._connections_fit_descriptors:
            v1_room = min(v1_max, max(1, room * v1_max // (pulsar_max + v1_max))) if v1_max else 0
            self.pulsar.max_connections = min(pulsar_max, room - v1_room)
            log.warning("the descriptor limit (%d) leaves room for %d connections beside %d segment files: "
                        "serving at most %d Pulsar and %d V1 connections", descriptor_limit(), room,
                        self.core.files.max_open_files, self.pulsar.max_connections, v1_room)
            if v1_max:
                self.v1_max_connections = v1_room
        else:
            log.warning("max_connections %d (Pulsar) and %d (V1) and %d segment files exceed the descriptor "
                        "limit (%d): past it, new connections are refused until descriptors free up", pulsar_max, v1_max,
                        self.core.files.max_open_files, descriptor_limit())

    async def stop(self) -> None:
        if self.admin is not None:
            await self.admin.stop()
            self.admin = None
        for server in self._servers:
            server.close()
        self.pulsar.close_all()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        if self._reserve is not None:
            self._reserve.close()
        if self._background is not None:
            self._background.cancel()
        if self.v1 is not None:
            await self.v1.stop()
        self.core.close()

    async def __aenter__(self) -> "Broker":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def serve_forever(self) -> None:
        await asyncio.gather(*(s.serve_forever() for s in self._servers))

    async def _maintain(self) -> None:
        """Persist cursors often and fsync logs on the sync interval. A failure is logged and
        the step tried again next time: this task never ends before the broker stops."""
        elapsed = 0.0
        step = 0.2
        while True:
            try:
                await asyncio.sleep(step)
            except asyncio.CancelledError:
                return
            elapsed += step
            jobs: list[tuple[str, Callable[[], object]]] = [("saving cursors and dedup state", self.core.save),
                                                            ("retrying metadata writes", self.core.retry_writes),
                                                            ("closing idle topics", lambda: self.core.unload_idle_topics(
                                                                self.topic_idle_timeout))]
            if self.v1 is not None:
                jobs.append(("V1 upkeep", self.v1.tick))
            if self.sync_policy == SYNC_INTERVAL and elapsed >= self.sync_interval:
                elapsed = 0.0
                jobs.append(("fsync", lambda: self.core.sync(background=True)))  # off the event loop
            for name, job in jobs:
                try:
                    job()
                except Exception:  # noqa: BLE001 - the loop must outlive any one failure
                    log.exception("maintenance: %s failed; trying again", name)

    def storage_stats(self) -> dict:
        """Storage fault counters (corrupt entries skipped, failed commits and syncs), open files and
        the entry cache (`cache_bytes`, `max_cache_bytes`, `cache_evicted_entries`)."""
        return self.core.storage_stats()

    # administration

    async def create_partitioned_topic(self, name: str, partitions: int) -> None:
        """Make `name` a partitioned topic (or grow it); returns once that is on disk."""
        await asyncio.wrap_future(self.core.create_partitioned_topic(name, partitions))

    async def terminate_topic(self, name: str) -> int:
        """Terminate topic-partition `name` (on disk when this returns); its last entry id."""
        last, written = self.core.terminate_topic(name)
        if written is not None:
            await asyncio.wrap_future(written)
        return last

    def unload_topic(self, name: str) -> int:
        return self.core.unload_topic(name)
