"""The official Python client's (`pulsar-client` 3.x) names over pulsarwire's own, shared by
the two drop-in surfaces: `pulsarwire.sync` (used as `pulsar`) and `pulsarwire.asyncio` (used
as `pulsar.asyncio`).

It owns: the enums with the official members and values; `Result` and the table from pulsarwire
errors to official results (each official exception class is also a subclass of the pulsarwire
error it stands for, so both `except pulsar.Timeout` and `except pulsarwire.TimeoutError` work);
`MessageId` with the official constructor and accessor methods; `Message`; the consumer policies;
the authentication classes; the official argument checks, and the translation of a send's
keyword arguments (those of making a client, producer, consumer or reader: `official_options`).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import json
import pathlib
import re
from datetime import timedelta
from typing import Any, Callable, Iterable, TypeVar

from . import client as aio
from . import errors
from . import messages


_E = TypeVar("_E", bound="OfficialEnum")


# --- enums -----------------------------------------------------------------------------

class OfficialEnum(enum.IntEnum):
    """An int enum that prints as the official client's (`Result.Ok`, not `0`)."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    @classmethod
    def _missing_(cls, value: Any) -> OfficialEnum | None:
        # the official module's enum of the same name (a partly switched program passes it)
        if is_official(value, cls.__name__):
            return cls.__members__.get(value.name)
        return None


class Result(OfficialEnum):
    """The outcome of an operation, as the official client numbers it."""

    Ok = 0
    UnknownError = 1
    InvalidConfiguration = 2
    Timeout = 3
    LookupError = 4
    ConnectError = 5
    ReadError = 6
    AuthenticationError = 7
    AuthorizationError = 8
    ErrorGettingAuthenticationData = 9
    BrokerMetadataError = 10
    BrokerPersistenceError = 11
    ChecksumError = 12
    ConsumerBusy = 13
    NotConnected = 14
    AlreadyClosed = 15
    InvalidMessage = 16
    ConsumerNotInitialized = 17
    ProducerNotInitialized = 18
    ProducerBusy = 19
    TooManyLookupRequestException = 20
    InvalidTopicName = 21
    InvalidUrl = 22
    ServiceUnitNotReady = 23
    OperationNotSupported = 24
    ProducerBlockedQuotaExceededError = 25
    ProducerBlockedQuotaExceededException = 26
    ProducerQueueIsFull = 27
    MessageTooBig = 28
    TopicNotFound = 29
    SubscriptionNotFound = 30
    ConsumerNotFound = 31
    UnsupportedVersionError = 32
    TopicTerminated = 33
    CryptoError = 34
    IncompatibleSchema = 35
    ConsumerAssignError = 36
    CumulativeAcknowledgementNotAllowedError = 37
    TransactionCoordinatorNotFoundError = 38
    InvalidTxnStatusError = 39
    NotAllowedError = 40
    TransactionConflict = 41
    TransactionNotFound = 42
    ProducerFenced = 43
    MemoryBufferIsFull = 44
    Interrupted = 45


RESULT_NAMES = tuple(result.name for result in Result)

# what the official client's C++ library calls a result in its error messages (strResult), where
# that differs from the result's name
_RESULT_TEXT = {
    Result.Timeout: "TimeOut",
    **{result: f"Result{result.name}" for result in (
        Result.ConsumerAssignError, Result.CumulativeAcknowledgementNotAllowedError,
        Result.TransactionCoordinatorNotFoundError, Result.InvalidTxnStatusError, Result.NotAllowedError,
        Result.TransactionConflict, Result.TransactionNotFound, Result.ProducerFenced, Result.MemoryBufferIsFull,
        Result.Interrupted)},
}


def error_text(result: Result) -> str:
    """The message of an official exception: `Pulsar error: TimeOut`."""
    return "Pulsar error: " + _RESULT_TEXT.get(result, result.name)


def is_official(value: object, class_name: str | None = None) -> bool:
    """Whether `value` is an object of the official module (`pulsar`, `_pulsar`), of the class
    named `class_name` when given: pulsarwire takes those where they mean the same thing."""
    cls = type(value)
    module = cls.__module__.split(".")[0]
    return module in ("pulsar", "_pulsar") and (class_name is None or cls.__name__ == class_name)


