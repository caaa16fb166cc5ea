"""split_columns: the same rows and the same typed errors as split_messages (read in full),
in both twins, with identical columns; and an Arrow RecordBatch over the buffers."""
from __future__ import annotations

import random
import struct
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsarwire import _codec_py, compression, errors
from pulsarwire._proto import PulsarApi_pb2 as pb

from ..conftest import TWINS, load_scenario, scenarios
from ..helpers import metadata, send_command

FIELDS = _codec_py._COLUMN_FIELDS
ROW_KEYS = ("payload", "properties", "partition_key", "partition_key_b64_encoded", "ordering_key",
            "event_time", "sequence_id", "null_value", "null_partition_key", "compacted_out", "batch_index")


def message_rows(twin, md, payload):
    """split_messages, every field read (that is when it checks UTF-8), as Columns.row gives them."""
    return [{key: (message.data() if key == "payload" else getattr(message, key)) for key in ROW_KEYS}
            for message in twin.split_messages(md, payload)]


def column_rows(columns):
    return [columns.row(index) for index in range(len(columns))]


def plain(columns):
    """A Columns' fields as plain values, to compare the twins' (each has its own class)."""
    out = {}
    for name in FIELDS:
        value = getattr(columns, name)
        if isinstance(value, array):
            out[name] = (value.typecode, value.tolist())
        elif isinstance(value, bytearray):
            out[name] = bytes(value)
        else:
            out[name] = value
    return out


def verdict(fn):
    try:
        return ("ok", fn())
    except errors.CodecError as exc:
        return ("error", type(exc).__name__)


def check_agrees(md, payload):
    """Every twin's split_columns gives split_messages' rows or its error type; the twins agree."""
    verdicts = set()
    columns_seen = []
    for twin in TWINS:
        messages = verdict(lambda: message_rows(twin, md, payload))
        columns = verdict(lambda: twin.split_columns(md, payload))
        if columns[0] == "ok":
            columns_seen.append(plain(columns[1]))
            columns = ("ok", column_rows(columns[1]))
        assert columns == messages, twin.IMPLEMENTATION
        verdicts.add(repr(columns))
    assert len(verdicts) == 1
    assert all(seen == columns_seen[0] for seen in columns_seen)
    return columns


def batch(smms_and_payloads):
    return b"".join(struct.pack(">I", len(smm)) + smm + payload for smm, payload in smms_and_payloads)


# --- random batches ---------------------------------------------------------------

text = st.text(max_size=8)
# Extra fields appended to a SingleMessageMetadata: unknown ones, and known ones again (last wins).
extra_fields = st.lists(st.sampled_from([
    b"\xa8\x06\x01", b"\xb1\x06" + bytes(8), b"\xbd\x06" + bytes(4), b"\xc2\x06\x02hi",  # unknown fields
    b"\x12\x01z", b"\x3a\x00", b"\x40\x07", b"\x28\x00", b"\x48\x00", b"\x48\x01", b"\x20\x01",
    b"\x30\x00", b"\x50\x01", b"\x0a\x06\x0a\x01a\x12\x01b", b"\x0a\x09\x0a\x01a\x12\x01b\x0a\x01c",
]), max_size=3)
smm_message = st.builds(
    pb.SingleMessageMetadata,
    properties=st.lists(st.builds(pb.KeyValue, key=text, value=text), max_size=6),
    partition_key=st.none() | text, compacted_out=st.none() | st.booleans(),
    event_time=st.none() | st.integers(0, 2**64 - 1), partition_key_b64_encoded=st.none() | st.booleans(),
    ordering_key=st.none() | st.binary(max_size=6), sequence_id=st.none() | st.integers(0, 2**64 - 1),
    null_value=st.none() | st.booleans(), null_partition_key=st.none() | st.booleans())


@st.composite
def entries(draw):
    smm = draw(smm_message)
    payload = draw(st.binary(max_size=200))
    smm.payload_size = len(payload)
    return smm.SerializeToString() + b"".join(draw(extra_fields)), payload


@settings(max_examples=300, deadline=None)
@given(batch_entries=st.lists(entries(), max_size=30))
def test_columns_match_messages_on_random_batches(batch_entries):
    payload = batch(batch_entries)
    kind, rows = check_agrees(metadata(count=len(batch_entries)), payload)
    assert kind == "ok" and len(rows) == len(batch_entries)


@settings(max_examples=150, deadline=None)
@given(entry=st.fixed_dictionaries({
    "payload": st.binary(max_size=300), "properties": st.dictionaries(text, text, max_size=4),
    "partition_key": st.none() | text, "event_time": st.integers(0, 2**64 - 1),
    "ordering_key": st.none() | st.binary(max_size=10), "sequence_id": st.none() | st.integers(0, 2**64 - 1),
    "null_value": st.booleans()}), count=st.integers(1, 40))
