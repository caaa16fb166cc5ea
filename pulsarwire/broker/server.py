"""The embedded broker: storage, the Pulsar binary protocol and the V1 text protocol.

    async with Broker(data_dir) as broker:      # free ports on 127.0.0.1
        broker.service_url                      # pulsar://127.0.0.1:PORT
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import ssl
from typing import TYPE_CHECKING, Any

from .. import codec
from .pulsar import BrokerConnection
from .storage import SYNC_INTERVAL, read_json, write_json
from .topics import Topic

if TYPE_CHECKING:
    from .v1 import V1Server

log = logging.getLogger("pulsarwire.broker")
_MARKER = "-partition-"


class Broker:
    def __init__(self, data_dir: str, *, host: str = "127.0.0.1", port: int = 0,
                 tls_port: int | None = None, ssl_context: ssl.SSLContext | None = None,
                 v1_port: int | None = 0, auth_tokens: set[str] | None = None,
                 sync_policy: str = SYNC_INTERVAL, sync_interval: float = 1.0,
                 segment_bytes: int = 64 * 1024 * 1024,
                 max_message_size: int = codec.DEFAULT_MAX_MESSAGE_SIZE,
                 keep_alive_interval: float = 30.0, default_partitions: int = 0,
                 v1_partitions: int = 3, replication_factor: int = 3, min_insync_replicas: int = 2,
                 replication_timeout: float = 5.0, replica_lag_time: float = 10.0,
                 session_timeout: float = 10.0, advertised_url: str | None = None) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.host = host
        self.port = port
        self.tls_port = tls_port
        self.ssl_context = ssl_context
        self.v1_port = v1_port
        self.auth_tokens = auth_tokens
        self.sync_policy = sync_policy
        self.sync_interval = sync_interval
        self.segment_bytes = segment_bytes
        self.max_message_size = max_message_size
        self.keep_alive_interval = keep_alive_interval
        self.default_partitions = default_partitions
        self.v1_options: dict[str, Any] = dict(partitions=v1_partitions, replication_factor=replication_factor,
                               min_insync_replicas=min_insync_replicas,
                               replication_timeout=replication_timeout,
                               replica_lag_time=replica_lag_time, session_timeout=session_timeout)
        self.connections: set[BrokerConnection] = set()
        self.uncommitted: set = set()  # logs with appends not yet handed to the OS
        self.topics: dict[str, Topic] = {}
        self.v1: V1Server | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._background: asyncio.Task | None = None
        self._names = itertools.count()
        self._partitioned: dict[str, int] = {}
        self.service_url = ""
        self.service_url_tls = ""
        self.advertised_url = advertised_url  # what lookups answer, e.g. a proxy in front of us

    # lifecycle

    async def start(self) -> "Broker":
        os.makedirs(self.data_dir, exist_ok=True)
        self._partitioned = read_json(self._metadata_path(), {})
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: BrokerConnection(self), self.host, self.port)
        self._servers.append(server)
        self.port = server.sockets[0].getsockname()[1]
        self.service_url = f"pulsar://{self.host}:{self.port}"
        self.lookup_url = self.advertised_url or self.service_url
        if self.tls_port is not None:
            if self.ssl_context is None:
                raise ValueError("tls_port needs an ssl_context")
            tls_server = await loop.create_server(lambda: BrokerConnection(self, tls=True), self.host,
                                                  self.tls_port, ssl=self.ssl_context)
            self._servers.append(tls_server)
            self.tls_port = tls_server.sockets[0].getsockname()[1]
            self.service_url_tls = f"pulsar+ssl://{self.host}:{self.tls_port}"
        if self.v1_port is not None:
            from .v1 import V1Server
            self.v1 = V1Server(self, **self.v1_options)
            self.v1_port = await self.v1.start(self.host, self.v1_port)
        self._background = asyncio.ensure_future(self._maintain())
        log.info("broker on %s (data in %s)", self.service_url, self.data_dir)
        return self

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        if self._background is not None:
            self._background.cancel()
        if self.v1 is not None:
            await self.v1.stop()
        self.commit()
        for topic in self.topics.values():
            topic.close()
        self.topics.clear()

    async def __aenter__(self) -> "Broker":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def commit(self) -> None:
        """Group commit: write every pending append. Runs before any receipt leaves the broker."""
        while self.uncommitted:
            self.uncommitted.pop().commit()

    async def serve_forever(self) -> None:
        await asyncio.gather(*(s.serve_forever() for s in self._servers))

    async def _maintain(self) -> None:
        """Persist cursors often and fsync logs on the sync interval."""
        elapsed = 0.0
        step = 0.2
        try:
            while True:
                await asyncio.sleep(step)
                elapsed += step
                for topic in list(self.topics.values()):
                    topic.save()
                if self.v1 is not None:
                    self.v1.tick()
                if self.sync_policy == SYNC_INTERVAL and elapsed >= self.sync_interval:
                    elapsed = 0.0
                    for topic in list(self.topics.values()):
                        topic.log.sync()
        except asyncio.CancelledError:
            pass

    # topics

    def _metadata_path(self) -> str:
        return os.path.join(self.data_dir, "topics.json")

    def partitions_of(self, name: str) -> int:
        if _MARKER in name:
            return 0
        if name not in self._partitioned and self.default_partitions and name not in self.topics:
            self.create_partitioned_topic(name, self.default_partitions)
        return self._partitioned.get(name, 0)

    def create_partitioned_topic(self, name: str, partitions: int) -> None:
        if partitions < 1:
            raise ValueError("a partitioned topic needs at least one partition")
        if name in self.topics:
            raise ValueError(f"{name} already exists as a non-partitioned topic")
        self._partitioned[name] = partitions
        write_json(self._metadata_path(), self._partitioned)

    def topic(self, name: str) -> Topic | None:
        """The topic-partition `name`, created on first use; None for a partitioned parent."""
        topic = self.topics.get(name)
        if topic is None:
            if name in self._partitioned:
                return None
            topic = Topic(self, name)
            self.topics[name] = topic
        return topic

    def terminate_topic(self, name: str) -> int:
        topic = self.topic(name)
        if topic is None:
            raise ValueError(f"{name} is partitioned; terminate its partitions")
        last = topic.terminate()
        for subscription in topic.subscriptions.values():
            self.check_end_of_topic(subscription)
        return last

    def unload_topic(self, name: str) -> int:
        """Close every producer and consumer on topic-partition `name`, as a broker does when a
        topic moves: clients look it up again and re-attach. Returns how many were closed."""
        from .._proto import PulsarApi_pb2 as pb
        topic = self.topics.get(name)
        if topic is None:
            return 0
        closed = 0
        for conn in list(self.connections):
            for producer_id, (owner, producer_name) in list(conn.producers.items()):
                if owner is topic:
                    del conn.producers[producer_id]
                    topic.producers.pop(producer_name, None)
                    conn.command(pb.BaseCommand.CLOSE_PRODUCER, "close_producer",
                                 pb.CommandCloseProducer(producer_id=producer_id, request_id=0))
                    closed += 1
            for consumer in list(conn.consumers.values()):
                if consumer.subscription.topic is topic:
                    conn.evict_consumer(consumer)
                    closed += 1
        return closed

    def check_end_of_topic(self, subscription) -> None:
        topic = subscription.topic
        if not topic.terminated or subscription.read_position < topic.log.next_entry_id or \
                subscription._redeliver:
            return
        from .._proto import PulsarApi_pb2 as pb
        for consumer in subscription.consumers:
            if not getattr(consumer, "told_end", False):
                consumer.told_end = True
                consumer.conn.command(pb.BaseCommand.REACHED_END_OF_TOPIC, "reachedEndOfTopic",
                                      pb.CommandReachedEndOfTopic(consumer_id=consumer.consumer_id))

    def new_producer_name(self) -> str:
        return f"pulsarwire-{self.port}-{next(self._names)}"
