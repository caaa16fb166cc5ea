"""What the broker's domain reads of a stored entry: its metadata, how many messages it holds,
and where a start position leaves a reader in a log."""
from __future__ import annotations

from typing import Any, Callable

from .. import codec
from .._proto import PulsarApi_pb2 as pb
from ..errors import PulsarWireError
from .storage import Body, Entry, TopicLog

COUNT_MAX_UNCOMPRESSED = 8 * 1024 * 1024  # a compressed batch larger than this is not counted (CPU bound)
EARLIEST = -1  # a start position before every entry
LATEST = 1 << 63  # a start position after every entry


def start_entry(entry_id: int, topic_log: TopicLog) -> int:
    """Where a start position leaves a reader: EARLIEST, LATEST, or that entry (clamped to the log)."""
    if entry_id == EARLIEST:
        return topic_log.first_entry_id
    if entry_id >= LATEST:
        return topic_log.committed_entry_id
    return min(max(entry_id, topic_log.first_entry_id), topic_log.committed_entry_id)


class MalformedBatchError(ValueError):
    """A batch whose payload does not split into the messages its metadata claims: stored, it
    would make consumers read past its end (the official client crashes on it)."""


def entry_message_count(body: Body, batch_count: int | None, compression: int | None = None) -> int:
    """How many messages an entry holds, which consumers' permits are charged. `batch_count` is
    the metadata's num_messages_in_batch (None: not a batch, one message whatever CommandSend
    claims). A claim above 1 is checked against what the payload really splits into
    (MalformedBatchError when it differs); a batch too big to decompress cheaply counts as 1.
    `compression` from the metadata, when the caller has read it, spares parsing it again."""
    if batch_count is None or batch_count <= 1:
        return 1
    batch: bytes | bytearray | memoryview
    count: Callable[[Any, int], int]  # count_entry_batch or count_batch (first parameters named apart)
    if compression == 0:  # the hot path: the codec steps over the metadata itself
        batch, count = body, codec.count_entry_batch
    else:
        try:
            end = 4 + int.from_bytes(body[:4], "big")
            metadata = _parse_metadata(body[4:end])
            batch = body[end:]
            if metadata.compression:
                batch = codec.decompress_payload(metadata, batch, COUNT_MAX_UNCOMPRESSED)
        except (PulsarWireError, ValueError):  # DecodeError is a ValueError
            return 1
        count = codec.count_batch
    try:
        return count(batch, batch_count)
    except (PulsarWireError, ValueError) as exc:
        raise MalformedBatchError(f"the batch does not hold the {batch_count} messages it claims: {exc}") from exc


_parse_metadata = pb.MessageMetadata.FromString


def entry_metadata(entry: Entry) -> pb.MessageMetadata:
    size = int.from_bytes(entry.body[:4], "big")
    return _parse_metadata(entry.body[4:4 + size])


def entry_key(entry: Entry) -> bytes | None:
    """The key Key_Shared routes the entry by: its ordering key, else its partition key."""
    metadata = entry_metadata(entry)
    if metadata.HasField("ordering_key"):
        return metadata.ordering_key
    if metadata.HasField("partition_key"):
        return metadata.partition_key.encode()
    return None
