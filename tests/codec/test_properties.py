"""Property tests: encode -> decode is the identity, our hand-written
SingleMessageMetadata agrees with protobuf's, and the twins agree."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pulsarwire import _codec_py, compression
from pulsarwire._proto import PulsarApi_pb2 as pb

from ..conftest import TWINS
from ..helpers import metadata, send_command

text = st.text(max_size=20)
entry = st.fixed_dictionaries({
    "payload": st.binary(max_size=300),
    "properties": st.dictionaries(text, text, max_size=4),
    "partition_key": st.none() | text,
    "event_time": st.integers(0, 2**64 - 1),
    "ordering_key": st.none() | st.binary(max_size=10),
    "sequence_id": st.none() | st.integers(0, 2**64 - 1),
    "null_value": st.booleans(),
})
kinds = st.sampled_from(sorted(compression.NAMES))


def _build(twin, entries):
    builder = twin.BatchBuilder()
    for e in entries:
        builder.add(e["payload"], e["properties"], e["partition_key"], e["event_time"],
                    e["ordering_key"], e["sequence_id"], e["null_value"])
    assert builder.num_messages == len(entries)
    return builder.build()


@settings(max_examples=150, deadline=None)
@given(entries=st.lists(entry, min_size=1, max_size=20), kind=kinds, chunk=st.integers(1, 500),
       checksum=st.booleans())
def test_batch_frame_round_trip(entries, kind, chunk, checksum):
    for twin in TWINS:
        raw = _build(twin, entries)
        md = metadata(count=len(entries), compression=kind, uncompressed_size=len(raw))
        frame_bytes = twin.encode_payload_command(send_command(), md, compression.compress(kind, raw),
                                                  with_checksum=checksum)
        reader = twin.FrameReader()
        frames = []
        for start in range(0, len(frame_bytes), chunk):
            reader.feed(frame_bytes[start:start + chunk])
            frames.extend(reader)
        (frame,) = frames
        assert frame.checksum_verified == checksum
        messages = frame.messages()
        assert len(messages) == len(entries)
        for got, want in zip(messages, entries):
            assert got.data() == want["payload"]
            assert got.properties == want["properties"]
            assert got.partition_key == want["partition_key"]
            assert got.event_time == want["event_time"]
            assert got.ordering_key == want["ordering_key"]
            assert got.sequence_id == want["sequence_id"]
            assert got.null_value == want["null_value"]


@settings(max_examples=200, deadline=None)
@given(e=entry)
def test_single_message_metadata_matches_protobuf(e):
    expected = pb.SingleMessageMetadata(payload_size=len(e["payload"]), event_time=e["event_time"],
                                        null_value=e["null_value"])
    for key, value in e["properties"].items():
        expected.properties.add(key=key, value=value)
    if e["partition_key"] is not None:
        expected.partition_key = e["partition_key"]
    if e["ordering_key"] is not None:
        expected.ordering_key = e["ordering_key"]
    if e["sequence_id"] is not None:
        expected.sequence_id = e["sequence_id"]
    if not e["event_time"]:
        expected.ClearField("event_time")
    if not e["null_value"]:
        expected.ClearField("null_value")
    ours = _codec_py.encode_single_message_metadata(
        len(e["payload"]), e["properties"], e["partition_key"], e["event_time"], e["ordering_key"],
        e["sequence_id"], e["null_value"])
    assert pb.SingleMessageMetadata.FromString(ours) == expected
    assert ours == expected.SerializeToString(deterministic=True)
    for twin in TWINS:
        raw = _build(twin, [e])
        assert raw[4:4 + len(ours)] == ours


@settings(max_examples=200, deadline=None)
@given(smm=st.builds(
    pb.SingleMessageMetadata, payload_size=st.integers(0, 5), partition_key=text,
    compacted_out=st.booleans(), event_time=st.integers(0, 2**64 - 1),
    partition_key_b64_encoded=st.booleans(), ordering_key=st.binary(max_size=5),
    sequence_id=st.integers(0, 2**64 - 1), null_value=st.booleans(), null_partition_key=st.booleans()))
def test_protobuf_written_metadata_decodes_identically(smm):
    raw = smm.SerializeToString()
    body = len(raw).to_bytes(4, "big") + raw + b"\x00" * smm.payload_size
    for twin in TWINS:
        (message,) = twin.split_messages(metadata(count=1), body)
        assert message.partition_key == smm.partition_key
        assert message.compacted_out == smm.compacted_out
        assert message.event_time == smm.event_time
        assert message.partition_key_b64_encoded == smm.partition_key_b64_encoded
        assert message.ordering_key == smm.ordering_key
        assert message.sequence_id == smm.sequence_id
        assert message.null_value == smm.null_value
        assert message.null_partition_key == smm.null_partition_key
        assert len(message.payload) == smm.payload_size


@settings(max_examples=300, deadline=None)
@given(producer=st.integers(0, 2**64 - 1), sequence=st.integers(0, 2**64 - 1),
       highest=st.integers(0, 2**64 - 1), ledger=st.integers(-1, 2**63 - 1), entry=st.integers(-1, 2**63 - 1))
def test_send_receipt_fast_path_matches_protobuf(producer, sequence, highest, ledger, entry):
    from pulsarwire import codec as chosen

    expected_cmd = pb.BaseCommand(type=pb.BaseCommand.SEND_RECEIPT, send_receipt=pb.CommandSendReceipt(
        producer_id=producer, sequence_id=sequence, highest_sequence_id=highest,
        message_id=pb.MessageIdData(ledgerId=ledger & (2**64 - 1), entryId=entry & (2**64 - 1))))
    expected = chosen.encode_command(expected_cmd)
    for twin in TWINS:
        assert twin.encode_send_receipt(producer, sequence, highest, ledger, entry) == expected


@settings(max_examples=300, deadline=None)
@given(producer=st.integers(0, 2**64 - 1), sequence=st.integers(0, 2**64 - 1), highest=st.integers(0, 2**64 - 1),
       count=st.integers(1, 2**31 - 1), name=st.text(max_size=40), publish=st.integers(0, 2**64 - 1),
       payload=st.binary(max_size=300), batched=st.booleans(), version=st.none() | st.binary(max_size=12),
       kind=st.integers(0, 4), unpacked=st.integers(0, 2**32 - 1))
def test_send_fast_path_matches_protobuf(producer, sequence, highest, count, name, publish, payload, batched,
                                         version, kind, unpacked):
    from pulsarwire import codec as chosen

    command = pb.BaseCommand(type=pb.BaseCommand.SEND, send=pb.CommandSend(
        producer_id=producer, sequence_id=sequence, num_messages=count))
    md = pb.MessageMetadata(producer_name=name, sequence_id=sequence, publish_time=publish)
    if highest != sequence:
        command.send.highest_sequence_id = highest
    if kind:
        md.compression = kind
        md.uncompressed_size = unpacked
    if batched:
        md.num_messages_in_batch = count
        if highest != sequence:
            md.highest_sequence_id = highest
    if version is not None:
        md.schema_version = version
    expected = chosen.encode_payload_command(command, md, payload)
    for twin in TWINS:
        frame = twin.encode_send(producer, sequence, highest, count, name, publish, payload, batched, version,
                                 kind, unpacked if kind else 0)
        assert frame == expected
        assert twin.metadata_and_payload_size(frame) == md.ByteSize() + len(payload)
        decoded = twin.decode_frame(frame)
        assert decoded.metadata == md and bytes(decoded.payload) == payload


_receipt_fields = st.fixed_dictionaries({}, optional={
    "producer_id": st.integers(0, 2**64 - 1), "sequence_id": st.integers(0, 2**64 - 1),
    "highest_sequence_id": st.integers(0, 2**64 - 1),
    "message_id": st.builds(pb.MessageIdData, ledgerId=st.integers(0, 2**64 - 1), entryId=st.integers(0, 2**64 - 1),
                            partition=st.none() | st.integers(-1, 3), batch_index=st.none() | st.integers(-1, 3)),
})


@settings(max_examples=300, deadline=None)
@given(fields=_receipt_fields)
def test_receipt_fast_path_reads_what_protobuf_reads(fields):
    """A SendReceipt read by FrameReader(receipt_fast_path=True): a ReceiptFrame holding what protobuf
    reads when the command has the common fields alone, else the full path's Frame (or its error)."""
    command = pb.BaseCommand(type=pb.BaseCommand.SEND_RECEIPT)
    command.send_receipt.SetInParent()
    for name, value in fields.items():
        if name == "message_id":
            command.send_receipt.message_id.CopyFrom(value)
        else:
            setattr(command.send_receipt, name, value)
    raw = command.SerializePartialToString()
    data = (len(raw) + 4).to_bytes(4, "big") + len(raw).to_bytes(4, "big") + raw
    common = {"producer_id", "sequence_id", "message_id"} <= set(fields) and \
        not fields["message_id"].HasField("partition") and not fields["message_id"].HasField("batch_index")
    for twin in TWINS:
        reader = twin.FrameReader(receipt_fast_path=True)
        reader.feed(data)
        try:
            frame = reader.next_frame()
        except Exception as exc:  # the full path's typed error, as without the fast path
            plain = twin.FrameReader()
            plain.feed(data)
            try:
                plain.next_frame()
            except Exception as again:
                assert type(again) is type(exc)
            else:
                raise
            assert not common
            continue
        assert (type(frame) is twin.ReceiptFrame) == common
        if common:
            r = command.send_receipt
            assert (frame.producer_id, frame.sequence_id) == (r.producer_id, r.sequence_id)
            assert frame.highest_sequence_id == (r.highest_sequence_id if r.HasField("highest_sequence_id")
                                                 else r.sequence_id)
            assert frame.ledger_id == _codec_py._signed(r.message_id.ledgerId)
            assert frame.entry_id == _codec_py._signed(r.message_id.entryId)
            assert frame.type == pb.BaseCommand.SEND_RECEIPT and frame.size == len(data)
        else:
            assert frame.command == command