class CompressionType(OfficialEnum):
    NONE = 0
    LZ4 = 1
    ZLib = 2
    ZSTD = 3
    SNAPPY = 4


class ConsumerType(OfficialEnum):
    Exclusive = 0
    Shared = 1
    Failover = 2
    KeyShared = 3


class InitialPosition(OfficialEnum):
    Latest = 0
    Earliest = 1


class PartitionsRoutingMode(OfficialEnum):
    UseSinglePartition = 0
    RoundRobinDistribution = 1
    CustomPartition = 2


class BatchingType(OfficialEnum):
    Default = 0
    KeyBased = 1


class KeySharedMode(OfficialEnum):
    AutoSplit = 0
    Sticky = 1


class ProducerAccessMode(OfficialEnum):
    Shared = 0
    Exclusive = 1
    WaitForExclusive = 2
    ExclusiveWithFencing = 3


class RegexSubscriptionMode(OfficialEnum):
    PersistentOnly = 0
    NonPersistentOnly = 1
    AllTopics = 2


class ConsumerCryptoFailureAction(OfficialEnum):
    FAIL = 0
    DISCARD = 1
    CONSUME = 2


class LoggerLevel(OfficialEnum):
    Debug = 0
    Info = 1
    Warn = 2
    Error = 3

# --- errors ----------------------------------------------------------------------------

def _pulsarwire_error(*names: str) -> type[BaseException] | None:
    """The first of `names` that pulsarwire.errors defines (some typed errors may not exist yet)."""
    for name in names:
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            return cls
    return None


#: official result name -> the pulsarwire error class it stands for (None: pulsarwire has none).
PULSARWIRE_ERRORS: dict[str, type[BaseException] | None] = {
    "UnknownError": _pulsarwire_error("UnknownServerError"),
    "Timeout": _pulsarwire_error("TimeoutError"),
    "ConnectError": _pulsarwire_error("ConnectError"),
    "AuthenticationError": _pulsarwire_error("AuthenticationError"),
    "AuthorizationError": _pulsarwire_error("AuthorizationError"),
    "BrokerMetadataError": _pulsarwire_error("MetadataError"),
    "BrokerPersistenceError": _pulsarwire_error("PersistenceError"),
    "ChecksumError": _pulsarwire_error("ChecksumServerError"),
    "ConsumerBusy": _pulsarwire_error("ConsumerBusyError"),
    "NotConnected": _pulsarwire_error("ConnectionClosedError"),
    "AlreadyClosed": _pulsarwire_error("AlreadyClosedError", "ConnectionClosedError"),
    "InvalidMessage": _pulsarwire_error("CodecError"),
    "ProducerBusy": _pulsarwire_error("ProducerBusyError"),
    "TooManyLookupRequestException": _pulsarwire_error("TooManyRequestsError"),
    "InvalidTopicName": _pulsarwire_error("InvalidTopicNameError"),
    "ServiceUnitNotReady": _pulsarwire_error("ServiceNotReadyError"),
    "ProducerBlockedQuotaExceededError": _pulsarwire_error("ProducerBlockedQuotaExceededError"),
    "ProducerBlockedQuotaExceededException": _pulsarwire_error("ProducerBlockedQuotaExceededException"),
    "ProducerQueueIsFull": _pulsarwire_error("ProducerQueueFullError"),
    "MessageTooBig": _pulsarwire_error("MessageTooBigError"),
    "TopicNotFound": _pulsarwire_error("TopicNotFoundError"),
    "SubscriptionNotFound": _pulsarwire_error("SubscriptionNotFoundError"),
    "ConsumerNotFound": _pulsarwire_error("ConsumerNotFoundError"),
    "UnsupportedVersionError": _pulsarwire_error("UnsupportedVersionError"),
    "OperationNotSupported": _pulsarwire_error("UnsupportedByBrokerError"),
    "TopicTerminated": _pulsarwire_error("TopicTerminatedError"),
    "IncompatibleSchema": _pulsarwire_error("IncompatibleSchemaError"),
    "ConsumerAssignError": _pulsarwire_error("ConsumerAssignError"),
    "CumulativeAcknowledgementNotAllowedError": _pulsarwire_error("CumulativeAcknowledgementNotAllowedError"),
    "TransactionCoordinatorNotFoundError": _pulsarwire_error("TransactionCoordinatorNotFoundError"),
    "InvalidTxnStatusError": _pulsarwire_error("InvalidTxnStatusError"),
    "NotAllowedError": _pulsarwire_error("NotAllowedError"),
    "TransactionConflict": _pulsarwire_error("TransactionConflictError"),
    "TransactionNotFound": _pulsarwire_error("TransactionNotFoundError"),
    "ProducerFenced": _pulsarwire_error("ProducerFencedError"),
}