def test_batch_builder_batches_round_trip(entry, count):
    for twin in TWINS:
        builder = twin.BatchBuilder()
        for _ in range(count):
            builder.add(entry["payload"], entry["properties"], entry["partition_key"], entry["event_time"],
                        entry["ordering_key"], entry["sequence_id"], entry["null_value"])
        columns = twin.split_columns(metadata(count=count), builder.build())
        assert len(columns) == count
        want = dict(entry, batch_index=0, partition_key_b64_encoded=False, null_partition_key=False,
                    compacted_out=False)
        assert columns.row(0) == want
        assert bytes(columns.payloads) == entry["payload"] * count
        assert columns.batch_indexes.tolist() == list(range(count))


# --- text, layout, limits -----------------------------------------------------------

UTF8_EDGES = [b"", b"a", b"\x7f", b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xee\x80\x80",
              b"\xef\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf0\x9f\x98\x80",
              b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xc2", b"\xc2\x41", b"\xe0\x80\x80", b"\xe0\x9f\xbf",
              b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xe1\x80", b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf",
              b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xff", b"\xf0\x90\x80", b"a\xe2\x82\xacb"]


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.sampled_from(UTF8_EDGES), st.binary(max_size=12), st.text(max_size=6).map(str.encode),
                     st.lists(st.sampled_from(UTF8_EDGES), max_size=4).map(b"".join)),
       where=st.sampled_from(["partition_key", "property_key", "property_value", "ordering_key"]))
def test_text_is_checked_as_python_decodes_utf8(raw, where):
    def field(tag, data):
        return bytes([tag, len(data)]) + data
    if where == "partition_key":
        smm = field(0x12, raw)
    elif where == "ordering_key":
        smm = field(0x3A, raw)  # bytes, not text: never checked
    else:
        pair = (raw, b"v") if where == "property_key" else (b"k", raw)
        smm = field(0x0A, field(0x0A, pair[0]) + field(0x12, pair[1]))
    smm += b"\x18\x00"
    try:
        raw.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = where == "ordering_key"
    kind, _ = check_agrees(metadata(count=1), batch([(smm, b"")]))
    assert kind == ("ok" if valid else "error")


def _field(tag, data):
    return bytes([tag, len(data)]) + data


def test_repeated_fields_keep_the_last_and_every_property_pair(twin):
    first = _field(0x0A, _field(0x0A, b"a") + _field(0x12, b"x") + _field(0x0A, b"b") + _field(0x12, b"y")
                   + _field(0x0A, b"c"))  # a KeyValue whose key and value repeat: the last of each counts
    more = [(b"p", b"1"), (b"q", b"2"), (b"r", b"3"), (b"s", b"4"), (b"t", b"5"), (b"p", b"6")]
    properties = first + b"".join(_field(0x0A, _field(0x0A, k) + _field(0x12, v)) for k, v in more)
    smm = _field(0x12, b"k") + _field(0x12, b"kk") + properties + b"\x48\x01\x48\x00\x40\x05\x18\x02"
    payload = batch([(smm, b"hi")])
    columns = twin.split_columns(metadata(count=1), payload)
    assert column_rows(columns) == message_rows(twin, metadata(count=1), payload)
    row = columns.row(0)
    assert row["partition_key"] == "kk" and row["null_value"] is False and row["sequence_id"] == 5
    assert row["properties"] == {"c": "y", "p": "6", "q": "2", "r": "3", "s": "4", "t": "5"}
    keys, values = columns.property_key_offsets, columns.property_value_offsets
    pairs = [(bytes(columns.property_keys[keys[i]:keys[i + 1]]), bytes(columns.property_values[values[i]:values[i + 1]]))
             for i in range(len(keys) - 1)]
    assert pairs == [(b"c", b"y")] + more  # every pair, in order
    assert columns.property_offsets.tolist() == [0, 7]


def test_layout_is_arrow_style(twin):
    builder = twin.BatchBuilder()
    builder.add(b"one", properties={"a": "1"}, partition_key="k", event_time=7, sequence_id=3)
    builder.add(b"", ordering_key=b"o", null_value=True)
    builder.add(b"three", properties={"b": "2", "c": "3"})
    columns = twin.split_columns(metadata(count=3), builder.build())
    assert columns.count == len(columns) == 3
    assert type(columns.payloads) is bytearray and bytes(columns.payloads) == b"onethree"
    assert columns.payload_offsets == array("q", [0, 3, 3, 8])
    assert bytes(columns.partition_keys) == b"k" and columns.partition_key_offsets == array("q", [0, 1, 1, 1])
    assert columns.has_partition_key == bytearray([0b001])
    assert bytes(columns.ordering_keys) == b"o" and columns.ordering_key_offsets == array("q", [0, 0, 1, 1])
    assert columns.has_ordering_key == bytearray([0b010])
    assert columns.property_offsets == array("q", [0, 1, 1, 3])
    assert bytes(columns.property_keys) == b"abc" and columns.property_key_offsets == array("q", [0, 1, 2, 3])
    assert bytes(columns.property_values) == b"123" and columns.property_value_offsets == array("q", [0, 1, 2, 3])
    assert columns.event_times == array("Q", [7, 0, 0])
    assert columns.sequence_ids == array("Q", [3, 0, 0]) and columns.has_sequence_id == bytearray([0b001])
    assert columns.batch_indexes == array("q", [0, 1, 2])
    assert columns.null_value == bytearray([0b010])
    assert columns.compacted_out == columns.null_partition_key == columns.partition_key_b64_encoded == bytearray(1)
    with pytest.raises(AttributeError):
        columns.count = 4
    with pytest.raises(IndexError):
        columns.row(3)
    assert "3 rows" in repr(columns)


