"""Every error pulsarwire raises, in one hierarchy.

Codec errors say what was wrong with the bytes, in the order the codec checks
them (size, magic, checksum, command, metadata, compression, batch). Server
errors are mapped from the wire's ServerError enum through SERVER_ERRORS, so a
caller can catch `TopicNotFoundError` rather than compare numbers.
"""
from __future__ import annotations

import builtins
from typing import Any


class PulsarWireError(Exception):
    """Base of every pulsarwire error."""


# --- codec -----------------------------------------------------------------

class CodecError(PulsarWireError):
    """Bytes that do not form a valid Pulsar frame or message.

    `command` is the frame's parsed BaseCommand when the error was found after
    the command was read (a consumer uses it to reject the right message).
    """

    def __init__(self, message: str, *, command: Any = None) -> None:
        super().__init__(message)
        self.command = command


class FrameTooLargeError(CodecError):
    """A frame's declared size is above the reader's max_frame_size."""


class TruncatedFrameError(CodecError):
    """A size inside a frame points past the frame's end, or the stream ended mid-frame."""


class BadMagicError(CodecError):
    """The payload section starts with neither a known magic nor a metadata size that fits."""


class ChecksumMismatchError(CodecError):
    """The CRC32C carried after magic 0x0e01 does not match the bytes it covers."""

    def __init__(self, expected: int, actual: int, *, command: Any = None) -> None:
        super().__init__(
            f"CRC32C mismatch: frame carries 0x{expected:08x}, bytes give 0x{actual:08x}",
            command=command,
        )
        self.expected = expected
        self.actual = actual


class BadCommandError(CodecError):
    """The BaseCommand protobuf does not parse."""


class BadMetadataError(CodecError):
    """MessageMetadata or BrokerEntryMetadata does not parse."""


class DecompressionError(CodecError):
    """A payload does not decompress, or not to its declared uncompressed_size."""


class BadBatchError(CodecError):
    """A batch payload does not split into num_messages_in_batch well-formed entries."""


# --- connection and session ------------------------------------------------

class ProtocolError(PulsarWireError):
    """The peer sent a command that is not allowed in the session's current state."""


class ConnectionClosedError(PulsarWireError):
    """The connection was closed (by either side) before the operation finished."""


class ConnectError(ConnectionClosedError):
    """A connection to the broker could not be opened (refused, unreachable, TLS handshake)."""


class AlreadyClosedError(ConnectionClosedError):
    """The client, producer, consumer or reader was closed before this call (official: AlreadyClosed)."""


class TimeoutError(PulsarWireError, builtins.TimeoutError):  # noqa: A001
    """An operation did not finish within its configured timeout (official: Timeout).

    It is also the builtin TimeoutError, so `except TimeoutError` catches it whichever is imported.
    """


class ConnectTimeoutError(TimeoutError, ConnectError):
    """No connection to the broker could be opened within the operation timeout, retries included."""


class ProducerQueueFullError(PulsarWireError):
    """The producer's pending queue is full and block_if_queue_full is off."""


class MessageTooBigError(PulsarWireError):
    """A message is over the broker's size limit and chunking is off (official: MessageTooBig)."""


class UnsupportedByBrokerError(PulsarWireError):
    """The broker does not serve this request (it would leave it unanswered: pulsar-lite lists
    no namespace's topics), so it is refused at once rather than after the operation timeout."""


class CumulativeAcknowledgementNotAllowedError(PulsarWireError):
    """Cumulative acknowledgement on a Shared or Key_Shared subscription, where it has no meaning."""


# --- server errors (CommandError / CommandSendError / lookup failures) --------

