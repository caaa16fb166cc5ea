"""The official client's keyword arguments, one table per call: `Client(...)` (`CLIENT`),
`create_producer` (`PRODUCER`), `subscribe` (`CONSUMER`) and `create_reader` (`READER`).

Each official option is declared once, as an `Option`: its name and default (in the official
order, so positional calls bind as they do officially), how the official client checks it, and
which keyword of the asyncio client it becomes. The two drop-in surfaces (`pulsarwire.sync`,
`pulsarwire.asyncio`) make their methods from these tables with `Surface.method`, so their
signatures are the official ones; `Surface.translate` turns the values a call got into the
asyncio client's keywords. Both run when a client, producer, consumer or reader is made, never
per message (send and receive options stay in `official.py`).

A new official option is one row here, plus what it does in the asyncio client (`client/`).
"""
from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable as _CallableType
from dataclasses import dataclass
from typing import Any, Callable, Literal, TypeVar

from . import client as aio
from .official import (
    Authentication, BatchingType, CompressionType, ConsumerBatchReceivePolicy, ConsumerCryptoFailureAction,
    ConsumerDeadLetterPolicy, ConsumerKeySharedPolicy, ConsumerType, InitialPosition, OfficialEnum,
    PartitionsRoutingMode, ProducerAccessMode, RegexSubscriptionMode, Unsupported, accept, check_type,
    check_type_or_none, is_default_schema,
)
from .routing import HashingScheme, RoutingMode

Facade = Literal["sync", "asyncio"]
R = TypeVar("R")
_SAME: Any = object()  # an asyncio default that is the sync one


@dataclass(frozen=True)
class Option:
    """One official keyword argument.

    `kind`: the type the official client checks the value against (None: not checked); an enum
    kind also takes the official module's enum and is converted to pulsarwire's. `optional`: None
    is taken too. `to`: the asyncio client's keyword (None: the same name); `passed=False`: checked
    only (ignored, or used by the surface itself). `when`: passed on only when it holds for the
    value; `convert`: what is passed on. `only`: the one surface that offers it."""

    name: str
    default: Any
    kind: type | None = None
    optional: bool = False
    to: str | None = None
    passed: bool = True
    when: Callable[[Any], bool] | None = None
    convert: Callable[[Any], Any] | None = None
    only: Facade | None = None
    asyncio_default: Any = _SAME
    annotation: Any = None  # shown in the signature; by default the kind's

    def default_for(self, facade: Facade) -> Any:
        return self.default if facade == "sync" or self.asyncio_default is _SAME else self.asyncio_default

    def checker(self) -> Callable[[Any], Any] | None:
        """What checks a value as the official client does and gives the value to use (None: no check)."""
        kind, name = self.kind, self.name
        if kind is None:
            return None
        if issubclass(kind, OfficialEnum):
            enum_kind = kind
            return lambda value: accept(enum_kind, value, name)
        check = check_type_or_none if self.optional else check_type

        def checked(value: Any) -> Any:
            check(kind, value, name)
            return value
        return checked

    def signature_annotation(self) -> Any:
        if self.annotation is not None or self.kind is None:
            return self.annotation
        return self.kind | None if self.optional else self.kind


