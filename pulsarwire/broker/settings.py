"""Every setting of the embedded broker, declared once: its name (the `Broker(...)` keyword),
default and, where `pulsarwire broker` has one, its flag and help. The server, the Pulsar and
V1 front ends and the core read a `BrokerSettings`; cli.py makes its flags from the fields.

A new limit is a field here (with `option(...)` for a flag) and the code that reads it.
"""
from __future__ import annotations

import builtins
import dataclasses
import ssl
from typing import Any, Callable

from .. import codec
from .storage import (DEFAULT_MAX_CACHE_BYTES, DEFAULT_PAGE_CACHE_BYTES, SYNC_ALWAYS, SYNC_INTERVAL, SYNC_NEVER,
                      FileOps)

DEFAULT_MAX_CONNECTIONS = 1000  # per protocol, lowered to fit the descriptor limit when not given
# output unsent to every Pulsar connection together, when no memory budget says otherwise
DEFAULT_MAX_TOTAL_OUTPUT_BYTES = 192 * 1024 * 1024
MiB = 1024 * 1024

# metadata keys of a field
FLAG = "flag"  # the `pulsarwire broker` flag, e.g. "--max-connections"
ARGUMENT = "argument"  # the rest of its argparse.add_argument keywords
FROM_FLAG = "from_flag"  # the parsed value -> the setting


def setting(default: Any) -> Any:
    """A setting that is a `Broker(...)` keyword alone, without a flag."""
    return dataclasses.field(default=default)


def option(default: Any, help: str | None = None, *, flag: str | None = None, type: Callable | None = None,
           cli_default: Any = dataclasses.MISSING, from_flag: Callable[[Any], Any] | None = None,
           **argument: Any) -> Any:
    """A setting with a `pulsarwire broker` flag: by default the field's name with dashes, parsed
    as the default's type, defaulting to the same default. `cli_default`: the flag's default where
    the command's differs from the keyword's; `from_flag`: what makes the setting of the parsed
    value; `argument`: more argparse keywords (metavar, action, choices)."""
    if type is None and isinstance(default, (int, float)) and not isinstance(default, bool):
        type = builtins.type(default)
    if type is not None:
        argument["type"] = type
    if help is not None:
        argument["help"] = help
    argument["default"] = default if cli_default is dataclasses.MISSING else cli_default
    return dataclasses.field(default=default, metadata={FLAG: flag or "", ARGUMENT: argument, FROM_FLAG: from_flag})



def _negative_off(port: int) -> int | None:
    return None if port < 0 else port


def _repeated(value: list[str] | None) -> tuple[str, ...]:
    return tuple(value or ())


def _basic_credentials(specs: list[str] | None) -> dict[str, str] | None:
    return dict(spec.partition(":")[::2] for spec in specs) if specs else None


def _listeners(specs: list[str]) -> dict[str, str] | None:
    return dict(spec.partition("=")[::2] for spec in specs) or None


