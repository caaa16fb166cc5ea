"""Frame reader, splitting, encoding and every typed error, on both twins."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsarwire import compression, errors
from pulsarwire._proto import PulsarApi_pb2 as pb

from ..helpers import PING, batch_frame, message_command, metadata, send_command

ALL_COMPRESSIONS = [compression.NONE, compression.LZ4, compression.ZLIB, compression.ZSTD,
                    compression.SNAPPY]


def read_all(twin, data, chunk=None, **kwargs):
    reader = twin.FrameReader(**kwargs)
    frames = []
    step = chunk or max(len(data), 1)
    for start in range(0, len(data), step):
        reader.feed(data[start:start + step])
        frames.extend(reader)
    reader.close()
    return frames


def test_simple_command_round_trip(twin):
    raw = twin.encode_command(PING)
    assert raw[:4] == struct.pack(">I", len(raw) - 4)
    (frame,) = read_all(twin, raw)
    assert frame.type == pb.BaseCommand.PING
    assert frame.metadata is None and frame.payload is None and not frame.checksum_verified
    assert frame.size == len(raw)
    assert twin.decode_frame(raw).type == pb.BaseCommand.PING


@pytest.mark.parametrize("kind", ALL_COMPRESSIONS, ids=lambda k: compression.NAMES[k])
def test_batch_round_trip_every_compression(twin, kind):
    payloads = [bytes([i]) * (i * 7 % 300) for i in range(60)]
    raw = batch_frame(twin, payloads, compression=kind)
    (frame,) = read_all(twin, raw, chunk=13)
    assert frame.checksum_verified
    messages = frame.messages()
    assert [m.data() for m in messages] == payloads
    assert [m.batch_index for m in messages] == list(range(60))
    assert all(m.batch_size == 60 for m in messages)
    assert messages[5].properties == {"i": "5"}
    assert messages[5].partition_key == "k5"
    assert messages[5].event_time == 1005


def test_unbatched_message_takes_fields_from_metadata(twin):
    md = metadata(partition_key="key", event_time=42, ordering_key=b"ok",
                  properties=[pb.KeyValue(key="a", value="b")], sequence_id=9)
    raw = twin.encode_payload_command(send_command(), md, b"hello")
    (message,) = twin.decode_frame(raw).messages()
    assert message.data() == b"hello"
    assert message.batch_index == -1
    assert (message.partition_key, message.event_time, message.ordering_key) == ("key", 42, b"ok")
    assert message.properties == {"a": "b"} and message.sequence_id == 9


def test_payload_size_is_the_payloads_length_batched_or_not(twin):
    """batch_receive's byte limit reads payload_size: 0 for an unbatched message let a whole
    queue through one limit (the Cython twin set no payload span for one)."""
    raw = twin.encode_payload_command(send_command(), metadata(), b"hello")
    (message,) = twin.decode_frame(raw).messages()
    assert message.payload_size == 5 == len(message.payload)
    messages = twin.decode_frame(batch_frame(twin, [b"abc", b"", b"defgh"])).messages()
    assert [m.payload_size for m in messages] == [3, 0, 5]


def test_batch_of_one_is_still_a_batch(twin):
    """Presence of num_messages_in_batch decides, not its value."""
    raw = batch_frame(twin, [b"only"])
    (message,) = twin.decode_frame(raw).messages()
    assert message.batch_index == 0 and message.batch_size == 1


def test_payload_is_zero_copy_view(twin):
    raw = batch_frame(twin, [b"abc", b"defg"])
    frame = twin.decode_frame(raw)
    assert isinstance(frame.payload, memoryview)
    assert isinstance(frame.metadata_and_payload, memoryview)
    messages = frame.messages()
    assert isinstance(messages[1].payload, memoryview)
    assert bytes(messages[1].payload) == b"defg"


def test_frame_without_magic_is_accepted_unverified(twin):
    raw = twin.encode_payload_command(message_command(), metadata(), b"payload", with_checksum=False)
    frame = twin.decode_frame(raw)
    assert not frame.checksum_verified and frame.checksum is None
    assert bytes(frame.payload) == b"payload"


def test_broker_entry_metadata_prefix(twin):
    entry = pb.BrokerEntryMetadata(broker_timestamp=123, index=77)
    raw = twin.encode_payload_command(message_command(), metadata(), b"x", broker_entry_metadata=entry)
    frame = twin.decode_frame(raw)
    assert frame.broker_entry_metadata.index == 77
    assert frame.checksum_verified and bytes(frame.payload) == b"x"


def test_stored_span_re_sent_with_known_checksum(twin):
    raw = twin.encode_payload_command(send_command(), metadata(), b"data")
    frame = twin.decode_frame(raw)
    again = twin.encode_payload_frame(message_command(), bytes(frame.metadata_and_payload), frame.checksum)
    assert bytes(twin.decode_frame(again).payload) == b"data"


def test_a_frames_head_and_its_stored_span_are_the_frame(twin):
    span = bytes(twin.decode_frame(twin.encode_payload_command(send_command(), metadata(), b"data" * 500))
                 .metadata_and_payload)
    frame = twin.encode_payload_frame(message_command(), span, 0x1234ABCD)
    assert twin.encode_payload_frame_head(message_command(), len(span), 0x1234ABCD) + span == frame


def test_many_frames_in_one_chunk_and_one_byte_chunks(twin):
    stream = b"".join([twin.encode_command(PING), batch_frame(twin, [b"a", b"b"]),
                       twin.encode_command(PING)] * 5)
    for chunk in (None, 1, 5):
        frames = read_all(twin, stream, chunk=chunk)
        assert [f.type for f in frames] == [pb.BaseCommand.PING, pb.BaseCommand.SEND, pb.BaseCommand.PING] * 5


def test_feed_copies_mutable_buffers(twin):
    raw = bytearray(twin.encode_payload_command(send_command(), metadata(), b"stable"))
    reader = twin.FrameReader()
    reader.feed(raw)
    raw[-6:] = b"XXXXXX"
    assert bytes(reader.next_frame().payload) == b"stable"


def test_incomplete_frame_waits_then_close_reports_truncation(twin):
    raw = twin.encode_command(PING)
    reader = twin.FrameReader()
    reader.feed(raw[:-1])
    assert reader.next_frame() is None
    assert reader.buffered == len(raw) - 1
    with pytest.raises(errors.TruncatedFrameError):
        reader.close()


def test_frame_too_large_is_sticky(twin):
    reader = twin.FrameReader(max_frame_size=100)
    reader.feed(struct.pack(">I", 101) + b"\0" * 10)
    with pytest.raises(errors.FrameTooLargeError):
        reader.next_frame()
    with pytest.raises(errors.FrameTooLargeError):
        reader.feed(b"more")


def test_default_max_frame_size_accepts_5mib_message(twin):
    payload = b"\xab" * (5 * 1024 * 1024)
    raw = twin.encode_payload_command(send_command(), metadata(), payload)
    assert bytes(read_all(twin, raw, chunk=65536)[0].payload) == payload
    reader = twin.FrameReader()
    reader.feed(struct.pack(">I", twin.DEFAULT_MAX_FRAME_SIZE + 1))
    with pytest.raises(errors.FrameTooLargeError):
        reader.next_frame()


@pytest.mark.parametrize("total", [0, 3])
def test_frame_too_short_for_command_size(twin, total):
    reader = twin.FrameReader()
    reader.feed(struct.pack(">I", total) + b"\0" * total)
    with pytest.raises(errors.TruncatedFrameError):
        reader.next_frame()


def test_command_size_past_frame_end(twin):
    with pytest.raises(errors.TruncatedFrameError):
        twin.decode_frame(struct.pack(">II", 8, 50) + b"\0" * 4)


def test_bad_command(twin):
    body = b"\xff\xff\xff"
    with pytest.raises(errors.BadCommandError):
        twin.decode_frame(struct.pack(">II", len(body) + 4, len(body)) + body)


def test_command_missing_required_field(twin):
    body = pb.BaseCommand(type=pb.BaseCommand.SEND).SerializePartialToString()
    body += b"\x32\x00"  # an empty CommandSend: producer_id and sequence_id missing
    with pytest.raises(errors.BadCommandError):
        twin.decode_frame(struct.pack(">II", len(body) + 4, len(body)) + body)


def test_checksum_mismatch_keeps_stream_in_sync(twin):
    good = twin.encode_payload_command(send_command(), metadata(), b"payload")
    bad = bytearray(good)
    bad[-1] ^= 0x01
    reader = twin.FrameReader()
    reader.feed(bytes(bad) + good)
    with pytest.raises(errors.ChecksumMismatchError) as info:
        reader.next_frame()
    assert info.value.command.type == pb.BaseCommand.SEND
    assert bytes(reader.next_frame().payload) == b"payload"


def test_bad_magic(twin):
    raw = bytearray(twin.encode_payload_command(send_command(), metadata(), b"payload"))
    cmd_size = struct.unpack_from(">I", raw, 4)[0]
    raw[8 + cmd_size:10 + cmd_size] = b"\x0e\x03"
    with pytest.raises(errors.BadMagicError):
        twin.decode_frame(bytes(raw))


def test_metadata_size_past_end_with_checksum(twin):
    body = send_command().SerializeToString()
    tail = struct.pack(">I", 1000) + b"\0" * 4
    from crc32c import crc32c
    raw = struct.pack(">I", 4 + len(body) + 6 + len(tail)) + struct.pack(">I", len(body)) + body
    raw += struct.pack(">HI", 0x0E01, crc32c(tail)) + tail
    with pytest.raises(errors.TruncatedFrameError):
        twin.decode_frame(raw)


def test_bad_metadata(twin):
    mp = struct.pack(">I", 3) + b"\xff\xff\xff" + b"payload"
    raw = twin.encode_payload_frame(send_command(), mp)
    with pytest.raises(errors.BadMetadataError):
        twin.decode_frame(raw)


def test_decompression_failure(twin):
    md = metadata(compression=compression.LZ4, uncompressed_size=100)
    raw = twin.encode_payload_command(send_command(), md, b"not lz4 at all")
    with pytest.raises(errors.DecompressionError):
        twin.decode_frame(raw).messages()


def test_uncompressed_size_mismatch(twin):
    data = b"z" * 1000
    md = metadata(compression=compression.ZLIB, uncompressed_size=999)
    raw = twin.encode_payload_command(send_command(), md, compression.compress(compression.ZLIB, data))
    with pytest.raises(errors.DecompressionError):
        twin.decode_frame(raw).messages()


def test_uncompressed_size_over_limit(twin):
    md = metadata(compression=compression.ZSTD, uncompressed_size=1 << 30)
    raw = twin.encode_payload_command(send_command(), md, compression.compress(compression.ZSTD, b"x"))
    with pytest.raises(errors.DecompressionError):
        twin.decode_frame(raw).messages()


@pytest.mark.parametrize("count", [0, 3, 1_000_000_000, -1])
def test_batch_count_mismatch(twin, count):
    builder = twin.BatchBuilder()
    builder.add(b"one")
    builder.add(b"two")
    md = metadata(count=count)
    with pytest.raises(errors.BadBatchError):
        twin.split_messages(md, builder.build())


def test_batch_entry_sizes_out_of_bounds(twin):
    with pytest.raises(errors.BadBatchError):
        twin.split_messages(metadata(count=1), struct.pack(">I", 100) + b"\x18\x01")
    smm = pb.SingleMessageMetadata(payload_size=50).SerializeToString()
    with pytest.raises(errors.BadBatchError):
        twin.split_messages(metadata(count=1), struct.pack(">I", len(smm)) + smm + b"short")
    smm = pb.SingleMessageMetadata(payload_size=-1).SerializeToString()
    with pytest.raises(errors.BadBatchError):
        twin.split_messages(metadata(count=1), struct.pack(">I", len(smm)) + smm)


def test_batch_entry_missing_payload_size(twin):
    smm = pb.SingleMessageMetadata(partition_key="k").SerializePartialToString()
    with pytest.raises(errors.BadBatchError):
        twin.split_messages(metadata(count=1), struct.pack(">I", len(smm)) + smm)


def test_batch_property_without_value(twin):
    smm = b"\x0a\x03\x0a\x01k" + b"\x18\x00"  # KeyValue with only a key, payload_size 0
    with pytest.raises(errors.BadBatchError):
        twin.split_messages(metadata(count=1), struct.pack(">I", len(smm)) + smm)


def test_batch_bad_utf8_is_typed_on_access(twin):
    smm = b"\x12\x02\xff\xfe" + b"\x18\x00"  # partition_key of invalid UTF-8
    (message,) = twin.split_messages(metadata(count=1), struct.pack(">I", len(smm)) + smm)
    with pytest.raises(errors.BadBatchError):
        message.partition_key


def test_unknown_smm_fields_are_skipped(twin):
    smm = pb.SingleMessageMetadata(payload_size=2, sequence_id=5).SerializeToString()
    smm += b"\xa8\x06\x01"  # field 101, varint
    smm += b"\xb1\x06" + b"\0" * 8  # field 102, fixed64
    (message,) = twin.split_messages(metadata(count=1), struct.pack(">I", len(smm)) + smm + b"hi")
    assert message.data() == b"hi" and message.sequence_id == 5


def test_errors_are_codec_errors():
    for cls in (errors.FrameTooLargeError, errors.TruncatedFrameError, errors.BadMagicError,
                errors.ChecksumMismatchError, errors.BadCommandError, errors.BadMetadataError,
                errors.DecompressionError, errors.BadBatchError):
        assert issubclass(cls, errors.CodecError)
        assert issubclass(cls, errors.PulsarWireError)


def test_server_error_table():
    err = errors.server_error(pb.TopicNotFound, "no such topic")
    assert isinstance(err, errors.TopicNotFoundError) and err.code == pb.TopicNotFound
    assert set(errors.SERVER_ERRORS) == set(pb.ServerError.values())
    assert type(errors.server_error(999, "?")) is errors.ServerError


def test_compression_names():
    assert compression.compression_type("zstd") == compression.ZSTD
    assert compression.compression_type(4) == compression.SNAPPY
    with pytest.raises(ValueError):
        compression.compression_type("brotli")


def test_max_frame_size_can_be_raised_after_connected(twin):
    reader = twin.FrameReader(max_frame_size=64)
    reader.max_frame_size = 1 << 20
    reader.feed(twin.encode_payload_command(send_command(), metadata(), b"x" * 1000))
    assert len(reader.next_frame().payload) == 1000


def test_twins_expose_the_same_api():
    from ..conftest import TWINS
    names = [sorted(n for n in dir(t) if not n.startswith("_")) for t in TWINS]
    public = {"BatchBuilder", "DEFAULT_MAX_FRAME_SIZE", "DEFAULT_MAX_MESSAGE_SIZE", "FRAME_PADDING",
              "Frame", "SendFrame", "FrameReader", "IMPLEMENTATION", "MAGIC_BROKER_ENTRY_METADATA", "MAGIC_CRC32C",
              "SingleMessage", "decode_frame", "decompress_payload", "encode_command",
              "encode_metadata_and_payload", "encode_payload_command", "encode_payload_frame",
              "encode_payload_frame_head",
              "encode_single_message_metadata", "encode_send_receipt", "encode_send", "metadata_and_payload_size",
              "split_messages",
              "Columns", "split_columns"}
    for listing in names:
        assert public <= set(listing)
    for cls in ("Frame", "SendFrame", "SingleMessage", "Columns"):
        members = [{n for n in dir(getattr(t, cls)) if not n.startswith("_")} for t in TWINS]
        assert all(m == members[0] for m in members), cls
    for cls in ("FrameReader", "BatchBuilder"):
        members = [{n for n in dir(getattr(t, cls)()) if not n.startswith("_")} for t in TWINS]
        assert all(m == members[0] for m in members), cls


def test_split_views_leave_nothing_for_the_gc_to_choke_on(twin):
    """Messages in a reference cycle are collected without 'memoryview has exported buffers'."""
    import gc
    import sys

    builder = twin.BatchBuilder()
    builder.add(b"abc")
    builder.add(b"defg")
    payload = memoryview(builder.build())[0:]
    raised = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda info: raised.append(info.exc_value)
    try:
        messages = twin.split_messages(metadata(count=2), payload)
        _ = [m.payload for m in messages]
        cycle = [messages, payload]
        cycle.append(cycle)
        del messages, payload, cycle
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert raised == []


def test_split_copies_a_mutable_payload(twin):
    builder = twin.BatchBuilder()
    builder.add(b"stable")
    raw = bytearray(builder.build())
    (message,) = twin.split_messages(metadata(count=1), raw)
    raw[-6:] = b"XXXXXX"
    assert message.data() == b"stable"


@given(chunks=st.lists(st.tuples(st.binary(min_size=1, max_size=64), st.integers(1, 2000)), max_size=20))
@settings(max_examples=150, deadline=None)
def test_lz4_blocks_decode_as_python_lz4_reads_them(chunks):
    """LZ4 blocks decode to exactly what was encoded, and a block shorter or longer than the size
    the metadata declares is an error, never bytes padded or cut to fit (cramjam's block decoder,
    faster on runs, pads a short block with zeros to the size asked: not used for this)."""
    import lz4.block
    data = b"".join(chunk * times for chunk, times in chunks)
    block = lz4.block.compress(data, store_size=False)
    out = compression.decompress(compression.LZ4, block, len(data))
    assert bytes(out) == lz4.block.decompress(block, uncompressed_size=len(data)) == data
    assert memoryview(out).readonly
    if data:
        with pytest.raises(errors.DecompressionError):
            compression.decompress(compression.LZ4, block, len(data) - 1)
        with pytest.raises(errors.DecompressionError):
            compression.decompress(compression.LZ4, block, len(data) + 1)
        with pytest.raises(errors.DecompressionError):
            compression.decompress(compression.LZ4, block[:-1], len(data))


def test_compressing_where_it_pays_leaves_a_batch_it_hardly_shrinks_and_tries_again_later(monkeypatch):
    import os

    where = compression.WhereItPays(compression.ZSTD)
    text = b"row-%d " * 2000 % tuple(range(2000))
    kind, packed = where.compress(text)
    assert kind == compression.ZSTD and len(packed) < len(text) // 4
    assert bytes(compression.decompress(kind, packed, len(text))) == text
    noise = os.urandom(64 * 1024)
    assert where.compress(noise) == (compression.NONE, noise)  # tried: it did not pay

    def skipped():
        count = 0
        while True:  # not tried, even on what would compress
            kind, same = where.compress(text)
            if kind:
                return count
            assert same is text
            count += 1
    assert skipped() == 15  # and a try that pays starts over at 15
    assert where.compress(noise)[0] == compression.NONE
    assert skipped() == 15

    tries = []
    real = compression.compress
    monkeypatch.setattr(compression, "compress", lambda kind, data: tries.append(1) or real(kind, data))
    calls_at_each_try = []
    for call in range(2000):  # tries that keep failing: 15, 31, 63 ... up to 255 skipped between them
        before = len(tries)
        assert where.compress(noise) == (compression.NONE, noise)
        if len(tries) > before:
            calls_at_each_try.append(call)
    gaps = [b - a - 1 for a, b in zip(calls_at_each_try, calls_at_each_try[1:])]
    assert gaps[:6] == [15, 31, 63, 127, 255, 255]
    with pytest.raises(ValueError):
        compression.WhereItPays(compression.NONE)