# pulsarwire error class -> official result; where two results share a class (AlreadyClosed and
# NotConnected before AlreadyClosedError exists), the connection case is the default and
# `official_result(..., closed=True)` picks AlreadyClosed.
_RESULT_OF: dict[type, Result] = {}
for _name, _cls in PULSARWIRE_ERRORS.items():
    if _cls is not None and _cls not in _RESULT_OF:
        _RESULT_OF[_cls] = Result[_name]
_ALREADY_CLOSED_ERROR = PULSARWIRE_ERRORS["AlreadyClosed"]
if _ALREADY_CLOSED_ERROR is not None and _ALREADY_CLOSED_ERROR is not PULSARWIRE_ERRORS["NotConnected"]:
    _RESULT_OF[_ALREADY_CLOSED_ERROR] = Result.AlreadyClosed


def official_result(exc: BaseException, closed: bool = False) -> Result | None:
    """The official result for an error pulsarwire raised; None for errors that stay as they are
    (ValueError, TypeError and the like, which the official client raises too)."""
    cancelled = isinstance(exc, (asyncio.CancelledError, concurrent.futures.CancelledError))
    if closed and (cancelled or isinstance(exc, errors.ConnectionClosedError)):
        return Result.AlreadyClosed
    for cls in type(exc).__mro__:
        result = _RESULT_OF.get(cls)
        if result is not None:
            return result
    if isinstance(exc, errors.PulsarWireError):
        return Result.UnknownError
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return Result.Timeout
    if isinstance(exc, (ConnectionError, OSError)):
        return Result.ConnectError
    if cancelled:
        return Result.Interrupted
    if isinstance(exc, RuntimeError) and "closed" in str(exc):  # a stopped event loop
        return Result.AlreadyClosed
    return None


def exception_classes(base: type[BaseException], named_as_base: bool = False) -> dict[Result, type[BaseException]]:
    """One exception class per official result (Ok excepted), each a subclass of `base` and of
    the pulsarwire error the result stands for, named as the official client names it (or as
    `base`, where the official client raises `base` itself for every result)."""
    classes = {}
    for name in RESULT_NAMES[1:]:
        pulsarwire_cls = PULSARWIRE_ERRORS.get(name)
        bases = (base,) if pulsarwire_cls is None else (base, pulsarwire_cls)
        classes[Result[name]] = type(base.__name__ if named_as_base else name, bases,
                                     {"result": Result[name], "__module__": base.__module__,
                                      "__qualname__": f"{base.__name__}[{name}]" if named_as_base else name,
                                      "__doc__": f"Result.{name} as an exception."})
    return classes


# --- message ids and messages ------------------------------------------------------------