class ServerError(PulsarWireError):
    """An error the broker answered with; `code` is the wire ServerError value."""

    code = 0

    def __init__(self, message: str = "", *, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


def _server_error(name: str, code: int, doc: str) -> type[ServerError]:
    return type(name, (ServerError,), {"code": code, "__doc__": doc})


UnknownServerError = _server_error("UnknownServerError", 0, "UnknownError")
MetadataError = _server_error("MetadataError", 1, "MetadataError")
PersistenceError = _server_error("PersistenceError", 2, "PersistenceError")
AuthenticationError = _server_error("AuthenticationError", 3, "AuthenticationError")
AuthorizationError = _server_error("AuthorizationError", 4, "AuthorizationError")
ConsumerBusyError = _server_error("ConsumerBusyError", 5, "ConsumerBusy")
ServiceNotReadyError = _server_error("ServiceNotReadyError", 6, "ServiceNotReady")
ProducerBlockedQuotaExceededError = _server_error(
    "ProducerBlockedQuotaExceededError", 7, "ProducerBlockedQuotaExceededError")
ProducerBlockedQuotaExceededException = _server_error(
    "ProducerBlockedQuotaExceededException", 8, "ProducerBlockedQuotaExceededException")
ChecksumServerError = _server_error("ChecksumServerError", 9, "ChecksumError")
UnsupportedVersionError = _server_error("UnsupportedVersionError", 10, "UnsupportedVersionError")
TopicNotFoundError = _server_error("TopicNotFoundError", 11, "TopicNotFound")
SubscriptionNotFoundError = _server_error("SubscriptionNotFoundError", 12, "SubscriptionNotFound")
ConsumerNotFoundError = _server_error("ConsumerNotFoundError", 13, "ConsumerNotFound")
TooManyRequestsError = _server_error("TooManyRequestsError", 14, "TooManyRequests")
TopicTerminatedError = _server_error("TopicTerminatedError", 15, "TopicTerminatedError")
ProducerBusyError = _server_error("ProducerBusyError", 16, "ProducerBusy")
InvalidTopicNameError = _server_error("InvalidTopicNameError", 17, "InvalidTopicName")
IncompatibleSchemaError = _server_error("IncompatibleSchemaError", 18, "IncompatibleSchema")
ConsumerAssignError = _server_error("ConsumerAssignError", 19, "ConsumerAssignError")
TransactionCoordinatorNotFoundError = _server_error(
    "TransactionCoordinatorNotFoundError", 20, "TransactionCoordinatorNotFound")
InvalidTxnStatusError = _server_error("InvalidTxnStatusError", 21, "InvalidTxnStatus")
NotAllowedError = _server_error("NotAllowedError", 22, "NotAllowedError")
TransactionConflictError = _server_error("TransactionConflictError", 23, "TransactionConflict")
TransactionNotFoundError = _server_error("TransactionNotFoundError", 24, "TransactionNotFound")
ProducerFencedError = _server_error("ProducerFencedError", 25, "ProducerFenced")

#: wire ServerError value -> exception class; the one table for the whole library.
SERVER_ERRORS: dict[int, type[ServerError]] = {
    cls.code: cls
    for cls in (
        UnknownServerError, MetadataError, PersistenceError, AuthenticationError,
        AuthorizationError, ConsumerBusyError, ServiceNotReadyError,
        ProducerBlockedQuotaExceededError, ProducerBlockedQuotaExceededException,
        ChecksumServerError, UnsupportedVersionError, TopicNotFoundError,
        SubscriptionNotFoundError, ConsumerNotFoundError, TooManyRequestsError,
        TopicTerminatedError, ProducerBusyError, InvalidTopicNameError,
        IncompatibleSchemaError, ConsumerAssignError, TransactionCoordinatorNotFoundError,
        InvalidTxnStatusError, NotAllowedError, TransactionConflictError,
        TransactionNotFoundError, ProducerFencedError,
    )
}


def server_error(code: int, message: str) -> ServerError:
    """The exception for a wire ServerError value (unknown values map to the base class)."""
    cls = SERVER_ERRORS.get(code, ServerError)
    return cls(message, code=code)