class Surface:
    """The official keyword arguments of one call, in the official order."""

    def __init__(self, call: str, options: tuple[Option, ...],
                 finish: Callable[..., None] | None = None) -> None:
        self.call = call
        self.options = options
        self._finish = finish
        # per option, what translate() does: (name, default, checker, keyword passed on or None, when, convert)
        self._plan = tuple((option.name, option.default, option.checker(), (option.to or option.name)
                            if option.passed else None, option.when, option.convert) for option in options)

    def offered(self, facade: Facade) -> tuple[Option, ...]:
        return tuple(option for option in self.options if option.only in (None, facade))

    def translate(self, values: dict[str, Any], **context: Any) -> dict[str, Any]:
        """The asyncio client's keywords for the official `values` (an option missing from them
        has its default), each checked as the official client checks it; `context` is what a
        surface's own rules need beyond the options (a consumer's topic)."""
        options: dict[str, Any] = {}
        checked: dict[str, Any] = {}
        for name, default, checker, keyword, when, convert in self._plan:
            value = values.get(name, default)
            if checker is not None:
                value = checker(value)
            checked[name] = value
            if keyword is None or (when is not None and not when(value)):
                continue
            options[keyword] = value if convert is None else convert(value)
        if self._finish is not None:
            self._finish(checked, options, **context)
        return options

    def keywords(self, kwargs: dict[str, Any], facade: Facade) -> dict[str, Any]:
        """`kwargs` taken by a surface that declares `**kwargs` (pulsar.asyncio's Client): an
        unknown name is a TypeError, as for a declared signature."""
        offered = {option.name for option in self.offered(facade)}
        unknown = set(kwargs) - offered
        if unknown:
            raise TypeError(f"{self.call}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        return kwargs

    def method(self, facade: Facade) -> Callable[[Callable[..., R]], Callable[..., R]]:
        """A decorator: `impl(self, *arguments, values)` becomes a method with the official
        signature, `(self, *arguments, <each option `facade` offers>=<its default>)`, that calls
        `impl` with the options' values in one dict. `arguments` are impl's own leading parameters
        (topic, subscription_name, ...)."""
        def make(impl: Callable[..., R]) -> Callable[..., R]:
            return _official_method(impl, self.offered(facade), facade)
        return make


def _official_method(impl: Callable[..., Any], offered: tuple[Option, ...], facade: Facade) -> Callable[..., Any]:
    # generated source, as dataclasses makes __init__: a real signature binds positional and
    # keyword arguments, and refuses bad ones with Python's own TypeError, as a written one does
    parameters = list(inspect.signature(impl).parameters.values())
    own, arguments = parameters[0].name, [parameter.name for parameter in parameters[1:-1]]
    defaults = [f"_default_{index}" for index in range(len(offered))]
    header = ", ".join([own, *arguments, *(f"{option.name}={default}" for option, default in zip(offered, defaults))])
    packed = "{" + ", ".join(f"{option.name!r}: {option.name}" for option in offered) + "}"
    call = f"_impl({', '.join([own, *arguments, packed])})"
    is_async = inspect.iscoroutinefunction(impl)
    source = (f"def _make(_impl, {', '.join(defaults)}):\n"
              f"    {'async ' if is_async else ''}def {impl.__name__}({header}):\n"
              f"        return {'await ' if is_async else ''}{call}\n"
              f"    return {impl.__name__}\n")
    namespace: dict[str, Any] = {}
    # impl's globals: the string annotations copied from impl resolve where they were written
    exec(compile(source, f"<official signature of {impl.__qualname__}>", "exec"), impl.__globals__, namespace)
    method: Callable[..., Any] = namespace["_make"](impl, *(option.default_for(facade) for option in offered))
    method.__qualname__, method.__module__, method.__doc__ = impl.__qualname__, impl.__module__, impl.__doc__
    annotations = {name: impl.__annotations__[name] for name in arguments if name in impl.__annotations__}
    for option in offered:
        annotation = option.signature_annotation()
        if annotation is not None:
            annotations[option.name] = annotation
    if "return" in impl.__annotations__:
        annotations["return"] = impl.__annotations__["return"]
    method.__annotations__ = annotations
    return method


# --- what options become -------------------------------------------------------------------

def _is_set(value: Any) -> bool:
    return value is not None


def _not_default_schema(schema: Any) -> bool:
    return not is_default_schema(schema)


def _unset_if_zero(value: Any) -> Any:
    return value or None  # the official client treats 0 (or "") as "not set", like None


def _at_least_one(value: int) -> int:
    return max(1, value)  # a zero queue (one message at a time) becomes a queue of one: the nearest there is


def _routing_mode(mode: PartitionsRoutingMode) -> RoutingMode:
    return RoutingMode.SinglePartition if mode == PartitionsRoutingMode.UseSinglePartition \
        else RoutingMode.RoundRobinPartition


def _consumer_name(name: str | None) -> str:
    return name or os.urandom(5).hex()  # the official client names an unnamed consumer itself


def _key_shared_policy(policy: ConsumerKeySharedPolicy) -> aio.KeySharedPolicy:
    return aio.KeySharedPolicy(aio.KeySharedMode(int(policy.key_shared_mode)),
                               allow_out_of_order_delivery=policy.allow_out_of_order_delivery,
                               sticky_ranges=policy.sticky_ranges or None)


def _dead_letter_policy(policy: ConsumerDeadLetterPolicy) -> aio.DeadLetterPolicy:
    return aio.DeadLetterPolicy(policy.max_redeliver_count, dead_letter_topic=policy.dead_letter_topic or None,
                                initial_subscription_name=policy.initial_subscription_name or None)


# --- Client(...) ---------------------------------------------------------------------------

CLIENT = Surface("Client", (
    Option("authentication", None, Authentication, optional=True,
           convert=lambda auth: auth.auth if auth is not None else None),
    Option("operation_timeout_seconds", 30, int),
    Option("io_threads", 1, int, passed=False),  # one event loop does all I/O
    Option("message_listener_threads", 1, int, passed=False),  # the blocking surface's listener threads
    Option("concurrent_lookup_requests", 50000, int, passed=False),
    Option("log_conf_file_path", None, str, optional=True, passed=False),
    Option("stats_interval_in_seconds", 600, int, passed=False),
    Option("use_tls", False, bool, passed=False),  # the service URL's scheme says it
    Option("tls_trust_certs_file_path", None, str, optional=True),
    Option("tls_allow_insecure_connection", False, bool),
    Option("tls_validate_hostname", False, bool),
    Option("logger", None, passed=False),  # pulsarwire logs to the `pulsarwire` logging logger
    Option("connection_timeout_ms", 10000, int),
    # features the asyncio client may lack: passed only when asked for, so a missing one fails loudly
    Option("listener_name", None, str, optional=True, when=bool),
    Option("tls_private_key_file_path", None, str, optional=True, when=bool),
    Option("tls_certificate_file_path", None, str, optional=True, when=bool),
))


# --- create_producer(...) ------------------------------------------------------------------

def _finish_producer(values: dict[str, Any], options: dict[str, Any]) -> None:
    if values["encryption_key"] or values["crypto_key_reader"] is not None:
        raise Unsupported("pulsarwire does not encrypt messages (encryption_key, crypto_key_reader)")
    if values["batching_max_messages"] <= 1:
        raise ValueError("batchingMaxMessages needs to be greater than 1")
    if values["batching_enabled"] and values["chunking_enabled"]:
        raise ValueError("Batching and chunking of messages can't be enabled together.")
    options["hashing_scheme"] = HashingScheme.BoostHash  # the official client's key hash


PRODUCER = Surface("create_producer", (
    Option("producer_name", None, str, optional=True),
    Option("schema", None, when=_not_default_schema),
    Option("initial_sequence_id", None, int, optional=True, convert=_unset_if_zero),
    Option("send_timeout_millis", 30000, int, convert=lambda ms: max(0, ms)),  # 0 (or less): no send timeout
    Option("compression_type", CompressionType.NONE, CompressionType, convert=int),
    Option("max_pending_messages", 1000, int),
    Option("max_pending_messages_across_partitions", 50000, int),  # taken by create_producer() below
    Option("block_if_queue_full", False, bool),
    Option("batching_enabled", False, bool, asyncio_default=True),  # pulsar.asyncio batches by default
    Option("batching_max_messages", 1000, int),
    Option("batching_max_allowed_size_in_bytes", 128 * 1024, int),
    Option("batching_max_publish_delay_ms", 10, int),
    Option("chunking_enabled", False, bool),
    Option("message_routing_mode", PartitionsRoutingMode.RoundRobinDistribution, PartitionsRoutingMode,
           convert=_routing_mode),
    Option("lazy_start_partitioned_producers", False, bool, when=bool),
    Option("properties", None, dict, optional=True),
    Option("batching_type", BatchingType.Default, BatchingType, passed=False),  # one batch for all keys
    Option("encryption_key", None, passed=False, annotation=str | None),  # refused when set: _finish_producer
    Option("crypto_key_reader", None, passed=False),
    Option("access_mode", ProducerAccessMode.Shared, ProducerAccessMode, convert=int),
    Option("message_router", None, when=_is_set, annotation=_CallableType | None),
), _finish_producer)

_UNBOUNDED_PENDING = 1_000_000  # both official bounds 0 ("no limit"): a million messages


async def create_producer(client: aio.Client, topic: str, options: dict[str, Any]) -> aio.Producer:
    """A producer from `PRODUCER.translate`. The official bound on pending messages is per partition,
    capped across all of them; pulsarwire has one bound for the whole producer: the product, capped."""
    options = dict(options)
    across = options.pop("max_pending_messages_across_partitions")
    per_partition = options["max_pending_messages"]
    partitions = len(await client.get_topic_partitions(topic))
    # 0 means "no limit" to the official client; pulsarwire keeps a bound: the cap across partitions
    bounds = [bound for bound in (per_partition * partitions, across) if bound > 0]
    options["max_pending_messages"] = min(bounds) if bounds else _UNBOUNDED_PENDING
    return await client.create_producer(topic, **options)


# --- subscribe(...) ------------------------------------------------------------------------

def _finish_consumer(values: dict[str, Any], options: dict[str, Any], topic: Any = None) -> None:
    timeout = values["unacked_messages_timeout_ms"]
    if timeout and timeout < 10_000:
        raise ValueError("Consumer Config Exception: Unacknowledged message timeout should be greater than "
                         "10 seconds.")
    if values["crypto_key_reader"] is not None:
        raise Unsupported("pulsarwire does not decrypt messages (crypto_key_reader)")
    if isinstance(topic, re.Pattern):  # what only a pattern subscription takes
        options["pattern_auto_discovery_period"] = values["pattern_auto_discovery_period"]
        options["regex_subscription_mode"] = int(values["regex_subscription_mode"])


CONSUMER = Surface("subscribe", (
    Option("consumer_type", ConsumerType.Exclusive, ConsumerType, convert=int),
    Option("schema", None, when=_not_default_schema),
    Option("message_listener", None, passed=False, only="sync"),  # run by the blocking surface's threads
    Option("receiver_queue_size", 1000, int, convert=_at_least_one),
    Option("max_total_receiver_queue_size_across_partitions", 50000, int, passed=False),
    Option("consumer_name", None, str, optional=True, convert=_consumer_name),
    Option("unacked_messages_timeout_ms", None, int, optional=True, convert=_unset_if_zero),
    Option("broker_consumer_stats_cache_time_ms", 30000, int, passed=False),
    Option("negative_ack_redelivery_delay_ms", 60000, int),
    Option("is_read_compacted", False, bool, to="read_compacted"),
    Option("properties", None, dict, optional=True),
    Option("pattern_auto_discovery_period", 60, int, passed=False, only="sync"),  # _finish_consumer
    Option("initial_position", InitialPosition.Latest, InitialPosition, convert=int),
    Option("crypto_key_reader", None, passed=False),  # refused when set: _finish_consumer
    Option("replicate_subscription_state_enabled", False, when=bool, annotation=bool),
    Option("max_pending_chunked_message", 10, int),
    Option("auto_ack_oldest_chunked_message_on_queue_full", False, bool, when=bool),
    Option("start_message_id_inclusive", False, bool, when=bool),
    Option("batch_receive_policy", None, ConsumerBatchReceivePolicy, optional=True, passed=False),
    Option("key_shared_policy", None, ConsumerKeySharedPolicy, optional=True, when=_is_set,
           convert=_key_shared_policy),
    Option("batch_index_ack_enabled", False, bool),
    Option("regex_subscription_mode", RegexSubscriptionMode.PersistentOnly, RegexSubscriptionMode,
           passed=False),  # _finish_consumer
    Option("dead_letter_policy", None, ConsumerDeadLetterPolicy, optional=True, when=_is_set,
           convert=_dead_letter_policy),
    Option("crypto_failure_action", ConsumerCryptoFailureAction.FAIL, passed=False),  # nothing is encrypted
    Option("is_pattern_topic", False, passed=False, only="asyncio", annotation=bool),  # read by the surface
), _finish_consumer)


# --- create_reader(...) --------------------------------------------------------------------

def _finish_reader(values: dict[str, Any], options: dict[str, Any]) -> None:
    if values["crypto_key_reader"] is not None:
        raise Unsupported("pulsarwire does not decrypt messages (crypto_key_reader)")


READER = Surface("create_reader", (
    Option("schema", None, when=_not_default_schema),
    Option("reader_listener", None, passed=False, only="sync"),
    Option("receiver_queue_size", 1000, int, convert=_at_least_one),
    Option("reader_name", None, str, optional=True),
    Option("subscription_role_prefix", None, str, optional=True, when=bool),
    Option("is_read_compacted", False, bool, to="read_compacted", when=bool),
    Option("crypto_key_reader", None, passed=False),  # refused when set: _finish_reader
    Option("start_message_id_inclusive", False, bool),
    Option("crypto_failure_action", ConsumerCryptoFailureAction.FAIL, passed=False),
), _finish_reader)