class MessageId:
    """A message's position, with the official constructor and accessors:
    `MessageId(partition=-1, ledger_id=-1, entry_id=-1, batch_index=-1)`, `ledger_id()`, ...;
    `MessageId.earliest` and `MessageId.latest` are the two ends of a topic."""

    __slots__ = ("_msg_id",)
    earliest: "MessageId"
    latest: "MessageId"

    def __init__(self, partition: int = -1, ledger_id: int = -1, entry_id: int = -1, batch_index: int = -1) -> None:
        self._msg_id = messages.MessageId(ledger_id, entry_id, partition, batch_index)

    @classmethod
    def wrap(cls, msg_id: "messages.MessageId | MessageId") -> "MessageId":
        """The official-style id of a pulsarwire MessageId (an official-style one is kept)."""
        if isinstance(msg_id, MessageId):
            return msg_id
        self = cls.__new__(cls)
        self._msg_id = msg_id
        return self

    @property
    def native(self) -> messages.MessageId:
        """The `pulsarwire.MessageId` behind this id (a pulsarwire extension)."""
        return self._msg_id

    def ledger_id(self) -> int:
        return self._msg_id.ledger_id

    def entry_id(self) -> int:
        return self._msg_id.entry_id

    def batch_index(self) -> int:
        return self._msg_id.batch_index

    def partition(self) -> int:
        return self._msg_id.partition

    def serialize(self) -> bytes:
        return self._msg_id.serialize()  # the official bytes: batch_size only when known

    @staticmethod
    def deserialize(message_id_bytes: bytes, topic: str | None = None) -> "MessageId":
        try:
            native = messages.MessageId.deserialize(message_id_bytes)
        except ValueError:  # the official client's error, word for word
            raise ValueError(messages.SERIALIZED_ID_UNREADABLE) from None
        if topic is not None:
            native = dataclasses.replace(native, topic=aio.topic_name(topic))
        return MessageId.wrap(native)

    def __str__(self) -> str:
        return str(self._msg_id)

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageId) and self._msg_id == other._msg_id

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __lt__(self, other: "MessageId") -> bool:
        return self._msg_id < other._msg_id

    def __le__(self, other: "MessageId") -> bool:
        return self._msg_id < other._msg_id or self == other

    def __gt__(self, other: "MessageId") -> bool:
        return other._msg_id < self._msg_id

    def __ge__(self, other: "MessageId") -> bool:
        return other._msg_id < self._msg_id or self == other

    def __hash__(self) -> int:
        return hash(self._msg_id)


MessageId.earliest = MessageId.wrap(messages.MessageId.earliest)
MessageId.latest = MessageId.wrap(messages.MessageId.latest)


def native_id(message_id: Any) -> messages.MessageId:
    """A pulsarwire MessageId from an official-style one (or a pulsarwire one, kept as is)."""
    if isinstance(message_id, MessageId):
        return message_id._msg_id
    if isinstance(message_id, messages.MessageId):
        return message_id
    if is_official(message_id, "MessageId"):  # the official module's own (pulsar. or _pulsar.MessageId)
        return messages.MessageId.deserialize(message_id.serialize())
    raise TypeError(f"expected a MessageId, got {type(message_id).__name__}")  # as the official bindings


def start_id(start_message_id: Any) -> messages.MessageId:
    """create_reader()'s start: a MessageId, or the official client's ValueError."""
    try:
        return native_id(start_message_id)
    except TypeError:
        raise ValueError(f"Argument start_message_id is expected to be of type 'MessageId' and not "
                         f"'{type(start_message_id).__name__}'") from None


def seek_target(target: object) -> messages.MessageId | int:
    """What seek() takes: a message id, or a publish time in ms."""
    if isinstance(target, bool):
        raise ValueError(f"invalid seek_arg type {type(target)}")
    if isinstance(target, int):
        return target
    try:
        return native_id(target)
    except TypeError:
        raise ValueError(f"invalid seek_arg type {type(target)}") from None


class Message:
    """A received message, with the official accessors."""

    __slots__ = ("_message", "_id")

    def __init__(self, message: messages.Message) -> None:
        self._message = message
        self._id: MessageId | None = None

    @property
    def native(self) -> messages.Message:
        """The `pulsarwire.Message` behind this message (a pulsarwire extension)."""
        return self._message

    def data(self) -> bytes:
        return self._message.data()

    def value(self) -> Any:
        """The payload decoded by the schema given when subscribing (bytes without one); the
        asyncio client, which received the schema, decodes."""
        return self._message.value()

    def properties(self) -> dict:
        return dict(self._message.properties())

    def partition_key(self) -> str:
        return self._message.partition_key() or ""

    def ordering_key(self) -> str:
        key = self._message.ordering_key()
        if not key:
            return ""
        return key.decode("utf-8", "replace") if isinstance(key, (bytes, bytearray)) else key

    def publish_timestamp(self) -> int:
        return self._message.publish_timestamp()

    def event_timestamp(self) -> int:
        return self._message.event_timestamp() or 0

    def message_id(self) -> MessageId:
        if self._id is None:
            self._id = MessageId.wrap(self._message.message_id())
        return self._id

    def topic_name(self) -> str:
        return self._message.topic_name()

    def redelivery_count(self) -> int:
        return self._message.redelivery_count()

    def schema_version(self) -> str:
        """A str, as the official client gives it (its C++ string): `.encode()` gives the stored
        bytes back for the versions Pulsar writes (8-byte counters below 128)."""
        version = getattr(self._message, "schema_version", None)
        value = version() if callable(version) else getattr(getattr(self._message, "_metadata", None),
                                                              "schema_version", b"")
        if isinstance(value, (bytes, bytearray)):
            return bytes(value).decode("latin-1")  # every byte kept, one character each
        return value or ""

    def producer_name(self) -> str:
        return self._message.producer_name()

    def has_null_value(self) -> bool:
        check = getattr(self._message, "has_null_value", None)
        return bool(check()) if callable(check) else False

    def encryption_context(self) -> None:
        return None  # pulsarwire neither encrypts nor decrypts

    def __repr__(self) -> str:
        return f"<Message {self.message_id()} {len(self._message.data())} bytes>"


