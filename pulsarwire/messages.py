"""User-facing message and message-id types."""
from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, overload

from google.protobuf.message import DecodeError

from ._proto import PulsarApi_pb2 as pb

if TYPE_CHECKING:
    from .codec import SingleMessage


class ValueDecoder(Protocol):
    """What a message needs from its consumer's schema to decode value()."""

    def decode_message(self, message: Message) -> Any: ...


# (first input index, count, ledger_id, entry_id, partition, first batch index or -1, batch size, topic)
Span = tuple[int, int, int, int, int, int, int, "str | None"]

_U64_MAX = 0xFFFFFFFFFFFFFFFF
_I64_MAX = 0x7FFFFFFFFFFFFFFF
SERIALIZED_ID_UNREADABLE = "Failed to parse serialized message id"  # the official client's words


@functools.total_ordering
@dataclass(frozen=True, slots=True)
class MessageId:
    """Position of a message: ledger, entry, and for batches the index in the entry. A chunked
    message's is its last chunk's, with its first chunk's (ledger, entry) in `first_chunk` (the
    official client's chunk message id): a reader that starts at it inclusively starts there."""

    earliest: ClassVar["MessageId"]
    latest: ClassVar["MessageId"]

    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1
    batch_size: int = 0
    topic: str | None = None
    first_chunk: tuple[int, int] | None = None

    def _key(self) -> tuple[int, int, int]:
        return (self.ledger_id, self.entry_id, self.batch_index)

    def __lt__(self, other: "MessageId") -> bool:
        return self._key() < other._key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageId) and self._key() == other._key() and \
            self.partition == other.partition

    def __hash__(self) -> int:
        return hash((self.ledger_id, self.entry_id, self.batch_index, self.partition))

    def entry(self) -> "MessageId":
        """The id of the whole entry (batch) this message is in."""
        return MessageId(self.ledger_id, self.entry_id, self.partition, topic=self.topic, first_chunk=self.first_chunk)

    def start(self, inclusive: bool) -> tuple[int, int]:
        """The (ledger, entry) a reader starting at this id begins from: a chunked message's first
        chunk when the start is inclusive."""
        if inclusive and self.first_chunk is not None:
            return self.first_chunk
        return (self.ledger_id, self.entry_id)

    def to_proto(self) -> pb.MessageIdData:
        data = pb.MessageIdData(ledgerId=self.ledger_id & _U64_MAX, entryId=self.entry_id & _U64_MAX)
        if self.partition >= 0:
            data.partition = self.partition
        if self.batch_index >= 0:
            data.batch_index = self.batch_index
            data.batch_size = self.batch_size
        if self.first_chunk is not None:
            data.first_chunk_message_id.CopyFrom(entry_id_data(*self.first_chunk))
        return data

    @classmethod
    def from_proto(cls, data: pb.MessageIdData, topic: str | None = None) -> "MessageId":
        first = data.first_chunk_message_id if data.HasField("first_chunk_message_id") else None
        return cls(_signed(data.ledgerId), _signed(data.entryId), data.partition,
                   data.batch_index, data.batch_size, topic,
                   (_signed(first.ledgerId), _signed(first.entryId)) if first is not None else None)

    def serialize(self) -> bytes:
        data = self.to_proto()
        if not self.batch_size:  # unknown (a hand-built id): left out, as the official client does
            data.ClearField("batch_size")
        return data.SerializeToString()

    @classmethod
    def deserialize(cls, raw: bytes) -> "MessageId":
        """The id serialize() gave; ValueError for bytes that are not one (not protobuf, or
        without a ledger and entry id: empty bytes would otherwise read as (0,0,-1,-1))."""
        try:
            data = pb.MessageIdData.FromString(raw)
        except (DecodeError, TypeError) as exc:
            raise ValueError(f"{SERIALIZED_ID_UNREADABLE}: {exc}") from None
        if not data.IsInitialized():
            raise ValueError(f"{SERIALIZED_ID_UNREADABLE}: no {' or '.join(data.FindInitializationErrors())}")
        return cls.from_proto(data)

    def __str__(self) -> str:
        last = f"({self.ledger_id},{self.entry_id},{self.partition},{self.batch_index})"
        if self.first_chunk is None:
            return last
        return f"({self.first_chunk[0]},{self.first_chunk[1]},{self.partition},-1);{last}"  # as the official client