def test_large_and_many_messages(twin):
    payloads = [bytes([i % 251]) * size for i, size in enumerate([0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65,
                                                                   100, 511, 512, 513, 4096, 100_000])]
    builder = twin.BatchBuilder()
    for index, payload in enumerate(payloads):
        builder.add(payload, partition_key="k" * index)
    columns = twin.split_columns(metadata(count=len(payloads)), builder.build())
    assert [row["payload"] for row in column_rows(columns)] == payloads
    assert [row["partition_key"] for row in column_rows(columns)] == ["k" * i for i in range(len(payloads))]

    builder = twin.BatchBuilder()
    for index in range(5000):
        builder.add(b"m%d" % index, properties={"i": str(index)} if index % 7 == 0 else None)
    columns = twin.split_columns(metadata(count=5000), memoryview(builder.build()))
    assert columns.row(4998)["payload"] == b"m4998" and columns.row(4998)["properties"] == {"i": "4998"}
    assert columns.property_offsets[-1] == len(range(0, 5000, 7))


def test_payload_of_any_buffer_type(twin):
    builder = twin.BatchBuilder()
    builder.add(b"abc", partition_key="k")
    raw = builder.build()
    expected = plain(twin.split_columns(metadata(count=1), raw))
    for payload in (bytearray(raw), memoryview(raw), memoryview(bytearray(raw)), memoryview(raw + raw)[:len(raw)],
                    array("B", raw)):
        assert plain(twin.split_columns(metadata(count=1), payload)) == expected
    strided = memoryview(bytes(b for b in raw for _ in range(2)))[::2]  # not contiguous
    assert plain(twin.split_columns(metadata(count=1), strided)) == expected
    with pytest.raises(TypeError):
        twin.split_columns(metadata(count=1), 5)


# --- the fast layouts: SingleMessageMetadata as the clients write it, and its near misses ---------
#
# The Cython twin splits rows of two common layouts without the general parser: payload_size and
# a sequence_id; and properties, partition_key, payload_size, event_time, sequence_id in field
# order with one-byte sizes. Anything else, errors included, goes the general way. These batches
# mix the layouts with their near misses, so both ways meet in one batch and must agree.

_varint = _codec_py.varint_bytes


def _sized(tag, data):
    return bytes([tag]) + _varint(len(data)) + data


def _pair(key, value):
    return _sized(0x0A, _sized(0x0A, key) + _sized(0x12, value))


TEXTS = [b"", b"k", b"key-1", b"\xc3\xa9", b"\xe2\x82\xac" * 3, b"\xf0\x9f\x98\x80", b"x" * 15, b"y" * 16,
         b"z" * 17, b"w" * 127, b"v" * 128, b"\xff", b"a\xed\xa0\x80", b"\xc2", b"ok\x80"]
fast_texts = st.sampled_from(TEXTS) | st.text(max_size=20).map(str.encode)
big_ints = st.sampled_from([0, 1, 127, 128, 16383, 16384, 2**32, 1_700_000_000_000, 2**63 - 1, 2**63, 2**64 - 1])


@st.composite
def fast_layout_entries(draw):
    """An entry in (or near) the keyed layout: its fields in field order, or shuffled, cut or
    bent, with text that is sometimes not UTF-8; payload_size fits its payload (mostly)."""
    payload = draw(st.sampled_from([b"", b"p", b"x" * 100]) | st.binary(max_size=40))
    fields = [_pair(draw(fast_texts), draw(fast_texts)) for _ in range(draw(st.integers(0, 7)))]
    if draw(st.booleans()):
        fields.append(_sized(0x12, draw(fast_texts)))
    size = len(payload) if draw(st.integers(0, 9)) else draw(st.integers(0, 2**64 - 1))
    fields.append(b"\x18" + _varint(size))
    if draw(st.booleans()):
        fields.append(b"\x28" + _varint(draw(big_ints | st.integers(0, 2**64 - 1))))
    if draw(st.booleans()):
        fields.append(b"\x40" + _varint(draw(big_ints | st.integers(0, 2**64 - 1))))
    change = draw(st.integers(0, 9))
    if change == 1:  # a field out of order
        fields = draw(st.permutations(fields))
    elif change == 2:  # another field among them: ordering key, a flag, an unknown one
        extra = draw(st.sampled_from([b"\x3a\x02ok", b"\x48\x01", b"\x20\x00", b"\x30\x01", b"\xa8\x06\x01",
                                      _sized(0x0A, _sized(0x12, b"v") + _sized(0x0A, b"k")),  # value first
                                      _sized(0x0A, _sized(0x0A, b"k")),  # no value
                                      _sized(0x0A, _sized(0x0A, b"k") + _sized(0x12, b"v") + b"\x18\x01")]))
        fields.insert(draw(st.integers(0, len(fields))), extra)
    smm = b"".join(fields)
    if change == 3 and smm:  # cut: varints and sizes run past the end
        smm = smm[:draw(st.integers(0, len(smm) - 1))]
    elif change == 4 and smm:  # one byte changed
        at = draw(st.integers(0, len(smm) - 1))
        smm = smm[:at] + bytes([draw(st.integers(0, 255))]) + smm[at + 1:]
    return smm, payload


