# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython twin of pulsarwire.broker._staging_py: the broker's hot path for runs of Send frames
(same API, same behaviour). It reads SendFrame's fields at C level (pulsarwire/_codec.pxd), so
it takes the Cython codec's frames only; broker/staging.py pairs it with that codec."""
from cpython.bytes cimport PyBytes_GET_SIZE

from pulsarwire._codec cimport SendFrame, _count_entry_batch, _send_receipt

from pulsarwire.errors import PulsarWireError

IMPLEMENTATION = "cython"


def plan_send_run(list frames, Py_ssize_t start, Py_ssize_t end, last, first_id, duplicate):
    """What a broker stores of frames[start:end], SendFrames of one producer in the order they
    came, when it stores them as one run: stops before the first frame a run leaves to the
    general path (a chunk, a delayed message, a compressed or malformed batch).

    `last` is the producer's last stored sequence id (-1: none). Returns (ids, bodies,
    checksums, publish_times, counts, highest_ids): `ids` has one item per frame taken,
    `duplicate` for a send whose highest sequence id is not above the last one stored or taken
    before it, else first_id + its index in the other lists, which hold each stored frame's
    metadata-and-payload span, CRC32C, publish time, message count and highest sequence id."""
    cdef list ids = [], bodies = [], checksums = [], publish_times = [], counts = [], highest_ids = []
    cdef Py_ssize_t i
    cdef SendFrame frame
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
                count = _count_entry_batch(body, batch_count)
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


def stage_entries(list bodies, list checksums, list publish_times, list counts, first_id, Py_ssize_t size,
                  Py_ssize_t limit, header, entry_type):
    """Records for a log's appends: for each body, while `size` (the bytes of the log segment so
    far) is under `limit`, the body (a copy when it is not bytes or a contiguous view of bytes,
    which could change before it is written), header.pack(body size, checksum, publish time,
    count) before it, its position (`size` then), and entry_type(entry id, body, checksum,
    publish time, count), entry ids from first_id. Returns (records, positions, entries, size):
    records alternate headers and bodies; `size` is past the last record."""
    cdef list records = [], positions = [], entries = []
    cdef Py_ssize_t i, body_size, header_size = header.size
    cdef object pack = header.pack
    entry_id = first_id
    for i in range(min(len(bodies), len(checksums), len(publish_times), len(counts))):
        if size >= limit:
            break
        body = bodies[i]
        kind = type(body)
        if kind is not bytes and not (kind is memoryview and type(body.obj) is bytes and body.c_contiguous):
            body = bytes(body)
        body_size = len(body)
        checksum = checksums[i]
        publish_time = publish_times[i]
        count = counts[i]
        records.append(pack(body_size, checksum, publish_time, count))
        records.append(body)
        positions.append(size)
        size += header_size + body_size
        entries.append(entry_type(entry_id, body, checksum, publish_time, count))
        entry_id += 1
    return records, positions, entries, size


def queue_send_receipts(list out, list sends, batch, producer_id, list frames, Py_ssize_t start, list ids,
                        ledger_id, duplicate):
    """Append to `out` the SEND_RECEIPT of each of frames[start:start + len(ids)], stored as
    `ids` says (a `duplicate` is answered with ledger -1), and to `sends` what answering one
    with an error instead takes: (its index in out, batch, producer_id, its sequence id).
    Returns the bytes appended."""
    cdef Py_ssize_t i, queued = 0
    cdef SendFrame frame
    cdef bytes data
    for i in range(len(ids)):
        frame = frames[start + i]
        entry_id = ids[i]
        sequence_id = frame.sequence_id
        claimed = frame.highest_sequence_id
        sends.append((len(out), batch, producer_id, sequence_id))
        data = _send_receipt(producer_id, sequence_id,
                             claimed if claimed is not None and claimed > sequence_id else sequence_id,
                             ledger_id if entry_id != duplicate else -1, entry_id)
        out.append(data)
        queued += PyBytes_GET_SIZE(data)
    return queued