# --- policies ----------------------------------------------------------------------------

class BatchReceivePolicy:
    """Limits of one `batch_receive()`: messages, bytes, wait (each <= 0 or < 0: no limit)."""

    def __init__(self, max_num_message: int = -1, max_num_bytes: int = 10 * 1024 * 1024,
                 timeout_ms: int = 100) -> None:
        if max_num_message <= 0 and max_num_bytes <= 0 and timeout_ms <= 0:
            raise ValueError("At least one of maxNumMessages, maxNumBytes and timeoutMs must be specified.")
        self._max_num_messages = int(max_num_message)
        self._max_num_bytes = int(max_num_bytes)
        self._timeout_ms = int(timeout_ms)

    def getMaxNumMessages(self) -> int:  # noqa: N802 - the official name
        return self._max_num_messages

    def getMaxNumBytes(self) -> int:  # noqa: N802
        return self._max_num_bytes

    def getTimeoutMs(self) -> int:  # noqa: N802
        return self._timeout_ms


class ConsumerBatchReceivePolicy:
    """The official wrapper that `subscribe(batch_receive_policy=...)` takes."""

    def __init__(self, max_num_message: int, max_num_bytes: int, timeout_ms: int) -> None:
        self._policy = BatchReceivePolicy(max_num_message, max_num_bytes, timeout_ms)

    def policy(self) -> BatchReceivePolicy:
        return self._policy


class KeySharedPolicy:
    """Key_Shared settings with the official setters and getters."""

    def __init__(self) -> None:
        self._mode = KeySharedMode.AutoSplit
        self._allow_out_of_order = False
        self._sticky_ranges: list[tuple[int, int]] = []

    def set_key_shared_mode(self, mode: KeySharedMode | int) -> None:
        self._mode = KeySharedMode(mode)

    def get_key_shared_mode(self) -> KeySharedMode:
        return self._mode

    def set_allow_out_of_order_delivery(self, allow: bool) -> None:
        self._allow_out_of_order = bool(allow)

    def is_allow_out_of_order_delivery(self) -> bool:
        return self._allow_out_of_order

    def set_sticky_ranges(self, ranges: Iterable[tuple[int, int]]) -> None:
        for start, end in ranges:
            if not 0 <= start <= end < 65536:
                raise ValueError(f"sticky range ({start}, {end}) must lie within 0..65535, start <= end")
        self._sticky_ranges = [(int(s), int(e)) for s, e in ranges]

    def get_sticky_ranges(self) -> list[tuple[int, int]]:
        return list(self._sticky_ranges)


class ConsumerKeySharedPolicy:
    """The official wrapper that `subscribe(key_shared_policy=...)` takes; the asyncio client
    receives it as is (`key_shared_mode`, `allow_out_of_order_delivery`, `sticky_ranges`)."""

    def __init__(self, key_shared_mode: KeySharedMode = KeySharedMode.AutoSplit,
                 allow_out_of_order_delivery: bool = False,
                 sticky_ranges: list[tuple[int, int]] | None = None) -> None:
        if key_shared_mode == KeySharedMode.Sticky and sticky_ranges is None:
            raise ValueError("When using key_shared_mode = KeySharedMode.Sticky you must also provide sticky_ranges")
        self._policy = KeySharedPolicy()
        self._policy.set_key_shared_mode(key_shared_mode)
        self._policy.set_allow_out_of_order_delivery(allow_out_of_order_delivery)
        if sticky_ranges is not None:
            self._policy.set_sticky_ranges(sticky_ranges)

    @property
    def key_shared_mode(self) -> KeySharedMode:
        return self._policy.get_key_shared_mode()

    @property
    def allow_out_of_order_delivery(self) -> bool:
        return self._policy.is_allow_out_of_order_delivery()

    @property
    def sticky_ranges(self) -> list[tuple[int, int]]:
        return self._policy.get_sticky_ranges()

    def policy(self) -> KeySharedPolicy:
        return self._policy


