"""The broker's HTTP port: Pulsar's admin v2 REST API (the subset a development broker needs,
with Pulsar's paths, verbs, JSON shapes and status codes), HTTP lookup (`/lookup/v2/...`, so an
`http://` service URL works) and `/metrics` (Prometheus). Served by aiohttp on the broker's loop.

Errors are JSON `{"reason": ...}` with Pulsar's codes (400 bad request, 401 no or bad credentials,
404 not found, 405, 409 conflict, 412 precondition failed, 413 body too large); an unexpected
failure is logged and answered 500 without its traceback. Bounds: `max_connections` open at once
(past it a connection is answered 503 and closed), `max_body_bytes` per request body.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import json
import logging
import shutil
from typing import TYPE_CHECKING, Any, Awaitable, Callable, cast

from aiohttp import web

from .. import codec
from .._proto import PulsarApi_pb2 as pb
from .compatibility import IncompatibleSchema, check_compatible, record_schema, version_for
from .core import PARTITION_MARKER, InvalidTopicName
from .metrics import CONTENT_TYPE, exposition, registry
from .policies import CLUSTER, PolicyError, SCHEMA_STRATEGIES, namespace_of
from .stats import RateSampler, internal_stats, topic_stats
from .storage import StorageError
from .entries import EARLIEST, LATEST, entry_metadata, start_entry
from .topic import Topic

if TYPE_CHECKING:
    from .metrics import ServedBroker
    from .storage import Entry
    from .subscription import Subscription

    _Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger("pulsarwire.broker.http")

DEFAULT_MAX_HTTP_CONNECTIONS = 256
DEFAULT_MAX_BODY_BYTES = 1024 * 1024  # a schema definition is the largest body the API takes
MAX_PEEK = 1000  # how deep `position/{n}` may peek
COMPACTION_SLICE = 256  # entries compaction reads between two turns of the event loop
MAX_OPENS_PER_REQUEST = 4096  # topics one admin request may wait to open (each opening handles it again)
DOMAINS = "{domain:persistent|non-persistent}"
TOPIC = DOMAINS + "/{tenant}/{namespace}/{topic}"


class AdminError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def _no_content() -> web.Response:
    return web.Response(status=204)


def _schema_type_name(kind: int) -> str:
    """Pulsar's SchemaType name for a protocol Schema.Type (KeyValue -> KEY_VALUE)."""
    name = pb.Schema.Type.Name(kind)
    special = {"None": "BYTES", "Bool": "BOOLEAN", "KeyValue": "KEY_VALUE", "ProtobufNative": "PROTOBUF_NATIVE",
               "LocalDate": "LOCAL_DATE", "LocalTime": "LOCAL_TIME", "LocalDateTime": "LOCAL_DATE_TIME"}
    return special.get(name, name.upper())


def _schema_type(name: str) -> int:
    for kind in pb.Schema.Type.values():
        if _schema_type_name(kind) == str(name).upper():
            return kind
    if str(name).upper() == "NONE":
        return pb.Schema.Type.Value("None")
    raise AdminError(400, f"unknown schema type {str(name)[:32]!r}")