def _grants(specs: list[str] | None) -> dict[str, set[str]] | None:
    if specs is None:
        return None
    grants: dict[str, set[str]] = {}
    for spec in specs:
        namespace, _, role = spec.partition("=")
        grants.setdefault(namespace, set()).add(role)
    return grants


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerSettings:
    # listeners (0: a free port; None, or -1 on the command line: off)
    host: str = option("127.0.0.1", "address to bind (default loopback)")
    port: int | None = option(0, "plaintext Pulsar port (-1 to disable; needs --tls-port)", cli_default=6650,
                              from_flag=_negative_off)
    http_port: int | None = option(None, "admin REST API, HTTP lookup and /metrics port (-1 to disable; default 8080)",
                                   type=int, cli_default=8080, from_flag=_negative_off)
    max_http_connections: int | None = option(
        None, "HTTP connections open at once; past it one is answered 503 (default 256)", type=int, metavar="N")
    tls_port: int | None = option(None, "Pulsar over TLS port (needs --tls-cert-file and --tls-key-file)", type=int)
    ssl_context: ssl.SSLContext | None = setting(None)  # the command makes it of its --tls-* files
    v1_port: int | None = option(0, "V1 text protocol port (-1 to disable)", cli_default=6680, from_flag=_negative_off)
    advertised_url: str | None = setting(None)  # what lookups answer, e.g. a proxy in front of the broker
    advertised_listeners: dict[str, str] | None = option(
        None, "a listener clients name in lookups (listener_name), answered with URL "
              "(pulsar://host:port or pulsar+ssl://host:port; repeatable)",
        flag="--advertised-listener", action="append", cli_default=[], metavar="NAME=URL", from_flag=_listeners)
    tenants: tuple[str, ...] = option(
        (), "a tenant topics may be made in, besides public and pulsar and those of stored "
            "topics (repeatable; a topic of another tenant is not found, as in Pulsar)",
        flag="--tenant", action="append", cli_default=[], metavar="NAME", from_flag=_repeated)

    # authentication and authorization
    auth_tokens: set[str] | None = option(
        None, "accepted token (repeatable; enables auth; an empty token is refused)",
        flag="--auth-token", action="append", metavar="AUTH_TOKEN",
        from_flag=lambda tokens: None if tokens is None else set(tokens))
    auth_basic: dict[str, str] | None = option(
        None, "accepted basic credentials (repeatable; enables auth)",
        action="append", metavar="USER:PASSWORD", from_flag=_basic_credentials)
    auth_tls: bool = setting(False)  # accept client certificates; the command's --tls-trust-certs-file
    anonymous_role: str | None = option(
        None, "with auth on, the role of a client offering no credentials (or credentials of a "
              "method this broker does not serve) instead of refusing it (Pulsar's anonymousUserRole)",
        metavar="ROLE", from_flag=lambda role: role or None)
    grants: dict[str, set[str]] | None = option(
        None, "turns authorization on: a role may look up, produce and consume only in the "
              "namespaces granted to it (repeatable; needs auth)",
        flag="--grant", action="append", metavar="TENANT/NAMESPACE=ROLE", from_flag=_grants)
    super_user_roles: tuple[str, ...] = option(
        (), "a role authorized on every namespace (repeatable)",
        flag="--super-user-role", action="append", cli_default=[], metavar="ROLE", from_flag=_repeated)

    # storage and the domain
    deduplication: bool = option(
        False, "drop a send whose sequence id is not above its producer's last one, in namespaces "
               "and topics without a deduplication policy of their own (default off, as Pulsar's "
               "brokerDeduplicationEnabled)", action="store_true")
    sync_policy: str = option(SYNC_INTERVAL, choices=[SYNC_ALWAYS, SYNC_INTERVAL, SYNC_NEVER])
    sync_interval: float = setting(1.0)  # seconds between fsyncs with sync_policy "interval"
    segment_bytes: int = setting(64 * MiB)
    default_partitions: int = setting(0)
    file_ops: FileOps | None = setting(None)  # the file operations storage calls (tests inject faults)
    max_open_files: int | None = option(
        None, "most segment files open at once; idle ones are closed and reopened on "
              "demand (default: a quarter of the descriptor limit, 16 to 1024)", type=int, metavar="N")
    max_cache_bytes: int = option(
        DEFAULT_MAX_CACHE_BYTES, "recently written entries kept in memory, all topics together; past it the "
        "least recently used topic's oldest are dropped and read from disk (default 64 MiB)", metavar="BYTES")
    page_cache_bytes: int = option(
        DEFAULT_PAGE_CACHE_BYTES, "page cache each topic's appends keep behind its end once written back: older "
        "pages are given back to the OS, and readers of what is past the entry cache "
        "read ahead from disk in large reads (0: keep everything cached; default 16 MiB)", metavar="BYTES")
    # as Pulsar's maxUnackedMessagesPerConsumer (each unacknowledged entry costs about 200 bytes to track)
    max_unacked_messages_per_consumer: int = option(
        50_000, "a consumer of a Shared or Key_Shared subscription holding this many "
                "unacknowledged messages gets no more until it acknowledges half, as Pulsar's "
                "maxUnackedMessagesPerConsumer (0: no limit; default 50 000)", metavar="N")
    topic_idle_timeout: float = option(
        600.0, "a topic without producers, consumers or readers this long is closed (its "
               "files and memory given back) until it is used again (default 600)", metavar="SECONDS")

    # V1
    replication_factor: int = option(3)
    min_insync_replicas: int = option(2)
    v1_partitions: int = option(3, "partitions of a topic V1 creates")
    replication_timeout: float = option(5.0, "how long a V1 acks=all produce waits for the in-sync replicas",
                                        metavar="SECONDS")
    replica_lag_time: float = option(10.0, "a V1 replica silent this long leaves the ISR", metavar="SECONDS")
    session_timeout: float = option(10.0, "a V1 group member silent this long is removed", metavar="SECONDS")
    v1_max_connections_per_address: int = option(
        100, "V1 connections one client address may hold at once; more are refused (default 100)", metavar="N")
    v1_max_total_output_bytes: int = option(
        256 * MiB, "unsent V1 replies of all connections together before connections holding some "
                   "are answered no more until they fall (default 256 MiB)", metavar="BYTES")
    v1_consume_max_bytes: int = option(8 * MiB, "most record bytes in one V1 CONSUME reply (default 8 MiB)",
                                       metavar="BYTES")

    # what one client can make the broker hold (the Pulsar port's; V1's where said)
    max_message_size: int = setting(codec.DEFAULT_MAX_MESSAGE_SIZE)
    keep_alive_interval: float = setting(30.0)  # a connection silent for twice this is closed
    max_connections: int | None = option(
        None, "connections served at once per protocol (Pulsar, V1); more are refused (default "
              "1000, lowered to fit the descriptor limit beside --max-open-files)", type=int)
    max_output_bytes: int = option(
        4 * MiB, "unsent output per connection before the broker stops dispatching to it and "
                 "reading from it (V1: answering it) (default 4 MiB)", metavar="BYTES")
    handshake_timeout: float = option(
        10.0, "a connection without an accepted CONNECT (V1: a successful AUTH with --auth-token, "
              "else a valid request) this long is closed (default 10)", metavar="SECONDS")
    max_frame_before_connect: int = option(64 * 1024, "largest frame before CONNECT is accepted (default 64 KiB)",
                                           metavar="BYTES")
    max_input_bytes: int = option(
        256 * MiB, "unfinished frames held across all connections before the broker stops "
                   "reading from those adding to them (default 256 MiB)", metavar="BYTES")
    frame_timeout: float = option(
        30.0, "a frame (V1: a request line) still incomplete after this long closes its "
              "connection; so does a V1 client taking none of its replies this long (default 30)", metavar="SECONDS")
    max_connections_per_address: int | None = option(
        None, "Pulsar connections one client address may hold (default: half of "
              "--max-connections, at least 8)", type=int, metavar="N")
    authenticated_share: float = option(
        0.25, "share of --max-connections kept for Pulsar connections past CONNECT "
              "(authenticated, with auth on): connections before it hold the rest (default 0.25)", metavar="FRACTION")
    idle_timeout: float = option(
        300.0, "a Pulsar connection with no producer or consumer that makes no request but "
               "PING this long is closed (default 300)", metavar="SECONDS")
    memory_budget: int | None = option(
        None, "unsent output of all Pulsar connections plus the entry cache (--max-cache-bytes); "
              "past it, connections holding output get no more until they take it (default: "
              "--max-cache-bytes plus 192 MiB, 256 MiB in all)", type=int, metavar="BYTES")

    @property
    def connection_limit(self) -> int:
        """Connections each protocol serves at once, before the descriptor limit lowers a default."""
        return DEFAULT_MAX_CONNECTIONS if self.max_connections is None else self.max_connections

    @property
    def max_total_output_bytes(self) -> int:
        """What the entry cache leaves of the memory budget: the unsent output of all Pulsar connections."""
        if self.memory_budget is None:
            return DEFAULT_MAX_TOTAL_OUTPUT_BYTES
        return self.memory_budget - self.max_cache_bytes

    @classmethod
    def of(cls, settings: BrokerSettings | None, keywords: dict[str, Any]) -> BrokerSettings:
        """`settings` (default: the defaults) with the settings named in `keywords` replaced."""
        if settings is None:
            return cls(**keywords)
        return dataclasses.replace(settings, **keywords) if keywords else settings


def flags() -> list[dataclasses.Field]:
    """The fields `pulsarwire broker` has a flag for, in declaration order."""
    return [field for field in dataclasses.fields(BrokerSettings) if ARGUMENT in field.metadata]


def flag_name(field: dataclasses.Field) -> str:
    return field.metadata[FLAG] or "--" + field.name.replace("_", "-")


def from_flags(values: dict[str, Any]) -> dict[str, Any]:
    """The settings of parsed flag values (by field name)."""
    settings = {}
    for field in flags():
        value = values[field.name]
        convert = field.metadata[FROM_FLAG]
        settings[field.name] = convert(value) if convert is not None else value
    return settings
