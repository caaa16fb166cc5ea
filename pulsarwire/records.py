"""Record classes declared the official client's way (`pulsar.schema.Record` with `String()`,
`Integer()`, ... fields), for `JsonSchema` and `AvroSchema`.

A record class's `schema()` is the same Avro-style definition the official client derives
(field order, `["null", type]` unless `required`, a `default` entry only with
`required_default`), so records declared here and there describe a topic identically.
Field values are checked on assignment; an enum field takes a member, its name or its value.
"""
from __future__ import annotations

import builtins
import copy
import enum
from typing import Any

# attributes a record instance keeps besides its fields (left out of what is encoded)
RESERVED = ("_default", "_required", "_required_default")

# an Avro type as a schema definition holds it: a name, or a JSON object
AvroType = str | dict[str, Any]


class Field:
    """A record field; `required` drops the null alternative, `required_default` writes `default`."""

    avro_type = "null"
    python_types: tuple[type, ...] = (object,)

    def __init__(self, default: Any = None, required: bool = False, required_default: bool = False) -> None:
        self._required = required
        self._required_default = required_default
        self._default: Any = None
        if default is not None:
            default = self.validate_type("default", default)
        self._default = default

    def type(self) -> str:
        return self.avro_type

    def python_type(self) -> builtins.type | tuple[builtins.type, ...]:
        return self.python_types if len(self.python_types) > 1 else self.python_types[0]

    def validate_type(self, name: str, value: Any) -> Any:
        if value is None and not self._required:
            return self.default()
        if not isinstance(value, self.python_types):
            raise TypeError(f"Invalid type '{type(value)}' for field '{name}'. Expected: {self.python_type()}")
        return value

    def schema(self) -> AvroType:
        return self.schema_info(set())

    def schema_info(self, defined_names: set[str]) -> AvroType:
        return self.type()

    def default(self) -> Any:
        return self._default

    def required_default(self) -> bool:
        return self._required_default


class Null(Field):
    avro_type = "null"
    python_types = (type(None),)

    def validate_type(self, name: str, value: Any) -> Any:
        if value is not None:
            raise TypeError(f"Field {name} is set to be None")
        return value


class Boolean(Field):
    avro_type = "boolean"
    python_types = (bool,)

    def default(self) -> Any:
        return False if self._default is None else self._default


class Integer(Field):
    avro_type = "int"
    python_types = (int,)


class Long(Field):
    avro_type = "long"
    python_types = (int,)


class Float(Field):
    avro_type = "float"
    python_types = (float, int)


class Double(Field):
    avro_type = "double"
    python_types = (float, int)


class Bytes(Field):
    avro_type = "bytes"
    python_types = (bytes, str)

    def validate_type(self, name: str, value: Any) -> Any:
        return value.encode() if isinstance(value, str) else value


class String(Field):
    avro_type = "string"
    python_types = (str, bytes)

    def validate_type(self, name: str, value: Any) -> Any:
        if value is None and not self._required:
            return self.default()
        if not isinstance(value, (str, bytes)):
            raise TypeError(f"Invalid type '{type(value)}' for field '{name}'. Expected a string")
        return value.decode() if isinstance(value, bytes) else value


class CustomEnum(Field):
    """A field holding a member of `enum_type` (declared in a record by the Enum class itself)."""

    avro_type = "enum"

    def __init__(self, enum_type: type[enum.Enum], default: Any = None, required: bool = False,
                 required_default: bool = False) -> None:
        if not (isinstance(enum_type, type) and issubclass(enum_type, enum.Enum)):
            raise TypeError(f"{enum_type!r} is not an Enum type")
        self.enum_type = enum_type
        self.python_types: tuple[builtins.type, ...] = (enum_type,)
        super().__init__(default, required, required_default)

    def validate_type(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, self.enum_type):
            return value
        if isinstance(value, str) and value in self.enum_type.__members__:
            return self.enum_type.__members__[value]
        if isinstance(value, int) and not isinstance(value, bool):
            for member in self.enum_type:
                if member.value == value:
                    return member
        raise TypeError(f"Invalid enum value '{value}' for field '{name}'. "
                        f"Expected: {list(self.enum_type.__members__)}")

    def schema_info(self, defined_names: set[str]) -> AvroType:
        name = self.enum_type.__name__
        if name in defined_names:
            return name
        defined_names.add(name)
        return {"type": "enum", "name": name, "symbols": [member.name for member in self.enum_type]}


def _check_item_type(item_type: object) -> None:
    if not isinstance(item_type, (Field, Record)):
        raise TypeError(f"{item_type!r} is not a Record or a Field")


def _nested_schema(item_type: Field | Record, defined_names: set[str]) -> AvroType:
    return item_type.schema_info(defined_names) if isinstance(item_type, (Array, Map, Record)) else item_type.type()


