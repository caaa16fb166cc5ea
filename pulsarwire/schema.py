"""Schemas: how a value becomes message bytes and back, and the schema info a producer or
consumer declares to the broker (CommandProducer.schema / CommandSubscribe.schema).

Names follow the official client's `pulsar.schema` (StringSchema, BytesSchema, JsonSchema,
AvroSchema, ProtobufNativeSchema) and its definitions are the same, so the two clients share
topics. JSON and Avro take a dataclass or a record class declared the official way: a
`pulsar.schema.Record` subclass, or the same with this module's `Record`, `String`, `Integer`, ...
(from `pulsarwire.records`).
`KeyValueSchema` follows the Java client's KeyValue layout (INLINE and SEPARATED).
"""
from __future__ import annotations

import base64
import dataclasses
import enum
import io
import json
import struct
import types
import typing
from typing import TYPE_CHECKING, Any, NamedTuple

from ._proto import PulsarApi_pb2 as pb
from .records import (  # noqa: F401 - offered here, as the official `pulsar.schema` offers them
    Array, Boolean, Bytes, CustomEnum, Double, Field, Float, Integer, Long, Map, Null, Record, String,
)


if TYPE_CHECKING:
    from .messages import Message

_TYPE = pb.Schema.Type
# an Avro type in a definition: a name, a JSON object, or a union (a list of types)
AvroType = str | dict[str, Any] | list[Any]


class SchemaType(enum.IntEnum):
    """Wire schema types (`Schema.Type`); BYTES is the official client's "no schema"."""

    BYTES = -1
    NONE = _TYPE.Bytes
    STRING = _TYPE.String
    JSON = _TYPE.Json
    PROTOBUF = _TYPE.Protobuf
    AVRO = _TYPE.Avro
    KEY_VALUE = _TYPE.KeyValue
    PROTOBUF_NATIVE = _TYPE.ProtobufNative


class SchemaInfo:
    """What the broker stores for a topic: type, name, definition and properties."""

    __slots__ = ("_type", "_name", "_data", "_properties")

    def __init__(self, schema_type: int, name: str, data: bytes | str = b"",
                 properties: dict[str, str] | None = None) -> None:
        self._type = int(schema_type)
        self._name = name
        self._data = data.encode() if isinstance(data, str) else bytes(data)
        self._properties = dict(properties or {})

    def schema_type(self) -> int:
        return self._type

    def name(self) -> str:
        return self._name

    def schema(self) -> str:
        return self._data.decode("utf-8", "replace")

    def data(self) -> bytes:
        return self._data

    def properties(self) -> dict[str, str]:
        return dict(self._properties)

    def to_proto(self) -> pb.Schema:
        return pb.Schema(name=self._name, schema_data=self._data, type=typing.cast(Any, max(self._type, 0)),
                         properties=[pb.KeyValue(key=k, value=v) for k, v in sorted(self._properties.items())])

    @classmethod
    def from_proto(cls, schema: pb.Schema) -> "SchemaInfo":
        return cls(schema.type, schema.name, schema.schema_data, {p.key: p.value for p in schema.properties})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SchemaInfo) and (self._type, self._data, self._properties) == \
            (other._type, other._data, other._properties)

    def __repr__(self) -> str:
        return f"SchemaInfo({SchemaType(self._type).name if self._type in SchemaType._value2member_map_ else self._type}, " \
               f"{self._name!r}, {self.schema()!r})"


class Schema:
    """Base class: `encode(value) -> bytes`, `decode(bytes) -> value`, `schema_info()`."""

    schema_type: int = SchemaType.BYTES
    schema_name = "BYTES"

    def _definition(self) -> bytes:
        return b""

    def _properties(self) -> dict[str, str]:
        return {}

    def schema_info(self) -> SchemaInfo:
        return SchemaInfo(self.schema_type, self.schema_name, self._definition(), self._properties())

    def wire_schema(self) -> pb.Schema | None:
        """The schema sent on Producer/Subscribe (None: declare nothing, as for bytes)."""
        if self.schema_type == SchemaType.BYTES:
            return None
        return self.schema_info().to_proto()

    def encode(self, value: Any) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError

    def encode_message(self, value: Any) -> tuple[bytes, str | None]:
        """The payload and, for a schema that carries part of the value in the key
        (KeyValue SEPARATED), the base64 partition key."""
        return self.encode(value), None

    def decode_message(self, message: Message) -> Any:
        return self.decode(message.data())

    def __repr__(self) -> str:
        return type(self).__name__


