"""Typed values for the Spark data source: a topic's Pulsar schema as Spark columns, and back.

The source reads the topic's schema from the broker when the query is defined and gives
`value` the schema's type: a struct of the record's fields (JSON, Avro), a string, a
primitive, or a struct of `key` and `value` (KeyValue). Payloads are decoded a batch at a
time: JSON with Arrow's JSON reader, primitives with numpy, Avro and KeyValue row by row. The
sink encodes a struct `value` with the topic's schema, and checks a binary or string `value`
against it, so nothing it writes fails a schema-aware consumer.

A payload that does not decode is an error naming the topic and the message (`mode=FAILFAST`,
the default), or a null value with the payload in the corrupt-record column (`mode=PERMISSIVE`).
"""
from __future__ import annotations

import base64
import io
import json
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from pyspark.sql.types import (
    ArrayType, BinaryType, BooleanType, ByteType, DataType, DateType, DoubleType, FloatType, IntegerType,
    LongType, MapType, ShortType, StringType, StructField, StructType, TimestampType,
)

from ..schema import SchemaInfo, SchemaType, _unpack_pair

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

# primitive Pulsar schemas: the Spark type, and the big-endian layout of their payloads
class _Primitive(NamedTuple):
    spark_type: DataType
    layout: str  # numpy's name of the big-endian value


_PRIMITIVES: dict[int, _Primitive] = {
    5: _Primitive(BooleanType(), "?"), 6: _Primitive(ByteType(), ">i1"), 7: _Primitive(ShortType(), ">i2"),
    8: _Primitive(IntegerType(), ">i4"), 9: _Primitive(LongType(), ">i8"), 10: _Primitive(FloatType(), ">f4"),
    11: _Primitive(DoubleType(), ">f8"),
    14: _Primitive(TimestampType(), ">i8"),  # Timestamp: milliseconds since the epoch
}
_NO_SCHEMA = {SchemaType.BYTES, SchemaType.NONE}


class SchemaMismatchError(ValueError):
    """A value that the topic's schema cannot carry, or a payload it cannot read."""


class UnsupportedSchemaError(ValueError):
    """A topic schema the data source cannot turn into columns (read it with rawValue=true)."""


# --- Avro definitions (JSON and Avro schemas) as Spark types ---------------------

_AVRO_PRIMITIVES = {"string": StringType(), "int": IntegerType(), "long": LongType(), "float": FloatType(),
                    "double": DoubleType(), "boolean": BooleanType(), "bytes": BinaryType()}


def _avro_type(avro: Any, named: dict[str, DataType]) -> tuple[DataType, bool]:
    """(Spark type, nullable) of an Avro type."""
    if isinstance(avro, str):
        if avro in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[avro], False
        if avro in named:
            return named[avro], False
        raise UnsupportedSchemaError(f"Avro type {avro!r} is not supported")
    if isinstance(avro, list):  # a union: ["null", T] is a nullable T
        rest = [t for t in avro if t != "null"]
        if len(rest) != 1:
            raise UnsupportedSchemaError(f"Avro union {avro!r}: only a union of null and one type is supported")
        member, _ = _avro_type(rest[0], named)
        return member, len(rest) < len(avro)
    if not isinstance(avro, dict):
        raise UnsupportedSchemaError(f"not an Avro type: {avro!r}")
    kind: Any = avro.get("type")
    logical = avro.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return TimestampType(), False
    if logical == "date" and kind == "int":
        return DateType(), False
    if kind == "record":
        fields = []
        for f in avro.get("fields", []):
            spark_type, nullable = _avro_type(f["type"], named)
            fields.append(StructField(f["name"], spark_type, nullable))
        record = StructType(fields)
        named[avro.get("name", "")] = record
        return record, False
    if kind == "array":
        item, nullable = _avro_type(avro["items"], named)
        return ArrayType(item, nullable), False
    if kind == "map":
        item, nullable = _avro_type(avro["values"], named)
        return MapType(StringType(), item, nullable), False
    if kind == "enum":
        return StringType(), False
    if kind == "fixed":
        return BinaryType(), False
    return _avro_type(kind, named)


