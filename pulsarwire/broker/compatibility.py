"""Schema compatibility, as a Pulsar broker judges a new schema version against a topic's
existing ones under its namespace's strategy (BACKWARD by default).

Avro and JSON schemas (both carry an Avro definition) are compared with Avro's resolution
rules: BACKWARD means the new schema can read what the last one wrote, FORWARD that the last
one can read what the new one writes, FULL both; the _TRANSITIVE strategies check every earlier
version instead of the last. Other types are compatible when they are the same schema.
"""
from __future__ import annotations

import base64
import json
from typing import Any

from .._proto import PulsarApi_pb2 as pb
from ..schema import schema_definitions_match

_AVRO_LIKE = (pb.Schema.Type.Avro, pb.Schema.Type.Json)
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
# what a reader of the key's type accepts from a writer of each value's type (Avro's promotions)
_PROMOTIONS = {"long": {"int"}, "float": {"int", "long"}, "double": {"int", "long", "float"},
               "string": {"bytes"}, "bytes": {"string"}}
MAX_DEPTH = 64  # nesting a definition may have before it is refused (a bound on the check's recursion)


class IncompatibleSchema(ValueError):
    """The new schema is not compatible under the strategy; the message says why."""


def check_compatible(new: pb.Schema, existing: list[pb.Schema], strategy: str) -> None:
    """Raise IncompatibleSchema unless `new` may be added after `existing` (oldest first)."""
    if not existing or strategy == "ALWAYS_COMPATIBLE":
        return
    if strategy == "ALWAYS_INCOMPATIBLE":
        raise IncompatibleSchema("the schema compatibility strategy is ALWAYS_INCOMPATIBLE: no new version")
    against = existing if strategy.endswith("_TRANSITIVE") else existing[-1:]
    mode = strategy.removesuffix("_TRANSITIVE")
    for old in reversed(against):
        _check_pair(new, old, mode)


def _check_pair(new: pb.Schema, old: pb.Schema, mode: str) -> None:
    if new.type != old.type:
        raise IncompatibleSchema(f"a {pb.Schema.Type.Name(new.type)} schema cannot follow a "
                                 f"{pb.Schema.Type.Name(old.type)} schema")
    if new.type not in _AVRO_LIKE:
        if new.type in (pb.Schema.Type.Protobuf, pb.Schema.Type.KeyValue, pb.Schema.Type.ProtobufNative) \
                and new.schema_data != old.schema_data:
            raise IncompatibleSchema(f"a different {pb.Schema.Type.Name(new.type)} definition")
        return
    new_definition, old_definition = _parse(new.schema_data), _parse(old.schema_data)
    if mode in ("BACKWARD", "FULL"):
        problem = _reader_problem(new_definition, old_definition, {}, {}, 0)
        if problem:
            raise IncompatibleSchema(f"the new schema cannot read data written with an existing one: {problem}")
    if mode in ("FORWARD", "FULL"):
        problem = _reader_problem(old_definition, new_definition, {}, {}, 0)
        if problem:
            raise IncompatibleSchema(f"an existing schema cannot read data written with the new one: {problem}")


def _parse(data: bytes) -> Any:
    try:
        return json.loads(data or b'"null"')
    except ValueError as exc:
        raise IncompatibleSchema(f"the definition is not JSON: {exc}") from None


def _full_name(schema: dict, namespace: str) -> str:
    name = schema.get("name", "")
    if "." in name:
        return name
    ns = schema.get("namespace", namespace)
    return f"{ns}.{name}" if ns else name


def _resolve(schema: Any, names: dict[str, Any], namespace: str) -> Any:
    """A definition with named references replaced (names collects the named types seen)."""
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return {"type": schema}
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        found = names.get(full) or names.get(schema)
        if found is None:
            raise IncompatibleSchema(f"unknown type {schema!r}")
        return found
    if isinstance(schema, list):
        return schema
    if not isinstance(schema, dict):
        raise IncompatibleSchema(f"not an Avro schema: {str(schema)[:64]}")
    kind = schema.get("type")
    if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind not in _PRIMITIVES and
                                           kind not in ("record", "error", "enum", "array", "map", "fixed")):
        return _resolve(kind, names, namespace)  # {"type": {...}} or {"type": "SomeRecord"}
    if kind in ("record", "error", "enum", "fixed"):
        names[_full_name(schema, namespace)] = schema
    return schema


def _names(schema: dict, namespace: str) -> set[str]:
    full = _full_name(schema, namespace)
    short = full.rsplit(".", 1)[-1]
    aliases = set(schema.get("aliases") or [])
    return {full, short} | aliases | {a.rsplit(".", 1)[-1] for a in aliases}