class BytesSchema(Schema):
    def encode(self, value: bytes) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"BytesSchema encodes bytes, not {type(value).__name__}")
        return bytes(value)

    def decode(self, data: bytes) -> bytes:
        return bytes(data)


class StringSchema(Schema):
    schema_type = SchemaType.STRING
    schema_name = "STRING"

    def encode(self, value: str) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"StringSchema encodes str, not {type(value).__name__}")
        return value.encode("utf-8")

    def decode(self, data: bytes) -> str:
        return bytes(data).decode("utf-8")


# --- records: the official client's Record classes and dataclasses ------------------------

_RESERVED = ("_default", "_required", "_required_default")


def _is_official_record(cls: object) -> bool:
    """A record class declared the official client's way: a subclass of `pulsar.schema.Record`
    (recognised without importing it) or of pulsarwire's own `Record` (`pulsarwire.records`)."""
    return isinstance(cls, type) and (issubclass(cls, Record) or any(
        base.__name__ == "Record" and base.__module__.startswith("pulsar.schema") for base in cls.__mro__))


_PRIMITIVES = {str: "string", int: "long", float: "double", bool: "boolean", bytes: "bytes"}


def _avro_type(tp: Any, seen: set[str]) -> AvroType:
    """The Avro type of a Python annotation (dataclass fields)."""
    if tp in _PRIMITIVES:
        return _PRIMITIVES[tp]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        inner = [_avro_type(a, seen) for a in members]
        return (["null"] + inner) if len(members) < len(args) else inner
    if origin in (list, tuple, set) or tp in (list, tuple, set):
        return {"type": "array", "items": _avro_type(args[0], seen) if args else "string"}
    if origin is dict or tp is dict:
        return {"type": "map", "values": _avro_type(args[1], seen) if args else "string"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if tp.__name__ in seen:
            return tp.__name__
        seen.add(tp.__name__)
        return {"type": "enum", "name": tp.__name__, "symbols": [m.name for m in tp]}
    if dataclasses.is_dataclass(tp):
        return _dataclass_schema(tp, seen)
    raise TypeError(f"no schema type for field type {tp!r}")


def _dataclass_schema(cls: Any, seen: set[str] | None = None) -> str | dict[str, Any]:
    seen = set() if seen is None else seen
    if cls.__name__ in seen:
        return cls.__name__
    seen.add(cls.__name__)
    hints = typing.get_type_hints(cls)
    fields = []
    for field in dataclasses.fields(cls):
        entry: dict[str, Any] = {"name": field.name, "type": _avro_type(hints[field.name], seen)}
        if field.default is None:
            entry["default"] = None
        fields.append(entry)
    return {"type": "record", "name": cls.__name__, "fields": fields}


def record_definition(record_cls: Any) -> dict[str, Any]:
    """The Avro-style definition JSON and Avro schemas carry for a record class."""
    if _is_official_record(record_cls):
        official: dict[str, Any] = record_cls.schema()  # an official Record's: untyped
        return official
    if dataclasses.is_dataclass(record_cls):
        definition = _dataclass_schema(record_cls)
        assert isinstance(definition, dict)  # no name is defined yet: the whole definition
        return definition
    raise TypeError(f"{record_cls!r} is neither a dataclass nor a pulsar.schema.Record")


def _to_plain(value: Any, enum_as_name: bool) -> Any:
    """A record value as plain dicts and lists (what JSON and Avro write)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name), enum_as_name) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.name if enum_as_name else value.value
    if isinstance(value, dict):
        return {k: _to_plain(v, enum_as_name) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_to_plain(v, enum_as_name) for v in value]
    if _is_official_record(type(value)):
        return {k: _to_plain(v, enum_as_name) for k, v in value.__dict__.items() if k not in _RESERVED}
    return value


def _from_plain(tp: Any, value: Any, enum_by_name: bool) -> Any:
    """A plain decoded value as the annotated Python type (dataclasses, enums, bytes)."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        return _from_plain(members[0], value, enum_by_name) if len(members) == 1 else value
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return typing.cast(Any, tp)(**{f.name: _from_plain(hints[f.name], value.get(f.name), enum_by_name)
                     for f in dataclasses.fields(tp) if f.name in value})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp[value] if enum_by_name else tp(value)
    if tp is bytes and isinstance(value, str):
        return base64.b64decode(value)
    if origin in (list, tuple, set) and args:
        items = [_from_plain(args[0], v, enum_by_name) for v in value]
        return origin(items) if origin is not list else items
    if origin is dict and args:
        return {k: _from_plain(args[1], v, enum_by_name) for k, v in value.items()}
    return value


class _RecordSchema(Schema):
    def __init__(self, record_cls: Any, definition: dict[str, Any] | None = None) -> None:
        self._record_cls = record_cls
        self._schema_dict = definition if definition is not None else record_definition(record_cls)

    def _definition(self) -> bytes:
        return json.dumps(self._schema_dict, indent=True).encode()

    def _check(self, value: Any) -> None:
        if self._record_cls is not None and not isinstance(value, self._record_cls):
            raise TypeError(f"{type(self).__name__} of {self._record_cls.__name__} cannot encode "
                            f"a {type(value).__name__}")

    def _build(self, plain: dict[str, Any], enum_by_name: bool) -> Any:
        cls = self._record_cls
        if cls is None:
            return plain
        if dataclasses.is_dataclass(cls):
            return _from_plain(cls, plain, enum_by_name)
        return cls(**plain)  # an official Record takes its fields as keywords


class JsonSchema(_RecordSchema):
    """JSON of a record class; the definition is its Avro-style schema (as the official client's)."""

    schema_type = SchemaType.JSON
    schema_name = "JSON"

    def encode(self, value: Any) -> bytes:
        self._check(value)
        # a Record's bytes fields as the official client writes them: their UTF-8 text (its
        # decode reads them back through the field); dataclasses and dicts: base64, as Java
        official_record = self._record_cls is not None and not dataclasses.is_dataclass(self._record_cls)
        return json.dumps(_to_plain(value, enum_as_name=False),
                          default=_json_text if official_record else _json_default).encode()

    def decode(self, data: bytes) -> Any:
        return self._build(json.loads(bytes(data)), enum_by_name=False)


def _json_text(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode()  # UnicodeDecodeError (a ValueError) for bytes that are not UTF-8
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_default(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


MAX_WRITER_SCHEMAS = 256  # writer schema versions an AvroSchema keeps parsed


class AvroSchema(_RecordSchema):
    """Avro binary of a record class (or of dicts, given `schema_definition`); needs fastavro
    (`pip install pulsarwire[avro]`)."""

    schema_type = SchemaType.AVRO
    schema_name = "AVRO"

    def __init__(self, record_cls: Any = None, schema_definition: dict[str, Any] | None = None) -> None:
        try:
            import fastavro
        except ImportError as exc:
            raise ImportError("AvroSchema needs fastavro: pip install 'pulsarwire[avro]'") from exc
        if record_cls is None and schema_definition is None:
            raise ValueError("AvroSchema needs a record class or a schema_definition")
        super().__init__(record_cls, schema_definition)
        self._fastavro = fastavro
        self._parsed = fastavro.parse_schema(json.loads(json.dumps(self._schema_dict)))
        # Writer schemas by (topic, schema version), fetched through `fetch_writer_schema` (set by
        # a blocking client's consumers and readers: (topic, version) -> SchemaInfo or None), so
        # that a message written with another compatible version is resolved into this one, as
        # the official client does. None in the cache: decode with this schema alone.
        self.fetch_writer_schema: typing.Callable[[str, bytes], SchemaInfo | None] | None = None
        self._writer_schemas: dict[tuple[str, bytes], Any] = {}

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, dict):
            self._check(value)
        out = io.BytesIO()
        self._fastavro.schemaless_writer(out, self._parsed, _to_plain(value, enum_as_name=True))
        return out.getvalue()

    def decode(self, data: bytes) -> Any:
        plain = self._fastavro.schemaless_reader(io.BytesIO(bytes(data)), self._parsed)
        return self._build(typing.cast(dict, plain), enum_by_name=True)

    def decode_message(self, message: Message) -> Any:
        version = message.schema_version()
        if self.fetch_writer_schema is None or not version:
            return self.decode(message.data())
        key = (message.topic_name(), bytes(version))
        if key not in self._writer_schemas:
            self._writer_schemas[key] = self._writer_schema(*key)
            if len(self._writer_schemas) > MAX_WRITER_SCHEMAS:  # a bound: the oldest goes
                del self._writer_schemas[next(iter(self._writer_schemas))]
        writer = self._writer_schemas[key]
        if writer is None:
            return self.decode(message.data())
        plain = self._fastavro.schemaless_reader(io.BytesIO(bytes(message.data())), writer, self._parsed)
        return self._build(typing.cast(dict, plain), enum_by_name=True)

    def _writer_schema(self, topic: str, version: bytes) -> Any:
        """The parsed writer schema of a version other than this one's, None to decode with this."""
        fetch = self.fetch_writer_schema
        if fetch is None:  # (decode_message asks only when there is one)
            return None
        try:
            info = fetch(topic, version)
        except Exception:  # noqa: BLE001 - decoded with this schema, as the official client falls back
            return None
        if info is None or info.schema_type() != SchemaType.AVRO:
            return None
        try:
            definition = json.loads(info.schema())
        except ValueError:
            return None
        if definition == self._schema_dict or not isinstance(definition, dict):
            return None
        # a record reads a record whatever its name (Pulsar checked the versions compatible)
        definition["name"] = self._schema_dict.get("name", definition.get("name"))
        try:
            return self._fastavro.parse_schema(definition)
        except Exception:  # noqa: BLE001 - a definition fastavro cannot take
            return None


class ProtobufNativeSchema(Schema):
    """A protobuf message class in its own binary encoding; the definition carries its
    FileDescriptorSet (the Java client's ProtobufNativeSchemaData)."""

    schema_type = SchemaType.PROTOBUF_NATIVE
    schema_name = "PROTOBUF_NATIVE"

    def __init__(self, message_cls: type[Any]) -> None:
        from google.protobuf.message import Message as ProtobufMessage
        if not (isinstance(message_cls, type) and issubclass(message_cls, ProtobufMessage)):
            raise TypeError(f"ProtobufNativeSchema needs a protobuf message class, got {message_cls!r}")
        self._message_cls: Any = message_cls

    def _definition(self) -> bytes:
        from google.protobuf import descriptor_pb2
        descriptor = self._message_cls.DESCRIPTOR
        files = descriptor_pb2.FileDescriptorSet()
        seen: set[str] = set()

        def add(file_descriptor: Any) -> None:  # dependencies first
            if file_descriptor.name in seen:
                return
            seen.add(file_descriptor.name)
            for dependency in file_descriptor.dependencies:
                add(dependency)
            proto = files.file.add()
            file_descriptor.CopyToProto(proto)

        add(descriptor.file)
        return json.dumps({"fileDescriptorSet": base64.b64encode(files.SerializeToString()).decode(),
                           "rootMessageTypeName": descriptor.full_name,
                           "rootFileDescriptorName": descriptor.file.name}).encode()

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, self._message_cls):
            raise TypeError(f"ProtobufNativeSchema of {self._message_cls.__name__} cannot encode "
                            f"a {type(value).__name__}")
        return value.SerializeToString()

    def decode(self, data: bytes) -> Any:
        return self._message_cls.FromString(bytes(data))


# --- KeyValue ----------------------------------------------------------------------------

class KeyValueEncoding(enum.Enum):
    INLINE = "INLINE"  # key and value both in the payload
    SEPARATED = "SEPARATED"  # value in the payload, key in the (base64) partition key


class KeyValue(NamedTuple):
    key: Any
    value: Any


_LENGTH = struct.Struct(">i")


def _pack_pair(first: bytes | None, second: bytes | None) -> bytes:
    """`[i32 length][bytes][i32 length][bytes]`, -1 for a missing part (the Java layout)."""
    out = bytearray()
    for part in (first, second):
        if part is None:
            out += _LENGTH.pack(-1)
        else:
            out += _LENGTH.pack(len(part))
            out += part
    return bytes(out)


def _unpack_pair(data: bytes) -> tuple[bytes | None, bytes | None]:
    data = bytes(data)
    parts: list[bytes | None] = []
    at = 0
    for _ in range(2):
        if at + 4 > len(data):
            raise ValueError("truncated KeyValue payload")
        (length,) = _LENGTH.unpack_from(data, at)
        at += 4
        if length < 0:
            parts.append(None)
            continue
        if at + length > len(data):
            raise ValueError("truncated KeyValue payload")
        parts.append(data[at:at + length])
        at += length
    return parts[0], parts[1]


class KeyValueSchema(Schema):
    """A (key, value) pair, each with its own schema. Send `KeyValue(k, v)` or a 2-tuple;
    `message.value()` gives a `KeyValue`."""

    schema_type = SchemaType.KEY_VALUE
    schema_name = "KeyValue"

    def __init__(self, key_schema: Schema, value_schema: Schema,
                 encoding: KeyValueEncoding = KeyValueEncoding.INLINE) -> None:
        self.key_schema = key_schema
        self.value_schema = value_schema
        self.encoding = KeyValueEncoding(encoding)

    def _definition(self) -> bytes:
        # an empty definition is written as length -1, as the C++ and Java clients do
        return _pack_pair(self.key_schema.schema_info().data() or None,
                          self.value_schema.schema_info().data() or None)

    def _properties(self) -> dict[str, str]:
        props = {"kv.encoding.type": self.encoding.value}
        for side, schema in (("key", self.key_schema), ("value", self.value_schema)):
            info = schema.schema_info()
            kind = info.schema_type()
            props[f"{side}.schema.name"] = info.name()
            props[f"{side}.schema.type"] = SchemaType(kind).name if kind in SchemaType._value2member_map_ \
                else str(kind)
            props[f"{side}.schema.properties"] = json.dumps(info.properties())
        return props

    @staticmethod
    def _pair(value: Any) -> tuple[Any, Any]:
        if isinstance(value, tuple) and len(value) == 2:
            return value[0], value[1]
        raise TypeError(f"KeyValueSchema encodes a KeyValue or a (key, value) tuple, not {type(value).__name__}")

    def encode(self, value: Any) -> bytes:
        key, val = self._pair(value)
        key_bytes = None if key is None else self.key_schema.encode(key)
        value_bytes = None if val is None else self.value_schema.encode(val)
        if self.encoding is KeyValueEncoding.SEPARATED:
            return value_bytes or b""
        return _pack_pair(key_bytes, value_bytes)

    def encode_message(self, value: Any) -> tuple[bytes, str | None]:
        if self.encoding is KeyValueEncoding.INLINE:
            return self.encode(value), None
        key, val = self._pair(value)
        key_bytes = b"" if key is None else self.key_schema.encode(key)
        return (b"" if val is None else self.value_schema.encode(val)), base64.b64encode(key_bytes).decode()

    def decode(self, data: bytes) -> KeyValue:
        if self.encoding is KeyValueEncoding.SEPARATED:
            raise ValueError("a SEPARATED KeyValue needs the message (its key is in the partition key)")
        key_bytes, value_bytes = _unpack_pair(data)
        return KeyValue(None if key_bytes is None else self.key_schema.decode(key_bytes),
                        None if value_bytes is None else self.value_schema.decode(value_bytes))

    def decode_message(self, message: Message) -> KeyValue:
        if self.encoding is KeyValueEncoding.INLINE:
            return self.decode(message.data())
        key = message.partition_key()
        key_bytes = None if key is None else (
            base64.b64decode(key) if message._single.partition_key_b64_encoded else key.encode())
        return KeyValue(None if key_bytes is None else self.key_schema.decode(key_bytes),
                        self.value_schema.decode(message.data()))


class _ForeignSchema(Schema):
    """Another library's schema object with `encode`, `decode` and `schema_info()` (the
    official client's `pulsar.schema` classes), used as it is."""

    def __init__(self, schema: Any) -> None:
        self._foreign = schema
        info = schema.schema_info()
        self.schema_type = int(info.schema_type())
        self.schema_name = info.name()
        self._data = info.schema().encode()

    def _definition(self) -> bytes:
        return self._data

    def encode(self, value: Any) -> bytes:
        return self._foreign.encode(value)

    def decode(self, data: bytes) -> Any:
        return self._foreign.decode(bytes(data))


def as_schema(schema: Any) -> Schema | None:
    """A pulsarwire schema for `schema`: itself, an adapter for a foreign one, or None."""
    if schema is None or isinstance(schema, Schema):
        return schema
    if all(callable(getattr(schema, name, None)) for name in ("encode", "decode", "schema_info")):
        return _ForeignSchema(schema)
    raise TypeError(f"schema must be a pulsarwire.schema.Schema, not {type(schema).__name__}")


def schema_definitions_match(a: pb.Schema, b: pb.Schema) -> bool:
    """The broker's compatibility rule: same type and the same definition (JSON compared as
    JSON; primitive types carry no definition that matters)."""
    if a.type != b.type:
        return False
    if a.type in (_TYPE.Json, _TYPE.Avro, _TYPE.ProtobufNative):
        try:
            return json.loads(a.schema_data or b"null") == json.loads(b.schema_data or b"null")
        except ValueError:
            return a.schema_data == b.schema_data
    if a.type in (_TYPE.Protobuf, _TYPE.KeyValue):
        return a.schema_data == b.schema_data
    return True