def _definition(info: SchemaInfo) -> dict[str, Any]:
    try:
        definition = json.loads(info.data() or b"null")
    except ValueError:
        raise UnsupportedSchemaError(f"schema {info.name()!r}: its definition is not JSON") from None
    if not isinstance(definition, dict) or definition.get("type") != "record":
        raise UnsupportedSchemaError(f"schema {info.name()!r}: only record definitions are supported")
    return definition


@dataclass
class ValueType:
    """How a topic's payloads become the `value` column (and back): picklable, shipped to tasks."""

    kind: int  # SchemaType
    definition: dict[str, Any] | None = None  # Avro/JSON: the record definition
    key: "ValueType | None" = None  # KeyValue: each side's type
    value: "ValueType | None" = None
    separated: bool = False  # KeyValue: the key rides in the message key (base64)
    info: dict[str, Any] = field(default_factory=dict)  # the SchemaInfo as sent by the broker (for the sink)

    @property
    def spark_type(self) -> DataType:
        if self.kind in _NO_SCHEMA:
            return BinaryType()
        if self.kind == SchemaType.STRING:
            return StringType()
        if self.kind in _PRIMITIVES:
            return _PRIMITIVES[self.kind].spark_type
        if self.kind in (SchemaType.JSON, SchemaType.AVRO):
            return _avro_type(self.definition, {})[0]
        if self.kind == SchemaType.KEY_VALUE:
            assert self.key is not None and self.value is not None
            return StructType([StructField("key", self.key.spark_type), StructField("value", self.value.spark_type)])
        raise UnsupportedSchemaError(f"schema type {self.kind}")

    def arrow_type(self) -> pa.DataType:
        from pyspark.sql.pandas.types import to_arrow_type
        return to_arrow_type(self.spark_type, timezone="UTC")

    def schema_info(self) -> SchemaInfo:
        return SchemaInfo(self.info["type"], self.info["name"], base64.b64decode(self.info["data"]),
                          self.info["properties"])


def value_type(info: SchemaInfo | None) -> ValueType | None:
    """The ValueType of a topic's schema; None for a topic without one (bytes)."""
    if info is None or info.schema_type() in _NO_SCHEMA:
        return None
    kind = info.schema_type()
    saved = {"type": kind, "name": info.name(), "data": base64.b64encode(info.data()).decode(),
             "properties": info.properties()}
    if kind == SchemaType.STRING or kind in _PRIMITIVES:
        return ValueType(kind, info=saved)
    if kind == SchemaType.AVRO:
        _need_fastavro()
    if kind in (SchemaType.JSON, SchemaType.AVRO):
        out = ValueType(kind, _definition(info), info=saved)
        out.spark_type  # noqa: B018 - every field's type checked now, when the query is defined
        return out
    if kind == SchemaType.KEY_VALUE:
        props = info.properties()
        key_data, value_data = _unpack_pair(info.data())
        sides = []
        for side, data in (("key", key_data), ("value", value_data)):
            name = props.get(f"{side}.schema.type", "BYTES").upper()
            side_kind = int(name) if name.lstrip("-").isdigit() else _KINDS_BY_NAME.get(name)
            if side_kind is None:
                raise UnsupportedSchemaError(f"KeyValue {side} schema type {name!r} is not supported")
            side_info = SchemaInfo(side_kind, props.get(f"{side}.schema.name", side), data or b"",
                                   json.loads(props.get(f"{side}.schema.properties") or "{}"))
            sides.append(value_type(side_info) or ValueType(SchemaType.BYTES))
        separated = props.get("kv.encoding.type", "INLINE").upper() == "SEPARATED"
        return ValueType(kind, key=sides[0], value=sides[1], separated=separated, info=saved)
    raise UnsupportedSchemaError(f"schema type {SchemaType(kind).name if kind in SchemaType._value2member_map_ else kind}"
                                 " cannot be read as columns (Protobuf is not supported); use rawValue=true")