class Array(Field):
    avro_type = "array"
    python_types = (list,)

    def __init__(self, array_type: Field | Record, default: Any = None, required: bool = False, required_default: bool = False) -> None:
        _check_item_type(array_type)
        self.array_type = array_type
        super().__init__(default, required, required_default)

    def validate_type(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        super().validate_type(name, value)
        if not all(isinstance(item, self.array_type.python_type()) for item in value):
            raise TypeError(f"Array field {name} items should all be of type {self.array_type.type()}")
        return value

    def schema_info(self, defined_names: set[str]) -> AvroType:
        return {"type": "array", "items": _nested_schema(self.array_type, defined_names)}


class Map(Field):
    avro_type = "map"
    python_types = (dict,)

    def __init__(self, value_type: Field | Record, default: Any = None, required: bool = False, required_default: bool = False) -> None:
        _check_item_type(value_type)
        self.value_type = value_type
        super().__init__(default, required, required_default)

    def validate_type(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        super().validate_type(name, value)
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"Map keys for field {name} should all be strings")
            if not isinstance(item, self.value_type.python_type()):
                raise TypeError(f"Map values for field {name} should all be of type {self.value_type.python_type()}")
        return value

    def schema_info(self, defined_names: set[str]) -> AvroType:
        return {"type": "map", "values": _nested_schema(self.value_type, defined_names)}


class RecordMeta(type):
    """Collects a record class's fields, in declaration order (an Enum class becomes a CustomEnum
    field, a Record class a sub-record field)."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> RecordMeta:
        if bases:  # not Record itself
            fields = {}
            for key, value in namespace.items():
                if isinstance(value, type) and issubclass(value, enum.Enum):
                    value = CustomEnum(value)
                elif isinstance(value, RecordMeta):
                    value = value()
                if isinstance(value, (Field, Record)):
                    fields[key] = value
            namespace["_fields"] = fields
            namespace["_required"] = False
        return super().__new__(mcs, name, bases, namespace)


class Record(metaclass=RecordMeta):
    """Base of record classes: `class User(Record): name = String(); age = Integer()`;
    `User(name="ada", age=36)`. `_avro_namespace` and `_sorted_fields` shape the definition."""

    _avro_namespace: str | None = None
    _sorted_fields = False
    _fields: dict[str, Any] = {}

    def __init__(self, default: Any = None, required_default: bool = False, required: bool = False, *args: Any,
                 **kwargs: Any) -> None:
        if type(self) is Record:  # as the official module: only a declared record has fields
            raise TypeError("Record itself has no fields: declare a subclass (class User(Record): ...)")
        self._required_default = required_default
        self._default = default
        self._required = required
        for name, field in self._fields.items():
            if name not in kwargs:
                if isinstance(field, Record):
                    self.__setattr__(name, field)
                else:
                    object.__setattr__(self, name, field.default())  # defaults are not re-checked
                continue
            value = kwargs[name]
            if isinstance(field, Record) and isinstance(value, dict):
                value = _record_from_dict(field, value)
            elif isinstance(field, Array) and isinstance(field.array_type, Record) and value \
                    and isinstance(value, list) and isinstance(value[0], dict):
                value = [_record_from_dict(field.array_type, item) for item in value]
            elif isinstance(field, Map) and isinstance(field.value_type, Record) and value \
                    and isinstance(value, dict) and isinstance(next(iter(value.values())), dict):
                value = {key: _record_from_dict(field.value_type, item) for key, item in value.items()}
            self.__setattr__(name, value)

    @classmethod
    def schema(cls) -> dict[str, Any]:
        definition = cls.schema_info(set())
        assert isinstance(definition, dict)  # no name is defined yet: the whole definition
        return definition

    @classmethod
    def schema_info(cls, defined_names: set[str]) -> AvroType:
        full_name = (cls._avro_namespace + "." if cls._avro_namespace is not None else "") + cls.__name__
        if full_name in defined_names:
            return full_name
        defined_names.add(full_name)
        definition: dict[str, Any] = {"type": "record", "name": cls.__name__}
        if cls._avro_namespace is not None:
            definition["namespace"] = cls._avro_namespace
        definition["fields"] = []
        for name in (sorted(cls._fields) if cls._sorted_fields else cls._fields):
            field = cls._fields[name]
            field_type = field.schema_info(defined_names)
            entry: dict[str, Any] = {"name": name}
            if field.required_default():
                default = field.default()
                entry["default"] = default.name if isinstance(default, enum.Enum) else default
            entry["type"] = field_type if field._required else ["null", field_type]
            definition["fields"].append(entry)
        return definition

    def __setattr__(self, key: str, value: Any) -> None:
        if key in RESERVED:
            object.__setattr__(self, key, value)
            return
        if key not in self._fields:
            raise AttributeError(f"Cannot set undeclared field {key} on record")
        object.__setattr__(self, key, self._fields[key].validate_type(key, value))

    def __eq__(self, other: object) -> bool:
        return all(getattr(self, name) == getattr(other, name, None) for name in self._fields)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __str__(self) -> str:
        return str(self.__dict__)

    def type(self) -> str:
        return type(self).__name__

    def python_type(self) -> builtins.type:
        return type(self)

    def validate_type(self, name: str, value: Any) -> Any:
        if value is None and not self._required:
            return self.default()
        if not isinstance(value, type(self)):
            raise TypeError(f"Invalid type '{type(value)}' for sub-record field '{name}'. Expected: {type(self)}")
        return value

    def default(self) -> Any:
        return self._default

    def required_default(self) -> bool:
        return self._required_default


def _record_from_dict(template: Record, values: dict[str, Any]) -> Record:
    record = copy.copy(template)
    type(record).__init__(record, **values)  # (through the class: mypy refuses instance.__init__)
    return record
