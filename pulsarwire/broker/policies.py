"""Tenants, namespaces and the policies set on them or on single topics, as Pulsar keeps them:
deduplication and the schema compatibility strategy. A topic's policy is its own if set, else
its namespace's, else the broker's default. Kept in `policies.json` in the data dir.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Callable

from . import metafile
from .metafile import LOST, PREVIOUS_COPY, MetadataWriter, report_damage

POLICIES_FILE = "policies.json"
DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "public/default"
# what Pulsar's standalone cluster is called; tenants list it as their allowed cluster
CLUSTER = "standalone"

# Pulsar's SchemaCompatibilityStrategy values; UNDEFINED means "the broker's default"
SCHEMA_STRATEGIES = ("UNDEFINED", "ALWAYS_INCOMPATIBLE", "ALWAYS_COMPATIBLE", "BACKWARD", "FORWARD", "FULL",
                     "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE")
DEFAULT_SCHEMA_STRATEGY = "BACKWARD"  # Pulsar's schemaCompatibilityStrategy default
MAX_TENANTS = 1_000
MAX_NAMESPACES = 10_000
MAX_TOPIC_POLICIES = 100_000


class PolicyError(ValueError):
    """A policy change the broker refuses; `status` is the HTTP status Pulsar answers it with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def namespace_of(topic: str) -> str:
    """`tenant/namespace` of a full topic name (`persistent://tenant/namespace/topic`)."""
    path = topic.split("://", 1)[1] if "://" in topic else topic
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) >= 3 else ""


def parent_topic(topic: str) -> str:
    """The partitioned topic a partition belongs to (its policies are the parent's), else `topic`."""
    base, marker, index = topic.rpartition("-partition-")
    return base if marker and index.isdigit() else topic