# schema type names as the Java client writes them in a KeyValue schema's properties
_KINDS_BY_NAME = {**{k.name: int(k) for k in SchemaType}, "BOOLEAN": 5, "INT8": 6, "INT16": 7, "INT32": 8,
                  "INT64": 9, "FLOAT": 10, "DOUBLE": 11, "TIMESTAMP": 14}



def decode_values(vt: ValueType, values: pa.Array,
                  keys: pa.Array | None = None) -> tuple[pa.Array, np.ndarray | None]:
    """(typed Arrow array, numpy bool mask of rows that did not decode, or None) for a binary
    Arrow array of payloads (`keys`: the messages' keys, for a SEPARATED KeyValue)."""
    import numpy as np
    import pyarrow as pa

    if vt.kind in _NO_SCHEMA:
        return values, None
    if vt.kind == SchemaType.STRING:
        try:
            return values.cast(pa.string()), None
        except pa.ArrowInvalid:
            return _row_by_row(vt, values, keys)
    if vt.kind in _PRIMITIVES:
        return _primitives(vt, values)
    if vt.kind == SchemaType.JSON:
        fast = _json_fast(vt, values)
        if fast is not None:
            return fast, None
    return _row_by_row(vt, values, keys)


def _primitives(vt: ValueType, values: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    import numpy as np
    import pyarrow as pa

    spark_type, layout = _PRIMITIVES[vt.kind]
    width = 1 if layout == "?" else int(layout[-1])
    offsets = np.frombuffer(values.buffers()[1], np.int32, len(values) + 1, values.offset * 4)
    valid = np.ones(len(values), bool) if values.null_count == 0 else \
        np.asarray(values.is_valid().to_numpy(zero_copy_only=False))
    bad = (np.diff(offsets) != width) & valid
    data = np.frombuffer(values.buffers()[2], np.uint8) if values.buffers()[2] is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    starts[bad | ~valid] = 0
    picked = np.zeros((len(values), width), np.uint8)
    usable = valid & ~bad
    if usable.any():
        picked[usable] = data[starts[usable, None] + np.arange(width)]
    if layout == "?":
        numbers = picked[:, 0] != 0
    else:
        numbers = picked.view(np.dtype(layout)).reshape(-1).astype(np.dtype(layout).newbyteorder("="))
    mask = ~usable
    arrow = vt.arrow_type()
    if pa.types.is_timestamp(arrow):
        array = pa.array(numbers.astype(np.int64) * 1000, pa.int64(), mask=mask).cast(arrow)
    else:
        array = pa.array(numbers, arrow, mask=mask)
    return array, (bad if bad.any() else None)


def _json_fast(vt: ValueType, values: pa.Array) -> pa.Array | None:
    """Every payload through Arrow's JSON reader at once; None when that cannot be used here
    (a payload spans lines, or one does not parse or fit the schema: then row by row)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.json as pj

    import pyarrow.compute as pc

    count = len(values)
    if count == 0:
        return pa.array([], vt.arrow_type())
    nulls = None
    if values.null_count:  # a null value: an empty object on its line, masked after
        nulls = np.asarray(values.is_null().to_numpy(zero_copy_only=False))
        values = pc.if_else(values.is_null(), pa.scalar(b"{}", pa.binary()), values)
    offsets = np.frombuffer(values.buffers()[1], np.int32, count + 1, values.offset * 4).astype(np.int64)
    data = np.frombuffer(values.buffers()[2], np.uint8)[offsets[0]:offsets[-1]] \
        if values.buffers()[2] is not None else np.zeros(0, np.uint8)
    offsets = offsets - offsets[0]
    lengths = np.diff(offsets)
    if (lengths == 0).any() or (data == 10).any() or (data == 13).any():
        return None  # an empty payload, or one that spans lines
    # one line a payload
    lines = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, count], pa.int32()), values.cast(pa.binary())),
                           pa.scalar(b"\n", pa.binary()))[0].as_buffer()
    target = vt.arrow_type()
    parse = pa.schema([pa.field(f.name, _parse_type(f.type), True) for f in target])
    try:
        table = pj.read_json(pa.BufferReader(lines), read_options=pj.ReadOptions(block_size=max(1 << 20, len(lines) + 1)),
                             parse_options=pj.ParseOptions(explicit_schema=parse, unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != count:
        return None
    for f in target:  # a required field missing (beyond null values): row by row names the message
        missing = table.column(f.name).is_null().to_numpy(zero_copy_only=False) if not f.nullable else None
        if missing is not None and (missing if nulls is None else missing & ~nulls).any():
            return None
    columns = [_from_parsed(table.column(f.name).combine_chunks(), f.type) for f in target]
    mask = None if nulls is None else pa.array(nulls)
    return pa.StructArray.from_arrays(columns, fields=list(target), mask=mask)


def _parse_type(arrow: pa.DataType) -> pa.DataType:
    """What Arrow's JSON reader parses a field as: times as their numbers."""
    import pyarrow as pa
    if pa.types.is_timestamp(arrow):
        return pa.int64()
    if pa.types.is_date(arrow):
        return pa.int32()
    if pa.types.is_struct(arrow):
        return pa.struct([pa.field(f.name, _parse_type(f.type), f.nullable) for f in arrow])
    if pa.types.is_list(arrow):
        return pa.list_(_parse_type(arrow.value_type))
    return arrow


def _from_parsed(array: pa.Array, arrow: pa.DataType) -> pa.Array:
    import pyarrow as pa
    import pyarrow.compute as pc
    if pa.types.is_timestamp(arrow):
        return pc.multiply(array, 1000).cast(arrow)
    if pa.types.is_date(arrow):
        return array.cast(pa.date32())
    if pa.types.is_struct(arrow):
        return pa.StructArray.from_arrays([_from_parsed(array.field(i), f.type) for i, f in enumerate(arrow)],
                                          fields=list(arrow), mask=array.is_null())
    if pa.types.is_list(arrow) and array.type != arrow:
        return array.cast(arrow)
    return array


def _need_fastavro() -> None:
    try:
        import fastavro  # noqa: F401
    except ImportError:
        raise UnsupportedSchemaError("an Avro topic needs fastavro: pip install 'pulsarwire[avro]'") from None


def _row_by_row(vt: ValueType, values: pa.Array, keys: pa.Array | None) -> tuple[pa.Array, np.ndarray | None]:
    import numpy as np
    import pyarrow as pa

    if SchemaType.AVRO in (vt.kind, getattr(vt.key, "kind", None), getattr(vt.value, "kind", None)):
        _need_fastavro()  # a missing library is not a bad payload

    payloads = values.to_pylist()
    key_list = keys.to_pylist() if keys is not None else [None] * len(payloads)
    out: list[Any] = []
    bad = np.zeros(len(payloads), bool)
    arrow = vt.arrow_type()
    for i, (payload, key) in enumerate(zip(payloads, key_list)):
        if payload is None:
            out.append(None)
            continue
        try:
            value = decode_one(vt, payload, key)
            pa.array([value], arrow)  # it fits the column
            out.append(value)
        except Exception:  # noqa: BLE001 - any failure is this row's
            out.append(None)
            bad[i] = True
    return pa.array(out, arrow), (bad if bad.any() else None)


_avro_parsed: dict[str, Any] = {}  # definition as canonical JSON -> fastavro's parsed schema


def _avro_schema(definition: dict[str, Any]) -> Any:
    import fastavro
    key = json.dumps(definition, sort_keys=True)
    parsed = _avro_parsed.get(key)
    if parsed is None:
        parsed = _avro_parsed[key] = fastavro.parse_schema(definition)
    return parsed


def decode_one(vt: ValueType, payload: bytes, key: str | None = None) -> Any:
    """One payload as the Python value of its column (errors as exceptions)."""
    if vt.kind in _NO_SCHEMA:
        return payload
    if vt.kind == SchemaType.STRING:
        return payload.decode("utf-8")
    if vt.kind in _PRIMITIVES:
        layout = _PRIMITIVES[vt.kind].layout
        width = 1 if layout == "?" else int(layout[-1])
        if len(payload) != width:
            raise SchemaMismatchError(f"{len(payload)} bytes where the schema takes {width}")
        import datetime
        number = payload[0] != 0 if layout == "?" else struct.unpack(
            {">i1": ">b", ">i2": ">h", ">i4": ">i", ">i8": ">q", ">f4": ">f", ">f8": ">d"}[layout], payload)[0]
        if vt.kind == 14:
            return datetime.datetime.fromtimestamp(number / 1000, datetime.timezone.utc)
        return number
    if vt.kind == SchemaType.JSON:
        value = json.loads(payload)
        if not isinstance(value, dict):
            raise SchemaMismatchError("not a JSON object")
        return _json_to_column(value, vt.definition or {})
    if vt.kind == SchemaType.AVRO:
        import fastavro
        stream = io.BytesIO(payload)
        value = fastavro.schemaless_reader(stream, _avro_schema(vt.definition or {}), return_record_name=False)
        if stream.tell() != len(payload):
            raise SchemaMismatchError("bytes left over after the Avro record")
        return value
    if vt.kind == SchemaType.KEY_VALUE:
        assert vt.key is not None and vt.value is not None
        key_bytes: bytes | None
        value_bytes: bytes | None
        if vt.separated:
            key_bytes = None if key is None else base64.b64decode(key)
            value_bytes = payload
        else:
            key_bytes, value_bytes = _unpack_pair(payload)
        return {"key": None if key_bytes is None else decode_one(vt.key, key_bytes),
                "value": None if value_bytes is None else decode_one(vt.value, value_bytes)}
    raise UnsupportedSchemaError(f"schema type {vt.kind}")


def _json_to_column(value: dict[str, Any], definition: dict[str, Any]) -> dict[str, Any]:
    """A JSON record as its column's Python value: times from their numbers, required fields present."""
    import datetime
    out: dict[str, Any] = {}
    for f in definition.get("fields", []):
        kind = f["type"]
        nullable = isinstance(kind, list) and "null" in kind
        if isinstance(kind, list):
            kind = next(t for t in kind if t != "null")
        item = value.get(f["name"])
        if item is None:
            if not nullable:
                raise SchemaMismatchError(f"field {f['name']!r} is missing or null")
            out[f["name"]] = None
            continue
        if isinstance(kind, dict):
            logical = kind.get("logicalType")
            if logical == "timestamp-millis":
                item = datetime.datetime.fromtimestamp(item / 1000, datetime.timezone.utc)
            elif logical == "timestamp-micros":
                item = datetime.datetime.fromtimestamp(item / 1e6, datetime.timezone.utc)
            elif logical == "date":
                item = datetime.date(1970, 1, 1) + datetime.timedelta(days=item)
            elif kind.get("type") == "record":
                item = _json_to_column(item, kind)
        elif kind in ("int", "long") and (isinstance(item, bool) or not isinstance(item, int)):
            raise SchemaMismatchError(f"field {f['name']!r} is not a whole number")
        elif kind in ("float", "double") and (isinstance(item, bool) or not isinstance(item, (int, float))):
            raise SchemaMismatchError(f"field {f['name']!r} is not a number")
        elif kind == "string" and not isinstance(item, str):
            raise SchemaMismatchError(f"field {f['name']!r} is not a string")
        elif kind == "boolean" and not isinstance(item, bool):
            raise SchemaMismatchError(f"field {f['name']!r} is not true or false")
        out[f["name"]] = item
    return out



def encode_values(vt: ValueType, column: pa.Array, name: str) -> list[bytes]:
    """Payloads for a sink's `value` column under the topic's schema: a typed column encoded
    with it, a binary or string column checked against it (SchemaMismatchError naming the row)."""
    import pyarrow as pa

    typed = not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)
                 or (pa.types.is_string(column.type) and vt.kind != SchemaType.STRING))
    rows = column.to_pylist()
    out = []
    for i, value in enumerate(rows):
        if value is None:
            raise SchemaMismatchError(f"column {name!r} row {i + 1} is null: every row needs a value")
        try:
            if typed:
                out.append(encode_one(vt, value))
            else:
                payload = value.encode() if isinstance(value, str) else value
                decode_one(vt, payload)
                out.append(payload)
        except SchemaMismatchError as exc:
            raise SchemaMismatchError(f"column {name!r} row {i + 1} does not fit the topic's "
                                      f"{_kind_name(vt.kind)} schema: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the codec's own error, named
            raise SchemaMismatchError(f"column {name!r} row {i + 1} does not fit the topic's "
                                      f"{_kind_name(vt.kind)} schema: {type(exc).__name__}: {exc}") from None
    return out


def _kind_name(kind: int) -> str:
    return SchemaType(kind).name if kind in SchemaType._value2member_map_ else str(kind)


def encode_one(vt: ValueType, value: Any) -> bytes:
    import datetime
    if vt.kind == SchemaType.STRING:
        if not isinstance(value, str):
            raise SchemaMismatchError(f"{type(value).__name__} is not a string")
        return value.encode()
    if vt.kind in _PRIMITIVES:
        layout = _PRIMITIVES[vt.kind].layout
        if vt.kind == 14 and isinstance(value, datetime.datetime):
            value = int(value.timestamp() * 1000)
        if layout == "?":
            if not isinstance(value, bool):
                raise SchemaMismatchError(f"{value!r} is not true or false")
            return b"\x01" if value else b"\x00"
        try:
            return struct.pack({">i1": ">b", ">i2": ">h", ">i4": ">i", ">i8": ">q", ">f4": ">f", ">f8": ">d"}[layout],
                               value)
        except struct.error as exc:
            raise SchemaMismatchError(f"{value!r}: {exc}") from None
    if vt.kind == SchemaType.JSON:
        if not isinstance(value, dict):
            raise SchemaMismatchError(f"{type(value).__name__} is not a record")
        payload = json.dumps(_column_to_json(value), separators=(",", ":")).encode()
        decode_one(vt, payload)  # required fields and types
        return payload
    if vt.kind == SchemaType.AVRO:
        import fastavro
        stream = io.BytesIO()
        fastavro.schemaless_writer(stream, _avro_schema(vt.definition or {}), value)
        return stream.getvalue()
    if vt.kind == SchemaType.KEY_VALUE:
        if vt.separated:
            raise SchemaMismatchError("a SEPARATED KeyValue topic is written with its key in the 'key' column; "
                                      "not supported by the sink")
        from ..schema import _pack_pair
        assert vt.key is not None and vt.value is not None
        key, val = value.get("key"), value.get("value")
        return _pack_pair(None if key is None else encode_one(vt.key, key),
                          None if val is None else encode_one(vt.value, val))
    raise UnsupportedSchemaError(f"schema type {vt.kind}")


def _column_to_json(value: Any) -> Any:
    import datetime
    if isinstance(value, dict):
        return {k: _column_to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_column_to_json(v) for v in value]
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, datetime.date):
        return (value - datetime.date(1970, 1, 1)).days
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value