class ConsumerDeadLetterPolicy:
    """Dead letter settings; the asyncio client receives the object as is (`max_redeliver_count`,
    `dead_letter_topic` ("" for the default `<topic>-<subscription>-DLQ`),
    `initial_subscription_name` ("" for none))."""

    def __init__(self, max_redeliver_count: int, dead_letter_topic: str | None = None,
                 initial_subscription_name: str | None = None) -> None:
        if max_redeliver_count is None or max_redeliver_count < 1:
            raise ValueError("max_redeliver_count must be greater than 0")
        self._max_redeliver_count = int(max_redeliver_count)
        self._dead_letter_topic = dead_letter_topic or ""
        self._initial_subscription_name = initial_subscription_name or ""

    @property
    def dead_letter_topic(self) -> str:
        return self._dead_letter_topic

    @property
    def max_redeliver_count(self) -> int:
        return self._max_redeliver_count

    @property
    def initial_subscription_name(self) -> str:
        return self._initial_subscription_name

    def policy(self) -> "ConsumerDeadLetterPolicy":
        return self


# --- authentication ----------------------------------------------------------------------

def _native_auth(name: str, feature: str) -> Callable[..., Any]:
    cls = getattr(aio, name, None)
    if cls is None:
        raise NotImplementedError(f"{name} needs pulsarwire's {feature} support, which this build lacks")
    return cls


class Authentication:
    """Base of the authentication providers; `auth` is the pulsarwire provider behind it.

    `Authentication(name, params)` takes, as the official client, the name of a built-in method
    (`tls`, `token`, `basic`, `oauth2`, or the Java class name of one) with its parameter string;
    a C++ plugin library, which pulsarwire cannot load, is refused."""

    auth: Any

    def __init__(self, dynamicLibPath: str, authParamsString: str) -> None:  # noqa: N803 - official names
        _check_str(dynamicLibPath, "dynamicLibPath")
        _check_str(authParamsString, "authParamsString")
        method = _BUILT_IN_METHODS.get(dynamicLibPath.strip().lower())
        if method is None:
            raise NotImplementedError("pulsarwire cannot load C++ authentication plugins; use AuthenticationToken, "
                                      "AuthenticationBasic, AuthenticationOauth2 or AuthenticationTLS")
        self.auth = _built_in_auth(method, authParamsString).auth


# the names the official client's AuthFactory takes for its built-in methods
_BUILT_IN_METHODS = {name.lower(): method for method, names in (
    ("tls", ("tls", "org.apache.pulsar.client.impl.auth.AuthenticationTls")),
    ("token", ("token", "org.apache.pulsar.client.impl.auth.AuthenticationToken")),
    ("basic", ("basic", "org.apache.pulsar.client.impl.auth.AuthenticationBasic")),
    ("oauth2", ("oauth2", "org.apache.pulsar.client.impl.auth.oauth2.AuthenticationOAuth2")),
) for name in names}


def _auth_params(text: str) -> dict[str, Any]:
    """A parameter string: JSON, or the `key1:value1,key2:value2` form."""
    text = text.strip()
    if text.startswith("{"):
        params = json.loads(text)
        if not isinstance(params, dict):
            raise ValueError("authentication parameters must be a JSON object")
        return params
    return dict(item.split(":", 1) for item in text.split(",") if ":" in item)