def _signed(value: int) -> int:
    return value - (1 << 64) if value > _I64_MAX else value


signed64 = _signed  # uint64 on the wire -> the signed value Pulsar means (-1 for "none")


def entry_id_data(ledger_id: int, entry_id: int) -> pb.MessageIdData:
    """An entry's id as the wire carries it: signed values as uint64 (-1, "none", as all ones)."""
    return pb.MessageIdData(ledgerId=ledger_id & 0xFFFFFFFFFFFFFFFF, entryId=entry_id & 0xFFFFFFFFFFFFFFFF)


def ack_set_bits(words: Iterable[int]) -> int:
    """An ack_set (int64 words; a set bit = an index still unacknowledged) as one integer bitmask."""
    bits = 0
    for i, word in enumerate(words):
        bits |= (word & 0xFFFFFFFFFFFFFFFF) << (64 * i)
    return bits


def ack_set_words(bits: int, size: int) -> list[int]:
    """The ack_set words (signed int64, as the wire declares them) of bitmask `bits` over `size` indexes."""
    words = []
    for start in range(0, max(size, 1), 64):
        word = (bits >> start) & 0xFFFFFFFFFFFFFFFF
        words.append(word - (1 << 64) if word >= 1 << 63 else word)
    return words


#: The position before the first message and after the last one.
MessageId.earliest = MessageId(-1, -1)
MessageId.latest = MessageId(_I64_MAX, _I64_MAX)

_new_object = object.__new__
_SET_LEDGER, _SET_ENTRY, _SET_PARTITION, _SET_INDEX, _SET_SIZE, _SET_TOPIC, _SET_FIRST_CHUNK = (
    MessageId.__dict__[name].__set__ for name in
    ("ledger_id", "entry_id", "partition", "batch_index", "batch_size", "topic", "first_chunk"))


def make_message_id(ledger_id: int, entry_id: int, partition: int = -1, batch_index: int = -1,
                    batch_size: int = 0, topic: str | None = None) -> MessageId:
    """MessageId(...) for the hot paths (a receipt per message sent): its slots set directly, in
    half the time of the frozen dataclass's __init__ (which calls object.__setattr__ per field)."""
    made = _new_object(MessageId)
    _SET_LEDGER(made, ledger_id)
    _SET_ENTRY(made, entry_id)
    _SET_PARTITION(made, partition)
    _SET_INDEX(made, batch_index)
    _SET_SIZE(made, batch_size)
    _SET_TOPIC(made, topic)
    _SET_FIRST_CHUNK(made, None)
    return made


class Delivery:
    """What every message of one delivered entry shares: its metadata, id and origin. One per
    entry, so a message holds two references rather than nine fields (the consumer's AckUnit,
    the entry's acknowledgement state, is one)."""

    __slots__ = ("metadata", "ledger_id", "entry_id", "partition", "topic", "redelivery_count", "schema")

    def __init__(self, metadata: pb.MessageMetadata, ledger_id: int, entry_id: int, partition: int, topic: str,
                 redelivery_count: int = 0, schema: ValueDecoder | None = None) -> None:
        self.metadata = metadata
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.partition = partition
        self.topic = topic
        self.redelivery_count = redelivery_count
        self.schema = schema  # decodes value(); None: the raw bytes