_send_fields = st.fixed_dictionaries({
    "producer_id": st.integers(0, 2**64 - 1), "sequence_id": st.integers(0, 2**64 - 1),
}, optional={
    "num_messages": st.integers(-2**31, 2**31 - 1), "highest_sequence_id": st.integers(0, 2**64 - 1),
    "is_chunk": st.booleans(), "marker": st.booleans(),
    "message_id": st.builds(pb.MessageIdData, ledgerId=st.integers(0, 9), entryId=st.integers(0, 9)),
})
_metadata_fields = st.fixed_dictionaries({
    "producer_name": st.text(max_size=8), "sequence_id": st.integers(0, 2**64 - 1),
    "publish_time": st.integers(0, 2**64 - 1),
}, optional={
    "partition_key": st.text(max_size=5), "deliver_at_time": st.integers(-2**63, 2**63 - 1),
    "chunk_id": st.integers(-2**31, 2**31 - 1), "num_messages_in_batch": st.integers(0, 100),
    "compression": st.integers(0, 4), "ordering_key": st.binary(max_size=4),
    "replicate_to": st.lists(st.text(max_size=3), max_size=2),
    "properties": st.lists(st.builds(pb.KeyValue, key=st.text(max_size=3), value=st.text(max_size=3)), max_size=2),
})