def _built_in_auth(method: str, params_text: str) -> "Authentication":
    if method == "oauth2":
        return AuthenticationOauth2(params_text)
    if method == "token":
        text = params_text.strip()
        if text.startswith("token:"):
            return AuthenticationToken(text[len("token:"):])
        if text.startswith("file:"):
            path = text[len("file:"):].removeprefix("//")
            return AuthenticationToken(lambda: pathlib.Path(path).read_text().strip())
        return AuthenticationToken(str(_auth_params(text).get("token", "")))
    params = _auth_params(params_text)
    if method == "tls":
        return AuthenticationTLS(params.get("tlsCertFile", ""), params.get("tlsKeyFile", ""))
    return AuthenticationBasic(params.get("username"), params.get("password"), params.get("method", "basic"))


def _check_str(value: object, name: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"Argument {name} is expected to be of type 'str' and not '{type(value).__name__}'")


class AuthenticationToken(Authentication):
    def __init__(self, token: str | Callable[[], str]) -> None:
        if not (isinstance(token, str) or callable(token)):
            raise ValueError("Argument token is expected to be of type 'str' or a function returning 'str'")
        self.auth = aio.AuthenticationToken(token)


class AuthenticationBasic(Authentication):
    def __init__(self, username: str | None = None, password: str | None = None, method: str = "basic",
                 auth_params_string: str | None = None) -> None:
        if auth_params_string is not None:
            _check_str(auth_params_string, "auth_params_string")
            try:
                params = json.loads(auth_params_string)
                if not isinstance(params, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:  # RuntimeError, as the official client raises
                raise RuntimeError(f"invalid basic authentication parameters: {exc}") from None
            username, password = params.get("username"), params.get("password")
            method = params.get("method", "basic")
        _check_str(username, "username")
        _check_str(password, "password")
        _check_str(method, "method")
        self.auth = _native_auth("AuthenticationBasic", "Basic authentication")(username, password, method)


class AuthenticationOauth2(Authentication):
    def __init__(self, auth_params_string: str) -> None:
        _check_str(auth_params_string, "auth_params_string")
        self.auth = _native_auth("AuthenticationOauth2", "OAuth2")(auth_params_string)


class AuthenticationTLS(Authentication):
    def __init__(self, certificate_path: str, private_key_path: str) -> None:
        _check_str(certificate_path, "certificate_path")
        _check_str(private_key_path, "private_key_path")
        self.auth = _native_auth("AuthenticationTLS", "TLS client certificate")(certificate_path, private_key_path)


class AuthenticationAthenz(Authentication):
    def __init__(self, auth_params_string: str) -> None:
        raise NotImplementedError("pulsarwire has no Athenz authentication")


class CryptoKeyReader:
    """Accepted so programs construct it; passing it anywhere fails, as pulsarwire cannot encrypt."""

    def __init__(self, public_key_path: str, private_key_path: str) -> None:
        _check_str(public_key_path, "public_key_path")
        _check_str(private_key_path, "private_key_path")
        self.public_key_path, self.private_key_path = public_key_path, private_key_path


class ConsoleLogger:
    """Accepted as `Client(logger=...)` and ignored: pulsarwire logs to the `pulsarwire` logging logger."""

    def __init__(self, log_level: LoggerLevel = LoggerLevel.Info) -> None:
        log_level = accept(LoggerLevel, log_level, "log_level")
        self.log_level = log_level


class FileLogger:
    """Accepted as `Client(logger=...)` and ignored: pulsarwire logs to the `pulsarwire` logging logger."""

    def __init__(self, log_level: LoggerLevel, log_file: str) -> None:
        log_level = accept(LoggerLevel, log_level, "log_level")
        _check_str(log_file, "log_file")
        self.log_level, self.log_file = log_level, log_file


# --- checking official arguments; send options --------------------------------------------

def _same_meaning(var_type: type, var: object) -> bool:
    """An official object where pulsarwire's `var_type` is expected: the policies (same accessors)
    and enums (converted by `accept`); official authentication objects are refused (their
    credentials live in the C++ library, out of reach)."""
    if isinstance(var_type, type) and issubclass(var_type, Authentication) and is_official(var):
        raise ValueError(f"an official pulsar.{type(var).__name__} keeps its credentials inside the official "
                         f"C++ library, where pulsarwire cannot read them: make it with pulsarwire.sync."
                         f"{type(var).__name__}(...) instead")
    return isinstance(var_type, type) and is_official(var, var_type.__name__)


def check_type(var_type: type, var: object, name: str) -> None:
    if not isinstance(var, var_type) and not _same_meaning(var_type, var):
        raise ValueError(f"Argument {name} is expected to be of type '{var_type.__name__}' and not "
                         f"'{type(var).__name__}'")


def check_type_or_none(var_type: type, var: object, name: str) -> None:
    if var is not None and not isinstance(var, var_type) and not _same_meaning(var_type, var):
        raise ValueError(f"Argument {name} is expected to be either None or of type '{var_type.__name__}'")


def accept(enum_type: type[_E], var: Any, name: str) -> _E:
    """`var` as pulsarwire's `enum_type`: checked as `check_type` does, an official enum converted."""
    check_type(enum_type, var, name)
    return enum_type(var)


class Unsupported(ValueError):
    """An option pulsarwire cannot honour (end-to-end encryption); raised as OperationNotSupported."""


def is_default_schema(schema: object) -> bool:
    return schema is None or type(schema).__name__ == "BytesSchema"


def send_options(properties: dict[str, str] | None, partition_key: str | None, ordering_key: str | None,
                 sequence_id: int | None, replication_clusters: list[str] | None, disable_replication: bool,
                 event_timestamp: int | None, deliver_at: int | None,
                 deliver_after: timedelta | None) -> dict[str, Any]:
    """The asyncio client's send keywords; like the official client, empty values mean "not set"."""
    check_type_or_none(dict, properties, "properties")
    check_type_or_none(str, partition_key, "partition_key")
    check_type_or_none(str, ordering_key, "ordering_key")
    check_type_or_none(int, sequence_id, "sequence_id")
    check_type_or_none(list, replication_clusters, "replication_clusters")
    check_type(bool, disable_replication, "disable_replication")
    check_type_or_none(int, event_timestamp, "event_timestamp")
    check_type_or_none(int, deliver_at, "deliver_at")
    check_type_or_none(timedelta, deliver_after, "deliver_after")
    # the official client's own checks: its sequence id is checked, its event time is an unsigned
    # argument of its bindings (the protobuf fields would say only "Value out of range")
    if sequence_id is not None and sequence_id < 0:
        raise ValueError("sequenceId needs to be >= 0")
    if event_timestamp is not None and event_timestamp < 0:
        raise TypeError(f"event_timestamp(): incompatible function arguments: {event_timestamp} is not an "
                        f"unsigned number of milliseconds")
    options: dict[str, Any] = {}
    if properties:
        options["properties"] = properties
    if partition_key:
        options["partition_key"] = partition_key
    if ordering_key:
        options["ordering_key"] = ordering_key.encode()
    if sequence_id:
        options["sequence_id"] = sequence_id
    if event_timestamp:
        options["event_timestamp"] = event_timestamp
    if deliver_at:
        options["deliver_at"] = deliver_at
    if deliver_after:
        options["deliver_after_ms"] = int(deliver_after / timedelta(milliseconds=1))
    # geo-replication: a single cluster stores the message whatever the list names (Pulsar stores
    # it locally too) and has no other cluster to send it to, so both mean nothing more here
    for cluster in replication_clusters or ():
        check_type(str, cluster, "replication_clusters")
    return options


def check_content(content: object, schema: object) -> None:
    """Without a schema the content must be bytes (with one, the asyncio client encodes it)."""
    if is_default_schema(schema) and not isinstance(content, (bytes, bytearray, memoryview)):
        raise TypeError(f"Invalid record obj of type {type(content)} - expected type is {bytes}")


class BadTopicName(ValueError):
    """A topic name the official client refuses; raised as InvalidTopicName."""


def check_topic(topic: str) -> str:
    try:
        return aio.topic_name(topic)
    except ValueError as exc:
        raise BadTopicName(str(exc)) from None


def subscribe_topic(topic: str | list[str] | re.Pattern[str]) -> str | list[str] | re.Pattern[str]:
    """The topic argument as the asyncio client takes it: a name, a list, or a compiled regex."""
    if isinstance(topic, str):
        check_topic(topic)
        return topic
    if isinstance(topic, list):
        for name in topic:
            check_type(str, name, "topic")
            check_topic(name)
        return topic
    if isinstance(topic, re.Pattern):
        return topic
    raise ValueError("Argument 'topic' is expected to be of a type between (str, list, re.pattern)")