@st.composite
def fast_layout_batches(draw):
    """Entries of the keyed layout, the plain one (payload_size, sequence_id) and the general one."""
    plain_entry = st.builds(lambda payload, sequence, extra: (b"\x18" + _varint(len(payload)) + (
        b"" if sequence is None else b"\x40" + _varint(sequence)) + extra, payload),
        st.binary(max_size=300), st.none() | big_ints,
        st.sampled_from([b""] * 6 + [b"\x48\x01", b"\x40\x05", b"\x12\x01k", b"\x40", b"\x80"]))
    return draw(st.lists(fast_layout_entries() | plain_entry | entries(), min_size=1, max_size=80))


@settings(max_examples=400, deadline=None)
@given(batch_entries=fast_layout_batches(), count_change=st.sampled_from([0, 0, 0, 0, 0, -1, 1]),
       tail=st.sampled_from([b"", b"", b"", b"\x00", b"\x00\x00\x00\x05\x18"]))
def test_fast_layouts_and_their_near_misses_agree(batch_entries, count_change, tail):
    check_agrees(metadata(count=len(batch_entries) + count_change), batch(batch_entries) + tail)


def test_fast_layout_edges():
    utf8 = "é€😀".encode()
    cases = {
        "keyed, every field": [(_pair(b"k", b"1") + _sized(0x12, b"key-1") + b"\x18\x01\x28\x05\x40\x07", b"a")],
        "empty strings": [(_pair(b"", b"") + _sized(0x12, b"") + b"\x18\x00", b"")],
        "non-ASCII UTF-8": [(_pair(utf8, utf8) + _sized(0x12, utf8) + b"\x18\x01", b"a")] * 3,
        "many properties": [(b"".join(_pair(b"k%d" % i, b"v%d" % i) for i in range(n)) + b"\x18\x00", b"")
                            for n in range(10)],
        "one-byte sizes at their edge": [(_pair(b"k" * 61, b"v" * 61) + _sized(0x12, b"p" * 127) + b"\x18\x00", b"")],
        "two-byte sizes": [(_pair(b"k" * 200, b"v") + _sized(0x12, b"p" * 128) + b"\x18\x00", b"")],
        "ten-byte varints": [(b"\x18\x00\x28" + _varint(2**64 - 1) + b"\x40" + _varint(2**63), b"")],
        "large payload": [(_sized(0x12, b"k") + b"\x18" + _varint(20000), b"p" * 20000)],
        "keys after payload_size": [(b"\x18\x00" + _sized(0x12, b"k") + _pair(b"a", b"b"), b"")],
        "event time before payload_size": [(_sized(0x12, b"k") + b"\x28\x05\x18\x00", b"")],
        "sequence id before event time": [(_sized(0x12, b"k") + b"\x18\x00\x40\x07\x28\x05", b"")],
        "partition key twice": [(_sized(0x12, b"a") + _sized(0x12, b"b") + b"\x18\x00", b"")],
        "text at the very end": [(b"\x18\x00", b"")] * 3 + [(_pair(b"k", b"v") + _sized(0x12, b"pk") + b"\x18\x00", b"")],
        "columns outgrow their first size": [(_pair(b"", b"") + _sized(0x12, b"") + b"\x18\x00", b"")]
        + [(_pair(b"k" * 50, b"v" * 60) + _sized(0x12, b"p" * 100) + b"\x18\x00", b"")] * 40
        + [(_sized(0x12, b"q" * 200) + b"\x3a\x01o\x18\x00", b"")] * 5,
        "keyed rows after plain ones": [(b"\x18\x01\x40\x01", b"a")] * 70 + [(_pair(b"k", b"v") + b"\x18\x00", b"")] * 70,
        "mixed rows": [(b"\x18\x01", b"a"), (_pair(b"k", b"v") + b"\x18\x00", b""), (b"\x3a\x01o\x18\x00", b""),
                       (_sized(0x12, b"pk") + b"\x18\x01\x28\x09", b"b"), (b"\x18\x00\x40\x03", b"")] * 30,
    }
    for name, entries_ in cases.items():
        kind, rows = check_agrees(metadata(count=len(entries_)), batch(entries_))
        assert kind == "ok", name
    errors_ = {
        "event time cut": [(_sized(0x12, b"k") + b"\x18\x00\x28\x80", b"")],
        "sequence id cut": [(_pair(b"k", b"v") + b"\x18\x00\x40\xff\xff", b"")],
        "payload size cut": [(_pair(b"k", b"v") + b"\x18\x80", b"")],
        "key size past the end": [(b"\x12\x7f\x18\x00", b"")],
        "key size past its KeyValue": [(_sized(0x0A, b"\x0a\x05k\x12\x01v") + b"\x18\x00", b"")],
        "bad UTF-8 partition key": [(_sized(0x12, b"\xc3") + b"\x18\x00", b"")],
        "bad UTF-8 property key": [(_pair(b"\xed\xa0\x80", b"v") + b"\x18\x00", b"")],
        "bad UTF-8 property value, fifth property": [(b"".join(_pair(b"k", b"v") for _ in range(4))
                                                      + _pair(b"k", b"\xff") + b"\x18\x00", b"")],
        "payload past the end": [(_pair(b"k", b"v") + b"\x18\x05", b"abc")],
        "no payload size": [(_pair(b"k", b"v") + _sized(0x12, b"k"), b"")],
        "bad row after good ones": [(_pair(b"k", b"v") + b"\x18\x00", b"")] * 100 + [(_pair(b"k", b"\xff") + b"\x18\x00", b"")],
    }
    for name, entries_ in errors_.items():
        assert check_agrees(metadata(count=len(entries_)), batch(entries_)) == ("error", "BadBatchError"), name