def _reader_problem(reader: Any, writer: Any, reader_names: dict[str, Any], writer_names: dict[str, Any], depth: int,
                    reader_ns: str = "", writer_ns: str = "") -> str | None:
    """Why `reader` cannot read what `writer` wrote (Avro schema resolution), None if it can."""
    if depth > MAX_DEPTH:
        return "the definition is nested too deep"
    if isinstance(writer, list):  # every branch the writer may have written must be readable
        for branch in writer:
            problem = _reader_problem(reader, branch, reader_names, writer_names, depth + 1, reader_ns, writer_ns)
            if problem:
                return problem
        return None
    if isinstance(reader, list):  # some branch must read the writer's type
        problems = [_reader_problem(branch, writer, reader_names, writer_names, depth + 1, reader_ns, writer_ns)
                    for branch in reader]
        return None if any(p is None for p in problems) else f"no branch of a union reads {_describe(writer)}"
    reader = _resolve(reader, reader_names, reader_ns)
    writer = _resolve(writer, writer_names, writer_ns)
    if isinstance(reader, list) or isinstance(writer, list):
        return _reader_problem(reader, writer, reader_names, writer_names, depth + 1, reader_ns, writer_ns)
    r_type, w_type = reader.get("type"), writer.get("type")
    if r_type in _PRIMITIVES or w_type in _PRIMITIVES:
        if r_type == w_type or w_type in _PROMOTIONS.get(r_type, ()):
            return None
        return f"{_describe(reader)} cannot read {_describe(writer)}"
    if r_type != w_type and {r_type, w_type} != {"record", "error"}:
        return f"{_describe(reader)} cannot read {_describe(writer)}"
    if r_type in ("array",):
        return _reader_problem(reader.get("items"), writer.get("items"), reader_names, writer_names, depth + 1,
                               reader_ns, writer_ns)
    if r_type == "map":
        return _reader_problem(reader.get("values"), writer.get("values"), reader_names, writer_names, depth + 1,
                               reader_ns, writer_ns)
    r_ns = reader.get("namespace", reader_ns) if "." not in reader.get("name", "") else \
        reader["name"].rsplit(".", 1)[0]
    w_ns = writer.get("namespace", writer_ns) if "." not in writer.get("name", "") else \
        writer["name"].rsplit(".", 1)[0]
    # as Avro's SchemaCompatibility (which Pulsar uses): names must match for enums and fixed
    # types; a record is matched by its fields alone
    if r_type in ("enum", "fixed") and not (
            _names(reader, reader_ns) & {_full_name(writer, writer_ns), writer.get("name", "").rsplit(".", 1)[-1]}):
        return f"{_describe(reader)} and {_describe(writer)} have different names"
    if r_type == "fixed":
        return None if reader.get("size") == writer.get("size") else f"fixed {reader.get('name')} changed its size"
    if r_type == "enum":
        missing = set(writer.get("symbols") or []) - set(reader.get("symbols") or [])
        if missing and "default" not in reader:
            return f"enum {reader.get('name')} lacks the symbols {sorted(missing)} and has no default"
        return None
    written = {}
    for field in writer.get("fields") or []:
        written[field.get("name")] = field
    for field in reader.get("fields") or []:
        match = next((written[n] for n in [field.get("name"), *(field.get("aliases") or [])] if n in written), None)
        if match is None:
            if "default" not in field:
                return f"field {field.get('name')!r} is new and has no default"
            continue
        problem = _reader_problem(field.get("type"), match.get("type"), reader_names, writer_names, depth + 1,
                                  r_ns, w_ns)
        if problem:
            return f"field {field.get('name')!r}: {problem}"
    return None


def _describe(schema: object) -> str:
    if isinstance(schema, dict):
        kind = schema.get("type")
        return f"{kind} {schema['name']}" if "name" in schema else str(kind)
    return str(schema)[:64]


def schema_record(schema: pb.Schema) -> dict:
    """How a topic keeps a schema version (`Topic.schemas`)."""
    return {"type": schema.type, "name": schema.name, "data": base64.b64encode(schema.schema_data).decode(),
            "properties": {p.key: p.value for p in schema.properties}}


def record_schema(record: dict) -> pb.Schema:
    return pb.Schema(type=record["type"], name=record["name"], schema_data=base64.b64decode(record["data"]),
                     properties=[pb.KeyValue(key=k, value=v) for k, v in sorted(record["properties"].items())])


def version_for(schema: pb.Schema, versions: list[dict], strategy: str) -> tuple[int, dict | None]:
    """The version `schema` is among a topic's `versions` (oldest first): an existing one that is
    the same schema, else a new one whose record is returned to be stored. IncompatibleSchema
    when the strategy refuses it."""
    existing = [record_schema(record) for record in versions]
    for version in range(len(existing) - 1, -1, -1):
        if schema_definitions_match(existing[version], schema):
            return version, None
    check_compatible(schema, existing, strategy)
    return len(versions), schema_record(schema)
