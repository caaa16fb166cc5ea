"""The broker's hot path for runs of Send frames: which frames a run stores (plan_send_run),
the log's records for them (stage_entries) and their receipts (queue_send_receipts).

Pure-Python twin of pulsarwire.broker._staging (same API, same behaviour); broker/staging.py
chooses one. The record layout is storage's: it passes in its header and entry class.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .._codec_py import count_entry_batch, encode_send_receipt
from ..errors import PulsarWireError

if TYPE_CHECKING:
    import struct
    from collections.abc import Callable, Sequence
    from typing import TypeVar

    from ..codec import SendFrame

    _Entry = TypeVar("_Entry")  # storage's entry class
    _Batch = TypeVar("_Batch")  # the front end's record of a run, carried through to `sends`
    _Body = bytes | memoryview

IMPLEMENTATION = "python"


def plan_send_run(frames: Sequence[SendFrame], start: int, end: int, last: int, first_id: int, duplicate: int
                  ) -> tuple[list[int], list[memoryview], list[int], list[int], list[int], list[int]]:
    """What a broker stores of frames[start:end], SendFrames of one producer in the order they
    came, when it stores them as one run: stops before the first frame a run leaves to the
    general path (a chunk, a delayed message, a compressed or malformed batch).

    `last` is the producer's last stored sequence id (-1: none). Returns (ids, bodies,
    checksums, publish_times, counts, highest_ids): `ids` has one item per frame taken,
    `duplicate` for a send whose highest sequence id is not above the last one stored or taken
    before it, else first_id + its index in the other lists, which hold each stored frame's
    metadata-and-payload span, CRC32C, publish time, message count and highest sequence id."""
    ids: list[int] = []
    bodies: list[memoryview] = []
    checksums: list[int] = []
    publish_times: list[int] = []
    counts: list[int] = []
    highest_ids: list[int] = []
    for i in range(start, end):
        frame = frames[i]
        if frame.is_chunk or frame.deliver_at_time is not None:
            break
        highest = frame.sequence_id
        claimed = frame.highest_sequence_id
        if claimed is not None and claimed > highest:
            highest = claimed
        if highest <= last:
            ids.append(duplicate)
            continue
        body = frame.metadata_and_payload
        batch_count = frame.num_messages_in_batch
        if batch_count is None or batch_count <= 1:
            count = 1
        elif frame.compression:
            break
        else:
            try:
                count = count_entry_batch(body, batch_count)
            except (PulsarWireError, ValueError):
                break
        last = highest
        ids.append(first_id + len(bodies))
        bodies.append(body)
        checksums.append(frame.checksum)
        publish_times.append(frame.publish_time)
        counts.append(count)
        highest_ids.append(highest)
    return ids, bodies, checksums, publish_times, counts, highest_ids


def stage_entries(bodies: Sequence[_Body], checksums: Sequence[int], publish_times: Sequence[int],
                  counts: Sequence[int], first_id: int, size: int, limit: int, header: struct.Struct,
                  entry_type: Callable[[int, _Body, int, int, int], _Entry]
                  ) -> tuple[list[_Body], list[int], list[_Entry], int]:
    """Records for a log's appends: for each body, while `size` (the bytes of the log segment so
    far) is under `limit`, the body (a copy when it is not bytes or a contiguous view of bytes,
    which could change before it is written), header.pack(body size, checksum, publish time,
    count) before it, its position (`size` then), and entry_type(entry id, body, checksum,
    publish time, count), entry ids from first_id. Returns (records, positions, entries, size):
    records alternate headers and bodies; `size` is past the last record."""
    records: list[_Body] = []
    positions: list[int] = []
    entries: list[_Entry] = []
    pack, header_size, entry_id = header.pack, header.size, first_id
    for body, checksum, publish_time, count in zip(bodies, checksums, publish_times, counts):
        if size >= limit:
            break
        kind = type(body)
        # `kind is memoryview` makes body a view; mypy narrows on type(body) only, which this path would pay twice
        if kind is not bytes and not (kind is memoryview and type(body.obj) is bytes  # type: ignore[union-attr]
                                      and body.c_contiguous):  # type: ignore[union-attr]
            body = bytes(body)
        body_size = len(body)
        records += (pack(body_size, checksum, publish_time, count), body)
        positions.append(size)
        size += header_size + body_size
        entries.append(entry_type(entry_id, body, checksum, publish_time, count))
        entry_id += 1
    return records, positions, entries, size


def queue_send_receipts(out: list[bytes], sends: list[tuple[int, _Batch, int, int]], batch: _Batch, producer_id: int,
                        frames: Sequence[SendFrame], start: int, ids: Sequence[int], ledger_id: int,
                        duplicate: int) -> int:
    """Append to `out` the SEND_RECEIPT of each of frames[start:start + len(ids)], stored as
    `ids` says (a `duplicate` is answered with ledger -1), and to `sends` what answering one
    with an error instead takes: (its index in out, batch, producer_id, its sequence id).
    Returns the bytes appended."""
    queued = 0
    for frame, entry_id in zip(frames[start:start + len(ids)], ids):
        sequence_id = frame.sequence_id
        claimed = frame.highest_sequence_id
        sends.append((len(out), batch, producer_id, sequence_id))
        data = encode_send_receipt(producer_id, sequence_id,
                                   claimed if claimed is not None and claimed > sequence_id else sequence_id,
                                   ledger_id if entry_id != duplicate else -1, entry_id)
        out.append(data)
        queued += len(data)
    return queued