def _outcome(twin, data, fast):
    reader = twin.FrameReader(send_fast_path=fast)
    try:
        reader.feed(data)
        return reader.next_frame()
    except Exception as exc:  # noqa: BLE001 - compared by type
        return type(exc)


@settings(max_examples=400, deadline=None)
@given(send=_send_fields, md=_metadata_fields, payload=st.binary(max_size=40), checksum=st.booleans(),
       flip=st.none() | st.tuples(st.integers(0, 10_000), st.integers(0, 7)))
def test_send_fast_path_agrees_with_protobuf(send, md, payload, checksum, flip):
    cmd = pb.BaseCommand(type=pb.BaseCommand.SEND, send=pb.CommandSend(**send))
    data = bytearray(TWINS[-1].encode_payload_command(cmd, pb.MessageMetadata(**md), payload,
                                                      with_checksum=checksum))
    if flip is not None:
        data[flip[0] % len(data)] ^= 1 << flip[1]
    data = bytes(data)
    for twin in TWINS:
        slow = _outcome(twin, data, fast=False)
        fast = _outcome(twin, data, fast=True)
        if isinstance(slow, type) or slow is None:
            assert fast == slow
            continue
        if type(fast).__name__ != "SendFrame":
            assert type(fast) is type(slow)  # fell back to the full path
            continue
        s, m = slow.command.send, slow.metadata
        assert slow.type == pb.BaseCommand.SEND == fast.type
        assert (fast.producer_id, fast.sequence_id, fast.num_messages, fast.is_chunk) == \
            (s.producer_id, s.sequence_id, s.num_messages, s.is_chunk)
        assert fast.highest_sequence_id == (s.highest_sequence_id if s.HasField("highest_sequence_id") else None)
        assert fast.publish_time == m.publish_time
        assert fast.deliver_at_time == (m.deliver_at_time if m.HasField("deliver_at_time") else None)
        assert fast.chunk_id == (m.chunk_id if m.HasField("chunk_id") else None)
        assert fast.num_messages_in_batch == \
            (m.num_messages_in_batch if m.HasField("num_messages_in_batch") else None)
        assert bytes(fast.metadata_and_payload) == bytes(slow.metadata_and_payload)
        assert fast.checksum == slow.checksum and fast.size == slow.size


def test_send_fast_path_takes_the_common_frame():
    for twin in TWINS:
        builder = twin.BatchBuilder()
        builder.add(b"x", properties={"a": "b"}, partition_key="k")
        md = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=9, num_messages_in_batch=1,
                                properties=[pb.KeyValue(key="x", value="y")], deliver_at_time=77)
        cmd = pb.BaseCommand(type=pb.BaseCommand.SEND, send=pb.CommandSend(producer_id=1, sequence_id=3))
        reader = twin.FrameReader(send_fast_path=True)
        reader.feed(twin.encode_payload_command(cmd, md, builder.build()))
        frame = reader.next_frame()
        assert type(frame).__name__ == "SendFrame"
        assert (frame.sequence_id, frame.publish_time, frame.deliver_at_time) == (3, 9, 77)
        assert frame.num_messages_in_batch == 1  # the broker checks the batch against it


@settings(max_examples=60, deadline=None)
@given(payload=st.binary(max_size=4096), with_checksum=st.booleans(), as_bytes=st.booleans(),
       view=st.sampled_from([bytes, bytearray, memoryview]))
def test_a_payload_frame_joined_once_is_the_frame_of_its_span(payload, with_checksum, as_bytes, view):
    """encode_payload_command joins the frame once, the checksum continued over the payload: the
    same bytes as the frame around a metadata+payload span built first."""
    md = metadata(sequence_id=7)
    given_md = md.SerializeToString() if as_bytes else md
    joined = _codec_py.encode_payload_command(send_command(), given_md, view(payload), with_checksum=with_checksum)
    spanned = _codec_py.encode_payload_frame(send_command(), _codec_py.encode_metadata_and_payload(md, payload),
                                             None, None, with_checksum)
    assert joined == spanned