class Message:
    """A received message; accessor names follow the official Python client.

    It wraps the codec's SingleMessage, so payload bytes stay a view into the
    received frame and metadata fields are decoded only when asked for; what the
    messages of one entry share is in their Delivery.
    """

    __slots__ = ("_single", "_ack_unit", "_id")

    def __init__(self, single: SingleMessage, delivery: Delivery) -> None:
        self._single = single
        self._ack_unit: Any = delivery  # the entry this came in (the consumer's AckUnit: its ack state too)
        self._id: MessageId | None = None

    @property
    def _metadata(self) -> pb.MessageMetadata:
        return self._ack_unit.metadata

    def data(self) -> bytes:
        return self._single.data()

    def value(self) -> Any:
        """The payload decoded by the consumer's schema (the bytes when it has none)."""
        schema = self._ack_unit.schema
        if schema is None:
            return self._single.data()
        return schema.decode_message(self)

    def schema_version(self) -> bytes | None:
        md = self._metadata
        return md.schema_version if md.HasField("schema_version") else None

    def has_null_value(self) -> bool:
        """A tombstone: sent with no value (`send(None)`); data() is then b''."""
        return bool(self._single.null_value)

    def payload_view(self) -> memoryview:
        """The payload without copying (valid as long as the message is)."""
        return self._single.payload

    def properties(self) -> dict[str, str]:
        return self._single.properties

    def partition_key(self) -> str | None:
        return self._single.partition_key

    def ordering_key(self) -> bytes | None:
        return self._single.ordering_key

    def publish_timestamp(self) -> int:
        return self._metadata.publish_time

    def event_timestamp(self) -> int:
        return self._single.event_time

    def message_id(self) -> MessageId:
        if self._id is None:
            single = self._single
            delivery = self._ack_unit
            self._id = make_message_id(delivery.ledger_id, delivery.entry_id, delivery.partition,
                                       single.batch_index, single.batch_size, delivery.topic)
            chunks = getattr(delivery, "chunk_entries", None)
            if chunks:  # a chunked message: the official client's id names its first chunk too
                _SET_FIRST_CHUNK(self._id, chunks[0])
        return self._id

    def topic_name(self) -> str:
        return self._ack_unit.topic

    def redelivery_count(self) -> int:
        return self._ack_unit.redelivery_count

    def producer_name(self) -> str:
        return self._metadata.producer_name

    def sequence_id(self) -> int:
        single = self._single
        if single.sequence_id is not None and single.batch_index >= 0:
            return single.sequence_id
        return self._metadata.sequence_id + max(single.batch_index, 0)

    def __repr__(self) -> str:
        return f"<Message {self.message_id()} {len(self._single.payload)} bytes>"


class MessageIds(Sequence[MessageId]):
    """The MessageIds of a send_many call, in the order the messages were given.

    Held as one span per batch (ledger, entry, first batch index), so a million
    receipts cost no Python object each; a MessageId is made when one is read.
    """

    __slots__ = ("_spans", "_starts", "_count")

    def __init__(self, spans: Iterable[Span]) -> None:
        self._spans = sorted(spans)
        self._starts = [span[0] for span in self._spans]
        self._count = sum(span[1] for span in self._spans)

    def __len__(self) -> int:
        return self._count

    @staticmethod
    def _make(span: Span, offset: int) -> MessageId:
        _, _, ledger_id, entry_id, partition, batch_first, batch_size, topic = span
        if batch_first < 0:
            return make_message_id(ledger_id, entry_id, partition, topic=topic)
        return make_message_id(ledger_id, entry_id, partition, batch_first + offset, batch_size, topic)

    @overload
    def __getitem__(self, index: int) -> MessageId: ...

    @overload
    def __getitem__(self, index: slice) -> list[MessageId]: ...

    def __getitem__(self, index: int | slice) -> MessageId | list[MessageId]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("MessageIds index out of range")
        span = self._spans[bisect.bisect_right(self._starts, index) - 1]
        return self._make(span, index - span[0])

    def __iter__(self) -> Iterator[MessageId]:
        for span in self._spans:
            for offset in range(span[1]):
                yield self._make(span, offset)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (MessageIds, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"<MessageIds of {self._count} messages in {len(self._spans)} entries>"