class Policies:
    """The broker's tenants and namespaces and their policies, changed by the admin API.

    `changed()` is called after each change, so the broker can apply it to open topics."""

    def __init__(self, data_dir: str, writer: MetadataWriter, *, deduplication: bool = False,
                 schema_compatibility_strategy: str = DEFAULT_SCHEMA_STRATEGY) -> None:
        if schema_compatibility_strategy not in SCHEMA_STRATEGIES[1:]:
            raise ValueError(f"schema_compatibility_strategy must be one of {', '.join(SCHEMA_STRATEGIES[1:])}")
        self.path = os.path.join(data_dir, POLICIES_FILE)
        self.writer = writer  # writes off the event loop, atomically, keeping the previous copy
        self.default_deduplication = deduplication
        self.default_schema_strategy = schema_compatibility_strategy
        self.tenants: dict[str, dict[str, Any]] = {}
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.topics: dict[str, dict[str, Any]] = {}
        self.changed: Callable[[], None] = lambda: None
        self._write_lock: asyncio.Lock | None = None

    def load(self) -> None:
        loaded = metafile.load(self.path, metafile.expect(dict))
        if loaded.source == PREVIOUS_COPY:
            report_damage(loaded, "the tenants, namespaces and their policies", "restored from the previous copy")
        elif loaded.source == LOST:
            report_damage(loaded, "the tenants, namespaces and their policies",
                          "lost (no good copy): the broker's defaults apply until they are set again")
        state = loaded.data or {}
        self.tenants = state.get("tenants", {})
        self.namespaces = state.get("namespaces", {})
        self.topics = state.get("topics", {})
        self.tenants.setdefault(DEFAULT_TENANT, {"adminRoles": [], "allowedClusters": [CLUSTER]})
        self.namespaces.setdefault(DEFAULT_NAMESPACE, {})

    async def save(self) -> None:
        """Write the policies on a worker thread (the event loop never waits on the disk), one
        write at a time so that the last change is the one on disk; StorageError if refused."""
        if self._write_lock is None:
            self._write_lock = asyncio.Lock()
        async with self._write_lock:
            # the writer encodes the data when called: later changes do not leak into this write
            state = {"tenants": self.tenants, "namespaces": self.namespaces, "topics": self.topics}
            await asyncio.wrap_future(self.writer.write(self.path, state))
        self.changed()

    # what a topic gets

    def deduplication(self, topic: str) -> bool:
        """Whether the broker drops a send whose sequence id is not above its producer's last one."""
        value = self.topics.get(parent_topic(topic), {}).get("deduplicationEnabled")
        if value is None:
            value = self.namespaces.get(namespace_of(topic), {}).get("deduplicationEnabled")
        return self.default_deduplication if value is None else bool(value)

    def schema_strategy(self, topic: str) -> str:
        value = self.topics.get(parent_topic(topic), {}).get("schemaCompatibilityStrategy")
        if value in (None, "UNDEFINED"):
            value = self.namespaces.get(namespace_of(topic), {}).get("schemaCompatibilityStrategy")
        return self.default_schema_strategy if value in (None, "UNDEFINED") else value

    # tenants and namespaces

    def create_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        _check_segment(tenant, "tenant")
        if tenant in self.tenants:
            raise PolicyError(f"tenant {tenant} already exists", 409)
        if len(self.tenants) >= MAX_TENANTS:
            raise PolicyError(f"at most {MAX_TENANTS} tenants", 412)
        self.tenants[tenant] = {"adminRoles": list(info.get("adminRoles") or []),
                                "allowedClusters": list(info.get("allowedClusters") or [CLUSTER])}

    def update_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        self.tenant(tenant)
        self.tenants[tenant] = {"adminRoles": list(info.get("adminRoles") or []),
                                "allowedClusters": list(info.get("allowedClusters") or [CLUSTER])}

    def tenant(self, tenant: str) -> dict[str, Any]:
        if tenant not in self.tenants:
            raise PolicyError(f"tenant {tenant} does not exist", 404)
        return self.tenants[tenant]

    def delete_tenant(self, tenant: str) -> None:
        self.tenant(tenant)
        if any(ns.split("/", 1)[0] == tenant for ns in self.namespaces):
            raise PolicyError(f"tenant {tenant} still has namespaces", 409)
        del self.tenants[tenant]

    def create_namespace(self, namespace: str, policies: dict[str, Any] | None = None) -> None:
        tenant, _, name = namespace.partition("/")
        _check_segment(name, "namespace")
        self.tenant(tenant)
        if namespace in self.namespaces:
            raise PolicyError(f"namespace {namespace} already exists", 409)
        if len(self.namespaces) >= MAX_NAMESPACES:
            raise PolicyError(f"at most {MAX_NAMESPACES} namespaces", 412)
        self.namespaces[namespace] = {}
        for key in ("deduplicationEnabled", "schemaCompatibilityStrategy"):
            if policies and policies.get(key) is not None:
                self.set_namespace_policy(namespace, key, policies[key])

    def namespace(self, namespace: str) -> dict[str, Any]:
        if namespace not in self.namespaces:
            raise PolicyError(f"namespace {namespace} does not exist", 404)
        return self.namespaces[namespace]

    def delete_namespace(self, namespace: str) -> None:
        self.namespace(namespace)
        del self.namespaces[namespace]
        for topic in [t for t in self.topics if namespace_of(t) == namespace]:
            del self.topics[topic]

    def set_namespace_policy(self, namespace: str, key: str, value: object) -> None:
        policies = self.namespace(namespace)
        value = _checked(key, value)
        if value is None:
            policies.pop(key, None)
        else:
            policies[key] = value

    def set_topic_policy(self, topic: str, key: str, value: object) -> None:
        value = _checked(key, value)
        policies = self.topics.get(topic)
        if value is None:
            if policies is not None:
                policies.pop(key, None)
                if not policies:
                    del self.topics[topic]
            return
        if policies is None:
            if len(self.topics) >= MAX_TOPIC_POLICIES:
                raise PolicyError(f"at most {MAX_TOPIC_POLICIES} topics with policies of their own", 412)
            policies = self.topics[topic] = {}
        policies[key] = value

    def topic_policy(self, topic: str, key: str) -> Any:
        return self.topics.get(topic, {}).get(key)


def _checked(key: str, value: object) -> bool | str | None:
    """The value a policy may be set to (None: removed), else PolicyError."""
    if value is None:
        return None
    if key == "deduplicationEnabled":
        if not isinstance(value, bool):
            raise PolicyError("deduplication must be true or false")
        return value
    if key == "schemaCompatibilityStrategy":
        if not isinstance(value, str) or value.upper() not in SCHEMA_STRATEGIES:
            raise PolicyError(f"schema compatibility strategy must be one of {', '.join(SCHEMA_STRATEGIES)}")
        return None if value.upper() == "UNDEFINED" else value.upper()
    raise PolicyError(f"unknown policy {key}")


def _check_segment(name: str, what: str) -> None:
    if not name or len(name) > 128 or not all(ch.isalnum() or ch in "-_.=:" for ch in name) or name in (".", ".."):
        raise PolicyError(f"invalid {what} name {name[:64]!r}: letters, digits and -_.=: only, at most 128", 412)