@st.composite
def repeated_layout_batches(draw):
    """Rows that repeat one keyed layout (the same fields, sizes and varint lengths, other bytes),
    as a producer's batch does, with now and then a row that departs from it in one place: text
    that is not ASCII (UTF-8 or not), a varint of another length, event_time 0, a payload_size
    past the end, a property more or less. The Cython twin matches such rows against the layout
    of the row before; they must split as split_messages reads them."""
    pair_count = draw(st.integers(0, 3))
    key_size = draw(st.sampled_from([None, 0, 1, 5, 16, 17]))
    # strings and payloads at the bounds of the fixed moves that copy them (16 bytes; payloads
    # in 16-byte steps from 16 to 256)
    text_size = draw(st.sampled_from([0, 1, 2, 3, 6, 15, 16, 17]))
    event_time = draw(st.sampled_from([None, 1, 127, 200, 2**40]))
    sequence = draw(st.sampled_from([None, 0, 5, 300]))
    payload_size = draw(st.sampled_from([0, 1, 15, 16, 17, 100, 200, 256, 257]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    rows = []
    for index in range(draw(st.integers(1, 60))):
        def text(size):
            return bytes(rng.choice(b"abcxyz0123456789") for _ in range(size))
        pairs = pair_count
        strings = [text(text_size) for _ in range(2 * pairs)]
        key = None if key_size is None else text(key_size)
        event, seq, size = event_time, sequence, payload_size
        departure = rng.randrange(14)
        if departure in (0, 1):  # non-ASCII bytes in place of ASCII ones: the sizes stay
            texts = [i for i, string in enumerate(strings) if string] + ([-1] if key else [])
            if texts:
                at = rng.choice(texts)
                string = key if at == -1 else strings[at]
                where = rng.randrange(len(string))
                bent = rng.choice([b"\xff", b"\x80", b"\xc3", b"\xc3\xa9", b"\xed\xa0"])[:len(string) - where]
                string = string[:where] + bent + string[where + len(bent):]
                if at == -1:
                    key = string
                else:
                    strings[at] = string
        elif departure == 2 and event is not None:
            event = rng.choice([0, event * 200 + 1, 2**64 - 1])
        elif departure == 3 and seq is not None:
            seq = rng.choice([seq * 1000 + 1, 2**63])
        elif departure == 4:
            size = rng.choice([size + 1, size + 100000, 2**40])
        elif departure == 5:
            pairs = max(0, pairs + rng.choice([-1, 1]))
            strings = [text(text_size) for _ in range(2 * pairs)]
        smm = b"".join(_pair(strings[2 * i], strings[2 * i + 1]) for i in range(pairs))
        if key is not None:
            smm += _sized(0x12, key)
        smm += b"\x18" + _varint(size)
        if event is not None:
            smm += b"\x28" + _varint(event)
        if seq is not None:
            smm += b"\x40" + _varint(seq + index)
        rows.append((smm, bytes(rng.randrange(256) for _ in range(min(payload_size, size)))))
    return rows


@settings(max_examples=300, deadline=None)
@given(batch_entries=repeated_layout_batches(), tail=st.sampled_from([b"", b"", b"\x00"]))
def test_rows_repeating_a_layout_and_rows_departing_from_it_agree(batch_entries, tail):
    check_agrees(metadata(count=len(batch_entries)), batch(batch_entries) + tail)


def test_repeated_rows_fill_columns_made_before_them():
    # rows of one layout after rows that made columns the layout does not fill (ordering keys,
    # partition keys, properties, sequence ids): each of those columns gets an empty span or
    # nothing for every such row
    layout = _pair(b"k", b"123") + _sized(0x12, b"key-1") + b"\x18\x64\x28\x81\x01"
    makers = {
        "ordering key": b"\x3a\x02ok\x18\x64",
        "partition key only": _sized(0x12, b"pk") + b"\x18\x64",
        "two pairs": _pair(b"a", b"b") * 2 + b"\x18\x64",
        "sequence id": b"\x18\x64\x40\x05",
    }
    for name, maker in makers.items():
        rows = [(maker, b"m" * 100)] + [(layout, bytes([i % 256]) * 100) for i in range(200)]
        rows += [(maker, b"n" * 100)] + [(layout, b"o" * 100)] * 50
        kind, columns = check_agrees(metadata(count=len(rows)), batch(rows))
        assert kind == "ok" and len(columns) == 252, name
    # rows of one layout without properties or a partition key after rows with them
    plain_layout = b"\x18\x64\x28\x81\x01"
    rows = [(layout, b"a" * 100)] * 3 + [(plain_layout, b"b" * 100)] * 100
    kind, columns = check_agrees(metadata(count=len(rows)), batch(rows))
    assert kind == "ok" and columns[-1]["partition_key"] is None and columns[-1]["properties"] == {}


def test_a_layout_repeated_to_the_batch_end_splits_every_row():
    # the last rows leave too few bytes after them for the layout's compare: read the general way
    rows = [(_pair(b"k", b"%d" % (i % 10)) + _sized(0x12, b"key-%d" % (i % 8)) + b"\x18\x00\x28\x05", b"")
            for i in range(50)]
    kind, columns = check_agrees(metadata(count=len(rows)), batch(rows))
    assert kind == "ok" and len(columns) == 50


def _overlong(value, length):
    """value as a varint of exactly `length` bytes (padded with continuation bytes when longer
    than it needs): decoders take it, and a row in it must not pass for a row in the short form."""
    groups = [(value >> (7 * i)) & 0x7F for i in range(length)]
    return bytes(group | 0x80 for group in groups[:-1]) + bytes([groups[-1]])


@st.composite
def repeated_plain_batches(draw):
    """Rows of the plain layout (payload_size, and a sequence_id as the official clients write)
    that repeat one another's layout, with now and then a row that departs from it: another
    payload size (its varint as long or longer), a sequence id of another length or encoded
    overlong, its bytes split into two fields, no sequence id, or a field more. The Cython
    twin takes rows that repeat the row before them at a constant stride; they must split as
    split_messages reads them."""
    payload_size = draw(st.sampled_from([0, 1, 5, 15, 16, 17, 32, 33, 100, 127, 128, 200, 256, 257, 1000]))
    sequence = draw(st.sampled_from([None, 0, 100, 1000, 16383, 2**21, 2**40, 2**55, 2**63]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    rows = []
    for index in range(draw(st.integers(1, 80))):
        size, seq = payload_size, None if sequence is None else sequence + index
        size_field = b"\x18" + _varint(size)
        seq_field = b"" if seq is None else b"\x40" + _varint(seq)
        extra = b""
        departure = rng.randrange(16)
        if departure == 0:
            size = rng.choice([size + 1, max(size - 1, 0), size + 128, 0])
            size_field = b"\x18" + _varint(size)
        elif departure == 1:  # the same value in a longer varint
            size_field = b"\x18" + _overlong(size, len(_varint(size)) + rng.choice([1, 2]))
        elif departure == 2 and seq is not None:
            seq_field = b"\x40" + _overlong(seq, len(_varint(seq)) + 1)
        elif departure == 3 and seq is not None:
            seq = rng.choice([seq * 200 + 1, seq // 200, 2**64 - 1])
            seq_field = b"\x40" + _varint(seq)
        elif departure == 4:
            seq_field = b"" if seq is not None else b"\x40" + _varint(rng.randrange(2**20))
        elif departure == 5:
            extra = rng.choice([b"\x48\x01", b"\x40\x05", b"\x12\x01k", b"\x28\x01"])
        elif departure == 7 and seq is not None and len(seq_field) >= 4:
            # the same metadata size, but the sequence id's bytes hold two fields (last wins)
            seq_field = b"\x40" + bytes([seq & 0x7F]) + b"\x40" + _overlong(seq >> 7, len(seq_field) - 3)
        elif departure == 6:  # a payload_size past the end of the batch
            size_field = b"\x18" + _varint(rng.choice([size + 100000, 2**40]))
        rows.append((size_field + seq_field + extra, bytes(rng.randrange(256) for _ in range(size))))
    return rows


@settings(max_examples=300, deadline=None)
@given(batch_entries=repeated_plain_batches(), count_change=st.sampled_from([0, 0, 0, 0, -1, 1]),
       tail=st.sampled_from([b"", b"", b"\x00", b"\x00\x00\x00\x02\x18"]))
def test_plain_rows_repeating_a_layout_and_rows_departing_from_it_agree(batch_entries, count_change, tail):
    check_agrees(metadata(count=len(batch_entries) + count_change), batch(batch_entries) + tail)


def test_plain_rows_repeated_to_the_batch_end_split_every_row():
    for sequence in (None, 5, 1000, 2**40):
        for payload in (b"", b"p", b"x" * 100, b"y" * 300):
            rows = [(b"\x18" + _varint(len(payload)) + (b"" if sequence is None else b"\x40" + _varint(sequence + i)),
                     payload) for i in range(70)]
            kind, columns = check_agrees(metadata(count=len(rows)), batch(rows))
            assert kind == "ok" and len(columns) == 70
            if sequence is not None:
                assert [row["sequence_id"] for row in columns] == [sequence + i for i in range(70)]


def test_layout_repeats_that_outgrow_a_column_first_size():
    # a column is first sized from the row that makes it: rows of a repeated layout with longer
    # strings after it must make room as they go, in every string column (short strings: the
    # layout's metadata is at most 32 bytes)
    for first, pair_text, key in ((b"", b"k" * 3, b"p" * 6), (b"a", b"b" * 4, b"c" * 9), (b"", b"\xc3\xa9", b"x" * 7)):
        rows = [(_pair(first, first) + _sized(0x12, first) + b"\x18\x01", b"p")]
        rows += [(_pair(pair_text, pair_text) + _sized(0x12, key) + b"\x18\x01\x28" + _varint(1000 + i), b"q")
                 for i in range(300)]
        kind, columns = check_agrees(metadata(count=len(rows)), batch(rows))
        assert kind == "ok" and [row["partition_key"] for row in columns][-1] == key.decode()
    # and more property pairs per row than the first row had
    rows = [(_pair(b"a", b"b") + b"\x18\x01", b"p")] + [(_pair(b"", b"") * 4 + b"\x18\x01", b"q")] * 300
    kind, columns = check_agrees(metadata(count=len(rows)), batch(rows))
    assert kind == "ok" and len(columns[-1]["properties"]) == 1


# --- errors: the same as split_messages --------------------------------------------------

BAD_BATCHES = {
    "count too high": (3, batch([(b"\x18\x01", b"a")])),
    "count zero": (0, batch([(b"\x18\x01", b"a")])),
    "count negative": (-1, b""),
    "count absurd": (1_000_000_000, batch([(b"\x18\x01", b"a")])),
    "metadata size past end": (1, struct.pack(">I", 100) + b"\x18\x01"),
    "cut header": (2, batch([(b"\x18\x00", b"")]) + b"\x00\x00"),
    "payload past end": (1, batch([(b"\x18\x32", b"short")])),
    "negative payload size": (1, batch([(pb.SingleMessageMetadata(payload_size=-1).SerializeToString(), b"")])),
    "no payload size": (1, batch([(b"\x12\x01k", b"")])),
    "property without value": (1, batch([(b"\x0a\x03\x0a\x01k\x18\x00", b"")])),
    "property past end": (1, batch([(b"\x0a\x09\x0a\x01k\x18\x00", b"")])),
    "key past its KeyValue": (1, batch([(b"\x0a\x03\x0a\x05k\x18\x00", b"")])),
    "varint past end": (1, batch([(b"\x18\x80", b"")])),
    "varint too long": (1, batch([(b"\x18" + b"\xff" * 10 + b"\x01", b"")])),
    "bad wire type": (1, batch([(b"\x1b\x18\x00", b"")])),
    "fixed64 past end": (1, batch([(b"\x18\x00\xb1\x06\x00", b"")])),
    "partition key past end": (1, batch([(b"\x18\x00\x12\x05ab", b"")])),
    "ordering key past end": (1, batch([(b"\x18\x00\x3a\x05ab", b"")])),
    "bytes left over": (1, batch([(b"\x18\x00", b"")]) + b"\x00"),
    "bad utf-8 key": (1, batch([(b"\x12\x02\xff\xfe\x18\x00", b"")])),
    "bad utf-8 property": (1, batch([(b"\x0a\x07\x0a\x01k\x12\x02\xed\xa0\x18\x00", b"")])),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_malformed_batches_raise_what_split_messages_raises(case):
    count, payload = BAD_BATCHES[case]
    assert check_agrees(metadata(count=count), payload) == ("error", "BadBatchError")


def _mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not data:
            break
        op = rng.random()
        pos = rng.randrange(len(data))
        if op < 0.5:
            data[pos] ^= 1 << rng.randrange(8)
        elif op < 0.7:
            data[pos] = rng.randrange(256)
        elif op < 0.85:
            del data[pos:pos + rng.randint(1, 8)]
        else:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
    return bytes(data)


def _random_batch(rng):
    builder = _codec_py.BatchBuilder()
    count = rng.randint(1, 6)
    for index in range(count):
        builder.add(bytes(rng.randrange(256) for _ in range(rng.randint(0, 20))),
                    properties={"k%d" % i: "é" * i for i in range(rng.randint(0, 2))},
                    partition_key=rng.choice([None, "", "key", "ключ"]), event_time=rng.choice([0, 1, 2**40]),
                    ordering_key=rng.choice([None, b"", b"ok"]), sequence_id=rng.choice([None, 0, index]),
                    null_value=rng.random() < 0.2)
    return count, builder.build()


@pytest.mark.parametrize("seed", range(4))
def test_mutated_batches_agree(seed):
    rng = random.Random(seed)
    outcomes = set()
    for _ in range(300):
        count, payload = _random_batch(rng)
        count += rng.choice([0, 0, 0, 0, -1, 1])
        kind, _ = check_agrees(metadata(count=count), _mutate(rng, payload))
        outcomes.add(kind)
    assert outcomes == {"ok", "error"}  # the mutations reach both


# --- not a batch; frames -------------------------------------------------------------

def test_a_payload_that_is_not_a_batch_is_one_row(twin):
    md = metadata(sequence_id=9, partition_key="pk", ordering_key=b"ok", event_time=5, null_value=True,
                  partition_key_b64_encoded=True, null_partition_key=True,
                  properties=[pb.KeyValue(key="a", value="1"), pb.KeyValue(key="a", value="2")])
    columns = twin.split_columns(md, b"body")
    assert column_rows(columns) == message_rows(twin, md, b"body")
    assert columns.row(0)["batch_index"] == -1 and columns.row(0)["sequence_id"] == 9
    assert columns.property_offsets.tolist() == [0, 2]  # both pairs, as carried
    assert check_agrees(metadata(), b"")[1][0]["payload"] == b""


def test_a_non_batch_string_that_is_not_utf8_is_typed(twin):
    raw = metadata().SerializeToString() + b"\x32\x02\xff\xfe"  # partition_key, not UTF-8
    md = pb.MessageMetadata.FromString(raw)
    with pytest.raises(errors.BadMetadataError):
        twin.split_columns(md, b"x")
    raw = metadata().SerializeToString() + b"\x22\x08\x0a\x02\xc3\x28\x12\x02ok"  # property key
    with pytest.raises(errors.BadMetadataError):
        twin.split_columns(pb.MessageMetadata.FromString(raw), b"x")


@pytest.mark.parametrize("kind", sorted(compression.NAMES))
def test_frame_columns_decompress_first(twin, kind):
    builder = twin.BatchBuilder()
    for index in range(50):
        builder.add(b"payload %d" % index, properties={"i": str(index)}, partition_key=f"k{index % 3}")
    raw = builder.build()
    md = metadata(count=50, compression=kind, uncompressed_size=len(raw))
    frame = twin.decode_frame(twin.encode_payload_command(send_command(), md, compression.compress(kind, raw)))
    columns = frame.columns()
    assert column_rows(columns) == message_rows(twin, md, raw)
    if kind != compression.NONE:
        with pytest.raises(errors.DecompressionError):
            frame.columns(max_uncompressed_size=len(raw) - 1)
    ping = twin.decode_frame(twin.encode_command(pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing())))
    assert len(ping.columns()) == 0 and ping.messages() == []


def test_recorded_frames_give_the_rows_their_messages_give(twin):
    checked = 0
    for name in scenarios():
        _, streams = load_scenario(name)
        for data in streams.values():
            reader = twin.FrameReader()
            reader.feed(data)
            for frame in reader:
                if frame.metadata is None:
                    continue
                messages = frame.messages()
                rows = column_rows(frame.columns())
                assert rows == [{key: (m.data() if key == "payload" else getattr(m, key)) for key in ROW_KEYS}
                                for m in messages]
                checked += 1
    assert checked


# --- Arrow ------------------------------------------------------------------------------

def test_to_arrow_wraps_the_buffers(twin):
    pa = pytest.importorskip("pyarrow")
    builder = twin.BatchBuilder()
    for index in range(20):
        builder.add(b"payload-%d" % index, properties={"i": str(index), "even": str(index % 2 == 0)} if index % 3
                    else None, partition_key=f"k{index}" if index % 2 else None, event_time=index,
                    ordering_key=b"o" if index == 4 else None, sequence_id=index if index % 5 else None)
    columns = twin.split_columns(metadata(count=20), builder.build())
    record_batch = columns.to_arrow()
    assert isinstance(record_batch, pa.RecordBatch) and record_batch.num_rows == 20
    record_batch.validate(full=True)
    # Zero-copy: the Arrow columns point into the Columns' own buffers.
    assert record_batch.column("payload").buffers()[2].address == pa.py_buffer(columns.payloads).address
    assert record_batch.column("payload").buffers()[1].address == pa.py_buffer(columns.payload_offsets).address
    assert (record_batch.column("partition_key").buffers()[0].address
            == pa.py_buffer(columns.has_partition_key).address)
    assert record_batch.schema.field("properties").type == pa.map_(pa.large_string(), pa.large_string())
    for got, want in zip(record_batch.to_pylist(), column_rows(columns)):
        assert got == dict(want, properties=list(want["properties"].items()))
    assert columns.to_arrow().num_rows == 20
    empty = twin.decode_frame(twin.encode_command(pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing())))
    assert empty.columns().to_arrow().num_rows == 0