class AdminServer:
    """The HTTP listener of one broker."""

    def __init__(self, broker: "ServedBroker", *, max_connections: int = DEFAULT_MAX_HTTP_CONNECTIONS,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, stats_interval: float = 5.0) -> None:
        if max_connections < 1 or max_body_bytes < 1:
            raise ValueError("max_connections and max_body_bytes must be positive")
        self.broker = broker
        self.core = broker.core
        self.max_connections = max_connections
        self.rates = RateSampler(self.core.topics, stats_interval)
        self.metrics = registry(broker, self.rates)
        self.refused_connections = 0
        self.url = ""
        self._compactions: dict[str, dict] = {}  # topic -> {"status", "lastError"}
        self._compacting: set[asyncio.Task] = set()
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self.app = web.Application(client_max_size=max_body_bytes, middlewares=[self._errors, self._auth])
        self._routes()

    # lifecycle

    async def start(self, host: str, port: int) -> int:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, keepalive_timeout=30)
        await self._runner.setup()
        handlers = self._runner.server
        assert handlers is not None

        def bounded() -> asyncio.BaseProtocol:
            if len(handlers.connections) >= self.max_connections:
                self.refused_connections += 1
                return _Refusal()
            return handlers()
        self._server = await asyncio.get_running_loop().create_server(bounded, host, port)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{host}:{port}"
        self.rates.start()
        return port

    async def stop(self) -> None:
        self.rates.stop()
        for task in list(self._compacting):
            task.cancel()
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.shutdown()
            await self._runner.cleanup()
        if self._server is not None:
            await self._server.wait_closed()

    # middlewares

    @web.middleware
    async def _errors(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        try:
            return await self._once_open(request, handler)
        except AdminError as exc:
            return _json({"reason": exc.reason}, exc.status)
        except PolicyError as exc:
            return _json({"reason": str(exc)}, exc.status)
        except InvalidTopicName as exc:
            return _json({"reason": f"Invalid topic name: {exc}"}, 412)
        except StorageError as exc:
            return _json({"reason": f"storage error: {exc}"}, 500)
        except web.HTTPException as exc:  # no route (404), wrong verb (405), body too large (413)
            if exc.status < 400:
                raise
            return _json({"reason": exc.reason}, exc.status)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged here; the client gets no traceback
            log.exception("admin request %s %s failed", request.method, request.path)
            return _json({"reason": f"internal error ({type(exc).__name__})"}, 500)

    async def _once_open(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Handle the request; each time it needs a topic that is not open, open that off the
        event loop and handle it again (a handler asks for its topics before it changes anything)."""
        for _ in range(MAX_OPENS_PER_REQUEST):
            try:
                return await handler(request)
            except _NotOpen as missing:
                await self.core.open_topic(missing.name)
        raise AdminError(503, "the request's topics did not stay open; try again")

    @web.middleware
    async def _auth(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        service = self.broker.pulsar
        if service.auth_tokens is None and service.auth_basic is None:
            return await handler(request)
        scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
        role = None
        if scheme.lower() == "bearer" and credentials:
            role = service.authenticate("token", credentials.strip().encode(), None)
        elif scheme.lower() == "basic" and credentials:
            try:
                role = service.authenticate("basic", base64.b64decode(credentials.strip(), validate=True), None)
            except (binascii.Error, ValueError):
                role = None
        if role is None and not credentials and service.anonymous_role is not None:
            role = service.anonymous_role  # as Pulsar's anonymousUserRole
        if role is None:
            raise AdminError(401, "Authentication required" if not credentials else "Authentication failed")
        return await handler(request)

    # routes

    def _routes(self) -> None:
        r = self.app.router
        a = "/admin/v2"
        for method, path, handler in (
            ("GET", "/metrics", self.get_metrics), ("GET", "/metrics/", self.get_metrics),
            ("GET", f"/lookup/v2/topic/{TOPIC}", self.lookup),
            ("GET", f"{a}/clusters", self.clusters),
            ("GET", f"{a}/brokers/health", self.health),
            ("GET", f"{a}/tenants", self.list_tenants),
            ("GET", f"{a}/tenants/{{tenant}}", self.get_tenant),
            ("PUT", f"{a}/tenants/{{tenant}}", self.create_tenant),
            ("POST", f"{a}/tenants/{{tenant}}", self.update_tenant),
            ("DELETE", f"{a}/tenants/{{tenant}}", self.delete_tenant),
            ("GET", f"{a}/namespaces/{{tenant}}", self.list_namespaces),
            ("GET", f"{a}/namespaces/{{tenant}}/{{namespace}}", self.get_namespace),
            ("PUT", f"{a}/namespaces/{{tenant}}/{{namespace}}", self.create_namespace),
            ("DELETE", f"{a}/namespaces/{{tenant}}/{{namespace}}", self.delete_namespace),
            ("GET", f"{a}/namespaces/{{tenant}}/{{namespace}}/topics", self.namespace_topics),
            ("GET", f"{a}/namespaces/{{tenant}}/{{namespace}}/deduplication", self.get_namespace_dedup),
            ("POST", f"{a}/namespaces/{{tenant}}/{{namespace}}/deduplication", self.set_namespace_dedup),
            ("DELETE", f"{a}/namespaces/{{tenant}}/{{namespace}}/deduplication", self.remove_namespace_dedup),
            ("GET", f"{a}/namespaces/{{tenant}}/{{namespace}}/schemaCompatibilityStrategy",
             self.get_namespace_strategy),
            ("PUT", f"{a}/namespaces/{{tenant}}/{{namespace}}/schemaCompatibilityStrategy",
             self.set_namespace_strategy),
            ("POST", f"{a}/namespaces/{{tenant}}/{{namespace}}/schemaCompatibilityStrategy",
             self.set_namespace_strategy),
            ("GET", f"{a}/{DOMAINS}/{{tenant}}/{{namespace}}", self.list_topics),
            ("GET", f"{a}/{DOMAINS}/{{tenant}}/{{namespace}}/partitioned", self.list_partitioned),
            ("PUT", f"{a}/{TOPIC}", self.create_topic),
            ("DELETE", f"{a}/{TOPIC}", self.delete_topic),
            ("PUT", f"{a}/{TOPIC}/partitions", self.create_partitioned),
            ("POST", f"{a}/{TOPIC}/partitions", self.update_partitioned),
            ("GET", f"{a}/{TOPIC}/partitions", self.get_partitioned),
            ("DELETE", f"{a}/{TOPIC}/partitions", self.delete_partitioned),
            ("PUT", f"{a}/{TOPIC}/unload", self.unload),
            ("POST", f"{a}/{TOPIC}/terminate", self.terminate),
            ("GET", f"{a}/{TOPIC}/stats", self.stats),
            ("GET", f"{a}/{TOPIC}/partitioned-stats", self.partitioned_stats),
            ("GET", f"{a}/{TOPIC}/internalStats", self.internal_stats),
            ("GET", f"{a}/{TOPIC}/subscriptions", self.subscriptions),
            ("PUT", f"{a}/{TOPIC}/subscription/{{subscription}}", self.create_subscription),
            ("DELETE", f"{a}/{TOPIC}/subscription/{{subscription}}", self.delete_subscription),
            ("POST", f"{a}/{TOPIC}/subscription/{{subscription}}/skip/{{count}}", self.skip),
            ("POST", f"{a}/{TOPIC}/subscription/{{subscription}}/skip_all", self.skip_all),
            ("POST", f"{a}/{TOPIC}/subscription/{{subscription}}/resetcursor/{{timestamp}}", self.reset_by_time),
            ("POST", f"{a}/{TOPIC}/subscription/{{subscription}}/resetcursor", self.reset_by_id),
            ("GET", f"{a}/{TOPIC}/subscription/{{subscription}}/position/{{position}}", self.peek),
            ("PUT", f"{a}/{TOPIC}/compaction", self.compact),
            ("GET", f"{a}/{TOPIC}/compaction", self.compaction_status),
            ("GET", f"{a}/{TOPIC}/deduplicationEnabled", self.get_topic_dedup),
            ("POST", f"{a}/{TOPIC}/deduplicationEnabled", self.set_topic_dedup),
            ("DELETE", f"{a}/{TOPIC}/deduplicationEnabled", self.remove_topic_dedup),
            ("GET", f"{a}/{TOPIC}/schemaCompatibilityStrategy", self.get_topic_strategy),
            ("PUT", f"{a}/{TOPIC}/schemaCompatibilityStrategy", self.set_topic_strategy),
            ("DELETE", f"{a}/{TOPIC}/schemaCompatibilityStrategy", self.remove_topic_strategy),
            ("GET", f"{a}/schemas/{{tenant}}/{{namespace}}/{{topic}}/schema", self.get_schema),
            ("GET", f"{a}/schemas/{{tenant}}/{{namespace}}/{{topic}}/schema/{{version}}", self.get_schema),
            ("GET", f"{a}/schemas/{{tenant}}/{{namespace}}/{{topic}}/schemas", self.get_schemas),
            ("POST", f"{a}/schemas/{{tenant}}/{{namespace}}/{{topic}}/schema", self.post_schema),
            ("DELETE", f"{a}/schemas/{{tenant}}/{{namespace}}/{{topic}}/schema", self.delete_schema),
            ("POST", f"{a}/schemas/{{tenant}}/{{namespace}}/{{topic}}/compatibility", self.check_schema),
        ):
            r.add_route(method, path, handler)

    # helpers

    @staticmethod
    async def _body(request: web.Request, default: Any = None) -> Any:
        raw = await request.read()
        if not raw.strip():
            return default
        try:
            return json.loads(raw)
        except ValueError:
            raise AdminError(400, "the request body is not JSON") from None

    @staticmethod
    def _namespace(request: web.Request) -> str:
        return f"{request.match_info['tenant']}/{request.match_info['namespace']}"

    def _topic_name(self, request: web.Request, domain: str | None = None) -> str:
        info = request.match_info
        name = f"{domain or info.get('domain', 'persistent')}://{info['tenant']}/{info['namespace']}/{info['topic']}"
        self.core.check_topic_name(name)
        return name

    def _namespace_known(self, namespace: str) -> bool:
        return namespace in self.core.policies.namespaces or bool(self.core.topics_of_namespace(namespace))

    def _check_namespace(self, namespace: str) -> None:
        if not self._namespace_known(namespace):
            raise AdminError(404, f"Namespace {namespace} does not exist")

    def _exists(self, name: str) -> bool:
        return self.core.partitioned_count(name) is not None or self.core.non_partitioned_exists(name)

    def _partitions(self, name: str) -> list[str]:
        """The topic-partitions an operation on `name` acts on (404 when there is no such topic)."""
        count = self.core.partitioned_count(name)
        if count is not None:
            return [f"{name}{PARTITION_MARKER}{i}" for i in range(count)]
        if not self.core.non_partitioned_exists(name):
            raise AdminError(404, f"Topic {name} not found")
        return [name]

    def _topic(self, partition: str) -> Topic:
        """The open topic-partition; one not open yet is opened off the event loop and the
        request handled again (_NotOpen, see _errors)."""
        if partition not in self.core.topics and self.core.needs_opening(partition):
            raise _NotOpen(partition)
        topic = self.core.topic(partition)
        if topic is None:
            raise AdminError(404, f"Topic {partition} not found")
        return topic

    def _subscription(self, topic: Topic, name: str) -> Subscription:
        subscription = topic.subscriptions.get(name)
        if subscription is None:
            raise AdminError(404, f"Subscription {name} not found")
        return subscription

    async def _remove_folders(self, folders: list[str]) -> None:
        for folder in folders:  # off the event loop; a restart removes what a crash left
            await asyncio.to_thread(shutil.rmtree, folder, True)

    # metrics, lookup, clusters

    async def get_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=exposition(self.broker, self.rates, self.metrics),
                            headers={"Content-Type": CONTENT_TYPE})

    async def lookup(self, request: web.Request) -> web.Response:
        self._topic_name(request)
        service = self.broker.pulsar
        return _json({"brokerUrl": service.lookup_url, "brokerUrlTls": service.service_url_tls,
                      "httpUrl": self.url, "httpUrlTls": "", "nativeUrl": service.lookup_url})

    async def clusters(self, request: web.Request) -> web.Response:
        return _json([CLUSTER])

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # tenants

    async def list_tenants(self, request: web.Request) -> web.Response:
        return _json(sorted(self.core.policies.tenants))

    async def get_tenant(self, request: web.Request) -> web.Response:
        return _json(self.core.policies.tenant(request.match_info["tenant"]))

    async def create_tenant(self, request: web.Request) -> web.Response:
        info = await self._body(request, {})
        if not isinstance(info, dict):
            raise AdminError(400, "a tenant's info is a JSON object")
        self.core.policies.create_tenant(request.match_info["tenant"], info)
        await self.core.policies.save()
        return _no_content()

    async def update_tenant(self, request: web.Request) -> web.Response:
        info = await self._body(request, {})
        if not isinstance(info, dict):
            raise AdminError(400, "a tenant's info is a JSON object")
        self.core.policies.update_tenant(request.match_info["tenant"], info)
        await self.core.policies.save()
        return _no_content()

    async def delete_tenant(self, request: web.Request) -> web.Response:
        self.core.policies.delete_tenant(request.match_info["tenant"])
        await self.core.policies.save()
        return _no_content()

    # namespaces

    async def list_namespaces(self, request: web.Request) -> web.Response:
        tenant = request.match_info["tenant"]
        self.core.policies.tenant(tenant)
        return _json(sorted(ns for ns in self.core.policies.namespaces if ns.split("/", 1)[0] == tenant))

    async def get_namespace(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        policies = dict(self.core.policies.namespace(namespace))
        policies.setdefault("deduplicationEnabled", None)
        policies.setdefault("schema_compatibility_strategy", policies.get("schemaCompatibilityStrategy", "UNDEFINED"))
        return _json(dict(policies, bundles={"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1},
                          replication_clusters=[CLUSTER]))

    async def create_namespace(self, request: web.Request) -> web.Response:
        policies = await self._body(request, {})
        if not isinstance(policies, dict):
            raise AdminError(400, "a namespace's policies are a JSON object")
        self.core.policies.create_namespace(self._namespace(request), policies)
        await self.core.policies.save()
        return _no_content()

    async def delete_namespace(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        self.core.policies.namespace(namespace)
        if self.core.topics_of_namespace(namespace, True, True):
            raise AdminError(409, f"Cannot delete non empty namespace {namespace}")
        self.core.policies.delete_namespace(namespace)
        await self.core.policies.save()
        return _no_content()

    async def namespace_topics(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        self._check_namespace(namespace)
        mode = request.query.get("mode", "PERSISTENT").upper()
        return _json(self.core.topics_of_namespace(namespace, mode in ("PERSISTENT", "ALL"),
                                                   mode in ("NON_PERSISTENT", "ALL")))

    async def _set_namespace_policy(self, request: web.Request, key: str, value: object) -> web.Response:
        self.core.policies.set_namespace_policy(self._namespace(request), key, value)
        await self.core.policies.save()
        return _no_content()

    async def get_namespace_dedup(self, request: web.Request) -> web.Response:
        return _json(self.core.policies.namespace(self._namespace(request)).get("deduplicationEnabled"))

    async def set_namespace_dedup(self, request: web.Request) -> web.Response:
        return await self._set_namespace_policy(request, "deduplicationEnabled", await self._body(request))

    async def remove_namespace_dedup(self, request: web.Request) -> web.Response:
        return await self._set_namespace_policy(request, "deduplicationEnabled", None)

    async def get_namespace_strategy(self, request: web.Request) -> web.Response:
        policies = self.core.policies.namespace(self._namespace(request))
        return _json(policies.get("schemaCompatibilityStrategy", "UNDEFINED"))

    async def set_namespace_strategy(self, request: web.Request) -> web.Response:
        value = await self._body(request)
        if value is None:
            raise AdminError(400, f"the body is one of {', '.join(SCHEMA_STRATEGIES)}, as a JSON string")
        return await self._set_namespace_policy(request, "schemaCompatibilityStrategy", value)

    # topics

    async def list_topics(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        self._check_namespace(namespace)
        persistent = request.match_info["domain"] == "persistent"
        return _json(self.core.topics_of_namespace(namespace, persistent, not persistent))

    async def list_partitioned(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        self._check_namespace(namespace)
        prefix = f"{request.match_info['domain']}://{namespace}/"
        return _json(sorted(name for name in self.core._partitioned if name.startswith(prefix)))

    async def create_topic(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        self._check_namespace(namespace_of(name))
        if self._exists(name):
            raise AdminError(409, "This topic already exists")
        topic = await self.core.open_topic(name)  # made off the event loop
        if topic is None:
            raise AdminError(409, "This topic already exists")
        topic.save()
        return _no_content()

    def _check_unused(self, partitions: list[str], force: bool) -> None:
        for partition in partitions:
            topic = self.core.topics.get(partition)
            if not force and topic is not None and (topic.producers or any(s.consumers for s in
                                                                           topic.subscriptions.values())):
                raise AdminError(412, "Topic has active producers/subscriptions")

    async def delete_topic(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        force = request.query.get("force", "false").lower() == "true"
        if self.core.partitioned_count(name) is not None:
            return await self.delete_partitioned(request)
        partitions = self._partitions(name)
        self._check_unused(partitions, force)
        folder = self.core.delete_topic(name)
        await self._remove_folders([folder] if folder else [])
        return _no_content()

    async def create_partitioned(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        self._check_namespace(namespace_of(name))
        partitions = await self._body(request)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise AdminError(412, "The number of partitions should be more than 0")
        if self._exists(name):
            raise AdminError(409, "This topic already exists")
        await _stored(self.core.create_partitioned_topic(name, partitions))
        return _no_content()

    async def update_partitioned(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        partitions = await self._body(request)
        existing = self.core.partitioned_count(name)
        if existing is None:
            raise AdminError(404, f"Partitioned topic {name} not found")
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions <= existing:
            raise AdminError(412, f"The number of partitions must be more than the {existing} the topic has")
        await _stored(self.core.create_partitioned_topic(name, partitions))
        return _no_content()

    async def get_partitioned(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        if request.query.get("checkAllowAutoCreation", "false").lower() == "true":
            await _stored(self.core.partitions_written(name))  # creates it partitioned where the broker would
            partitions = self.core.partitions_of(name)
        else:
            partitions = self.core.partitioned_count(name) or 0
        return _json({"partitions": partitions, "deleted": False})

    async def delete_partitioned(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        count = self.core.partitioned_count(name)
        if count is None:
            raise AdminError(404, f"Partitioned topic {name} not found")
        self._check_unused(self._partitions(name), request.query.get("force", "false").lower() == "true")
        written, folders = self.core.delete_partitioned_topic(name)
        await _stored(written)
        await self._remove_folders(folders)
        return _no_content()

    async def unload(self, request: web.Request) -> web.Response:
        for partition in self._partitions(self._topic_name(request)):
            self.core.unload_topic(partition)
        return _no_content()

    async def terminate(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        if self.core.partitioned_count(name) is not None:
            raise AdminError(405, "Termination of a partitioned topic is not allowed")
        topic = self._topic(self._partitions(name)[0])
        last, written = self.core.terminate_topic(name)
        await _stored(written)
        return _json({"ledgerId": topic.ledger_of(max(last, 0)), "entryId": last, "partitionIndex": -1})

    async def stats(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        if self.core.partitioned_count(name) is not None:
            return await self.partitioned_stats(request)
        topic = self._topic(self._partitions(name)[0])
        return _json(topic_stats(topic, self.rates, topic.deduplication))

    async def partitioned_stats(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        count = self.core.partitioned_count(name)
        if count is None:
            raise AdminError(404, f"Partitioned topic {name} not found")
        per_partition = {p: topic_stats(self._topic(p), self.rates, self._topic(p).deduplication)
                         for p in self._partitions(name)}
        total = _sum_stats(list(per_partition.values()))
        total["metadata"] = {"partitions": count}
        if request.query.get("perPartition", "true").lower() == "true":
            total["partitions"] = per_partition
        return _json(total)

    async def internal_stats(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        if self.core.partitioned_count(name) is not None:
            return _json({"metadata": {"partitions": self.core.partitioned_count(name)},
                          "partitions": {p: internal_stats(self._topic(p)) for p in self._partitions(name)}})
        return _json(internal_stats(self._topic(self._partitions(name)[0])))

    # subscriptions

    async def subscriptions(self, request: web.Request) -> web.Response:
        names: set[str] = set()
        for partition in self._partitions(self._topic_name(request)):
            names.update(self._topic(partition).subscriptions)
        return _json(sorted(names))

    async def create_subscription(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        sub_name = request.match_info["subscription"]
        if not sub_name or len(sub_name) > 1024:
            raise AdminError(412, "invalid subscription name")
        start = _message_id(await self._body(request, {"ledgerId": LATEST, "entryId": LATEST}))
        partitions = self._partitions(name) if self._exists(name) else [name]
        topics = [self._topic(p) for p in partitions]
        if any(sub_name in t.subscriptions for t in topics):
            raise AdminError(409, f"Subscription {sub_name} already exists")
        for topic in topics:
            subscription = topic.subscription(sub_name, pb.CommandSubscribe.Exclusive, True, start == EARLIEST, None,
                                              wait=False)
            if start not in (EARLIEST, LATEST):
                subscription.seek(start_entry(start, topic.log))
                topic.save()
        for topic in topics:
            await _stored(topic.written_cursors())
        return _no_content()

    async def delete_subscription(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        sub_name = request.match_info["subscription"]
        force = request.query.get("force", "false").lower() == "true"
        found = [t for t in (self._topic(p) for p in self._partitions(name)) if sub_name in t.subscriptions]
        if not found:
            raise AdminError(404, f"Subscription {sub_name} not found")
        for topic in found:
            if topic.subscriptions[sub_name].consumers and not force:
                raise AdminError(412, "Subscription has active connected consumers")
        for topic in found:
            for consumer in list(topic.subscriptions[sub_name].consumers):
                consumer.evict()
            await _stored(topic.drop_subscription(sub_name))
        return _no_content()

    def _each_subscription(self, request: web.Request) -> list[tuple[Topic, Subscription]]:
        name = self._topic_name(request)
        sub_name = request.match_info["subscription"]
        found = [(t, t.subscriptions[sub_name]) for t in (self._topic(p) for p in self._partitions(name))
                 if sub_name in t.subscriptions]
        if not found:
            raise AdminError(404, f"Subscription {sub_name} not found")
        return found

    async def skip(self, request: web.Request) -> web.Response:
        try:
            count = int(request.match_info["count"])
        except ValueError:
            raise AdminError(400, "the number of messages to skip is a number") from None
        if count < 0:
            raise AdminError(412, "the number of messages to skip must not be negative")
        for topic, subscription in self._each_subscription(request):
            entry_id, skipped = subscription.cursor.mark_delete + 1, 0
            while skipped < count and entry_id < topic.log.committed_entry_id:
                if not subscription.cursor.is_acked(entry_id):
                    subscription.ack(entry_id, None, False)
                    skipped += 1
                entry_id += 1
            subscription.dirty = True
            topic.save()
        return _no_content()

    def _move(self, topic: Topic, subscription: Subscription, entry_id: int) -> None:
        subscription.seek(entry_id)
        for consumer in list(subscription.consumers):  # as a seek: consumers attach again from there
            consumer.evict()
        topic.save()

    async def skip_all(self, request: web.Request) -> web.Response:
        for topic, subscription in self._each_subscription(request):
            self._move(topic, subscription, topic.log.committed_entry_id)
        return _no_content()

    async def reset_by_time(self, request: web.Request) -> web.Response:
        try:
            timestamp = int(request.match_info["timestamp"])
        except ValueError:
            raise AdminError(412, "the time to reset to is milliseconds since the epoch") from None
        for topic, subscription in self._each_subscription(request):
            self._move(topic, subscription, await topic.find_by_publish_time(timestamp))
        return _no_content()

    async def reset_by_id(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if not isinstance(body, dict):
            raise AdminError(400, "the body is a message id: {\"ledgerId\": L, \"entryId\": E}")
        start = _message_id(body)
        excluded = request.query.get("isExcluded", "false").lower() == "true"
        for topic, subscription in self._each_subscription(request):
            position = start_entry(start, topic.log)
            self._move(topic, subscription, position + 1 if excluded and start not in (EARLIEST, LATEST) else position)
        return _no_content()

    async def peek(self, request: web.Request) -> web.Response:
        try:
            depth = int(request.match_info["position"])
        except ValueError:
            raise AdminError(400, "the position to peek is a number") from None
        if not 1 <= depth <= MAX_PEEK:
            raise AdminError(412, f"the position to peek is from 1 to {MAX_PEEK}")
        name = self._topic_name(request)
        if self.core.partitioned_count(name) is not None:
            raise AdminError(405, "Peek messages on a partitioned topic is not allowed; peek a partition")
        [(topic, subscription)] = self._each_subscription(request)
        entry_id, seen = subscription.cursor.mark_delete + 1, 0
        while entry_id < topic.log.committed_entry_id:
            if not subscription.cursor.is_acked(entry_id):
                seen += 1
                if seen == depth:
                    return _entry_response(topic, await topic.log.read_off_loop(entry_id))
            entry_id += 1
        raise AdminError(404, "Message not found")

    # compaction

    async def compact(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        partitions = self._partitions(name)
        if any(self._compactions.get(p, {}).get("status") == "RUNNING" for p in partitions):
            raise AdminError(409, "Compaction already in progress")
        topics = [self._topic(partition) for partition in partitions]
        for partition, topic in zip(partitions, topics):
            self._compactions[partition] = {"status": "RUNNING", "lastError": ""}
            task = asyncio.ensure_future(self._compact(topic))
            self._compacting.add(task)
            task.add_done_callback(self._compacting.discard)
        return _no_content()

    async def compaction_status(self, request: web.Request) -> web.Response:
        partitions = self._partitions(self._topic_name(request))
        states = [self._compactions.get(p, {"status": "NOT_RUN", "lastError": ""}) for p in partitions]
        for status in ("ERROR", "RUNNING", "NOT_RUN", "SUCCESS"):
            for state in states:
                if state["status"] == status:
                    return _json(state)
        return _json({"status": "NOT_RUN", "lastError": ""})

    async def _compact(self, topic: Topic) -> None:
        """Find the latest entry of each key up to the last committed entry, a slice at a time; a
        key whose latest message is empty (a tombstone) or has no key is left out, as Pulsar does."""
        state = self._compactions[topic.name]
        try:
            horizon = topic.log.committed_entry_id - 1
            latest: dict[str, int] = {}
            removed: set[str] = set()
            reader = topic.log.reader()
            try:
                for entry_id in range(topic.log.first_entry_id, horizon + 1):
                    if entry_id % COMPACTION_SLICE == 0:
                        await asyncio.sleep(0)
                        if topic.log is None or self.core.topics.get(topic.name) is not topic:
                            raise AdminError(409, "the topic was closed during compaction")
                    try:
                        entry = await topic.log.read_off_loop(entry_id, reader)
                    except Exception:  # noqa: BLE001 - an unreadable entry is no key's latest value
                        continue
                    for key, empty in _keys(entry):
                        latest[key] = entry_id
                        if empty:
                            removed.add(key)
                        else:
                            removed.discard(key)
            finally:
                reader.close()
            await _stored(topic.set_compacted(horizon, {e for k, e in latest.items() if k not in removed}))
            state.update(status="SUCCESS", lastError="")
        except asyncio.CancelledError:
            state.update(status="ERROR", lastError="the broker stopped")
            raise
        except Exception as exc:  # noqa: BLE001 - told through the status
            log.exception("compaction of %s failed", topic.name)
            state.update(status="ERROR", lastError=str(exc) or type(exc).__name__)

    # deduplication and schema compatibility per topic

    async def _set_topic_policy(self, request: web.Request, key: str, value: object) -> web.Response:
        name = self._topic_name(request)
        self._partitions(name)
        self.core.policies.set_topic_policy(name, key, value)
        await self.core.policies.save()
        return _no_content()

    async def get_topic_dedup(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        return _json(self.core.policies.topic_policy(name, "deduplicationEnabled"))

    async def set_topic_dedup(self, request: web.Request) -> web.Response:
        return await self._set_topic_policy(request, "deduplicationEnabled", await self._body(request))

    async def remove_topic_dedup(self, request: web.Request) -> web.Response:
        return await self._set_topic_policy(request, "deduplicationEnabled", None)

    async def get_topic_strategy(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        return _json(self.core.policies.topic_policy(name, "schemaCompatibilityStrategy") or "UNDEFINED")

    async def set_topic_strategy(self, request: web.Request) -> web.Response:
        return await self._set_topic_policy(request, "schemaCompatibilityStrategy", await self._body(request))

    async def remove_topic_strategy(self, request: web.Request) -> web.Response:
        return await self._set_topic_policy(request, "schemaCompatibilityStrategy", None)

    # schemas

    def _schema_topics(self, request: web.Request, create: bool = False) -> tuple[str, list[Topic]]:
        name = self._topic_name(request, "persistent")
        if not self._exists(name):
            if not create:
                raise AdminError(404, "Topic not found")
            self._check_namespace(namespace_of(name))
            return name, [self._topic(name)]
        return name, [self._topic(p) for p in self._partitions(name)]

    async def get_schema(self, request: web.Request) -> web.Response:
        _, topics = self._schema_topics(request)
        versions = topics[0].schemas
        wanted = request.match_info.get("version")
        try:
            version = len(versions) - 1 if wanted is None else int(wanted)
        except ValueError:
            raise AdminError(400, "a schema version is a number") from None
        if not 0 <= version < len(versions):
            raise AdminError(404, "Schema not found")
        return _json(_schema_json(versions[version], version))

    async def get_schemas(self, request: web.Request) -> web.Response:
        _, topics = self._schema_topics(request)
        return _json({"getSchemaResponses": [_schema_json(r, v) for v, r in enumerate(topics[0].schemas)]})

    def _posted_schema(self, body: object) -> pb.Schema:
        if not isinstance(body, dict) or "type" not in body:
            raise AdminError(400, 'the body is {"type": ..., "schema": ..., "properties": {...}}')
        properties = body.get("properties") or {}
        if not isinstance(properties, dict) or not isinstance(body.get("schema", ""), str):
            raise AdminError(400, "schema is a string and properties an object of strings")
        return pb.Schema(type=cast(Any, _schema_type(body["type"])), name=body.get("name", "") or "",
                         schema_data=body.get("schema", "").encode(),
                         properties=[pb.KeyValue(key=str(k), value=str(v)) for k, v in sorted(properties.items())])

    async def post_schema(self, request: web.Request) -> web.Response:
        schema = self._posted_schema(await self._body(request))
        name, topics = self._schema_topics(request, create=True)
        strategy = self.core.policies.schema_strategy(name)
        version = 0
        for topic in topics:
            await _schema_settled(topic)
            try:
                version, record = version_for(schema, topic.schemas, strategy)
            except IncompatibleSchema as exc:
                raise AdminError(409, f"Incompatible schema: {exc}") from None
            if record is not None:
                await _stored(topic.register_schema(record))
                version = next(i for i, kept in enumerate(topic.schemas) if kept is record)
        return _json({"version": {"version": version}})

    async def delete_schema(self, request: web.Request) -> web.Response:
        _, topics = self._schema_topics(request)
        version = len(topics[0].schemas)
        for topic in topics:
            await _schema_settled(topic)
            await _stored(topic.clear_schemas())
        return _json({"version": version})

    async def check_schema(self, request: web.Request) -> web.Response:
        schema = self._posted_schema(await self._body(request))
        name, topics = self._schema_topics(request)
        strategy = self.core.policies.schema_strategy(name)
        try:
            check_compatible(schema, [record_schema(r) for r in topics[0].schemas], strategy)
            compatible = True
        except IncompatibleSchema:
            compatible = False
        return _json({"isCompatibility": compatible, "schemaCompatibilityStrategy": strategy})


class _NotOpen(Exception):
    """A handler needs topic-partition `name`, which is not open yet."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


async def _stored(written: concurrent.futures.Future | None) -> None:
    """Wait for a metadata write (None: nothing to wait for); its StorageError is raised here."""
    if written is not None:
        await asyncio.wrap_future(written)


async def _schema_settled(topic: Topic) -> None:
    """Wait until no schema change of `topic` is being written (whether it succeeded or not)."""
    while topic.schema_write is not None:
        try:
            await asyncio.wrap_future(topic.schema_write)
        except Exception:  # noqa: BLE001 - its own request was told; this one goes on
            await asyncio.sleep(0)  # the topic forgets a failed write in a callback of its own


class _Refusal(asyncio.Protocol):
    """What a connection past the bound gets: 503 and the connection closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # a server's connection: a stream transport
        body = b'{"reason": "too many HTTP connections"}'
        transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        transport.close()


def _message_id(body: object) -> int:
    """The entry a message id JSON names; EARLIEST or LATEST for Pulsar's earliest and latest."""
    if not isinstance(body, dict):
        raise AdminError(400, "a message id is {\"ledgerId\": L, \"entryId\": E}")
    ledger, entry = body.get("ledgerId"), body.get("entryId")
    if not isinstance(ledger, int) or not isinstance(entry, int):
        raise AdminError(400, "a message id's ledgerId and entryId are numbers")
    if ledger < 0 or entry < 0:
        return EARLIEST
    if ledger >= (1 << 63) - 1 or entry >= (1 << 63) - 1:
        return LATEST
    return entry


def _keys(entry: Entry) -> list[tuple[str, bool]]:
    """(key, payload is empty) of each keyed message of an entry; none for an undecodable entry."""
    try:
        metadata = entry_metadata(entry)
        stored = memoryview(entry.body)[4 + int.from_bytes(entry.body[:4], "big"):]
        messages = codec.split_messages(metadata, codec.decompress_payload(metadata, stored))
    except Exception:  # noqa: BLE001 - a corrupt or undecodable entry is no key's latest value
        return []
    keys = []
    for message in messages:
        key = message.partition_key
        if key is not None:
            keys.append((key, len(message.payload) == 0 or bool(message.null_value)))
    return keys


def _entry_response(topic: Topic, entry: Entry) -> web.Response:
    """An entry as Pulsar's peek answers it: the (uncompressed) payload, metadata in headers."""
    metadata = entry_metadata(entry)
    stored = memoryview(entry.body)[4 + int.from_bytes(entry.body[:4], "big"):]
    payload = bytes(codec.decompress_payload(metadata, stored))
    headers = {"Content-Type": "application/octet-stream",
               "X-Pulsar-Message-ID": f"{topic.ledger_of(entry.entry_id)}:{entry.entry_id}",
               "X-Pulsar-publish-time": str(metadata.publish_time),
               "X-Pulsar-producer-name": metadata.producer_name,
               "X-Pulsar-sequence-id": str(metadata.sequence_id)}
    if metadata.HasField("num_messages_in_batch"):
        headers["X-Pulsar-num-batch-message"] = str(metadata.num_messages_in_batch)
        headers["X-Pulsar-batch-size"] = str(len(payload))
    if metadata.HasField("partition_key"):
        headers["X-Pulsar-partition-key"] = metadata.partition_key
    if metadata.HasField("event_time"):
        headers["X-Pulsar-event-time"] = str(metadata.event_time)
    for prop in metadata.properties:
        if all(32 <= ord(c) < 127 for c in prop.key + prop.value):
            headers[f"X-Pulsar-PROPERTY-{prop.key}"] = prop.value
    return web.Response(body=payload, headers=headers)


def _schema_json(record: dict, version: int) -> dict:
    data = base64.b64decode(record["data"])
    return {"version": version, "type": _schema_type_name(record["type"]), "timestamp": 0,
            "data": data.decode("utf-8", "replace"), "properties": record.get("properties", {})}


def _sum_stats(stats: list[dict]) -> dict:
    """Partitioned stats: the partitions' figures added up, their publishers and subscriptions merged."""
    total: dict[str, Any] = {"publishers": [], "subscriptions": {}}
    for part in stats:
        for key, value in part.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
            elif key not in total:
                total[key] = value
        total["publishers"].extend(part["publishers"])
        for name, sub in part["subscriptions"].items():
            merged = total["subscriptions"].get(name)
            if merged is None:
                total["subscriptions"][name] = dict(sub, consumers=list(sub["consumers"]))
                continue
            for key, value in sub.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    merged[key] = merged.get(key, 0) + value
            merged["consumers"] += sub["consumers"]
    return total
