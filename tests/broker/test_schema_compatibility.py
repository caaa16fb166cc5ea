"""Schema compatibility strategies per namespace, as Pulsar's (BACKWARD by default)."""
from __future__ import annotations

import json

import pytest

from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.broker.compatibility import IncompatibleSchema, check_compatible

from ..conftest import unique
from ..peers import BrokerThread


def avro(*fields, name="User"):
    return pb.Schema(type=pb.Schema.Type.Avro, name="u", schema_data=json.dumps(
        {"type": "record", "name": name, "namespace": "ex", "fields": list(fields)}).encode())


NAME = {"name": "name", "type": "string"}
AGE_DEFAULT = {"name": "age", "type": ["null", "int"], "default": None}
AGE = {"name": "age", "type": "int"}
V1, V2_DEFAULT, V2_REQUIRED = avro(NAME), avro(NAME, AGE_DEFAULT), avro(NAME, AGE)


@pytest.mark.parametrize("strategy, new, ok", [
    ("BACKWARD", V2_DEFAULT, True),        # a new field with a default: the new schema reads old data
    ("BACKWARD", V2_REQUIRED, False),      # a new field without one cannot
    ("FORWARD", V2_REQUIRED, True),        # the old schema ignores the added field
    ("FULL", V2_DEFAULT, True),
    ("FULL", V2_REQUIRED, False),
    ("ALWAYS_COMPATIBLE", avro({"name": "other", "type": "long"}), True),
    ("ALWAYS_INCOMPATIBLE", V2_DEFAULT, False),
])
def test_strategies_against_the_last_version(strategy, new, ok):
    if ok:
        check_compatible(new, [V1], strategy)
    else:
        with pytest.raises(IncompatibleSchema):
            check_compatible(new, [V1], strategy)


def test_transitive_strategies_check_every_version():
    # v1 has "age" required; v2 dropped it; v3 adds "age" back as a string: v3 reads v2 (no age
    # written, the default applies) but not v1's int ages
    v1 = avro(NAME, {"name": "age", "type": "int"})
    v2 = avro(NAME)
    v3 = avro(NAME, {"name": "age", "type": "string", "default": ""})
    check_compatible(v3, [v1, v2], "BACKWARD")
    with pytest.raises(IncompatibleSchema):
        check_compatible(v3, [v1, v2], "BACKWARD_TRANSITIVE")


def test_type_promotions_unions_enums_and_names():
    wide = avro(NAME, {"name": "n", "type": "long", "default": 0})
    narrow = avro(NAME, {"name": "n", "type": "int", "default": 0})
    check_compatible(wide, [narrow], "BACKWARD")  # long reads int
    with pytest.raises(IncompatibleSchema):
        check_compatible(narrow, [wide], "BACKWARD")
    colour = lambda *symbols: avro({"name": "c", "type": {"type": "enum", "name": "C", "symbols": list(symbols)}})
    check_compatible(colour("R", "G", "B"), [colour("R", "G")], "BACKWARD")
    with pytest.raises(IncompatibleSchema):
        check_compatible(colour("R"), [colour("R", "G")], "BACKWARD")
    # as Pulsar (Avro's resolving decoder): a record reads a record of another name (the official
    # suite's test_avro_required_default updates `Example` to `ExampleRequiredDefault`), an enum
    # only one of its own name
    check_compatible(avro(NAME, name="Other"), [V1], "FULL")
    renamed = avro({"name": "c", "type": {"type": "enum", "name": "D", "symbols": ["R", "G"]}})
    with pytest.raises(IncompatibleSchema):
        check_compatible(renamed, [colour("R", "G")], "BACKWARD")
    fixed = lambda name: avro({"name": "f", "type": {"type": "fixed", "name": name, "size": 4}})
    with pytest.raises(IncompatibleSchema):
        check_compatible(fixed("B"), [fixed("A")], "BACKWARD")  # fixed and enum types by name too
    with pytest.raises(IncompatibleSchema):
        check_compatible(pb.Schema(type=pb.Schema.Type.String), [V1], "FULL")


pulsar = pytest.importorskip("pulsar")


def test_official_client_compatible_avro_update_is_accepted_and_strategy_is_per_namespace(tmp_path):
    from pulsar.schema import AvroSchema, Integer, Record, String

    class UserV1(Record):
        _avro_namespace = "ex"
        name = String()

    class UserV2(Record):  # the official client writes a field's default only with required_default
        _avro_namespace = "ex"
        name = String()
        age = Integer(default=0, required_default=True)

    class UserV2NoDefault(Record):
        _avro_namespace = "ex"
        name = String()
        age = Integer()

    UserV1.__name__ = UserV2.__name__ = UserV2NoDefault.__name__ = "User"  # one record, versions
    broker = BrokerThread(tmp_path / "data", v1_port=None).start()
    client = pulsar.Client(broker.url, operation_timeout_seconds=10)
    try:
        topic = unique("avro-update")
        client.create_producer(topic, schema=AvroSchema(UserV1)).close()
        with pytest.raises(pulsar.IncompatibleSchema):  # BACKWARD: a new field needs a default
            client.create_producer(topic, schema=AvroSchema(UserV2NoDefault))
        client.create_producer(topic, schema=AvroSchema(UserV2)).close()  # BACKWARD: accepted
        assert len(broker.broker.core.topics["persistent://public/default/" + topic].schemas) == 2
        policies = broker.broker.core.policies

        async def strict():
            policies.set_namespace_policy("public/default", "schemaCompatibilityStrategy", "ALWAYS_INCOMPATIBLE")
            await policies.save()
        import asyncio
        asyncio.run_coroutine_threadsafe(strict(), broker.loop).result(10)
        other = unique("avro-strict")
        client.create_producer(other, schema=AvroSchema(UserV1)).close()
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(other, schema=AvroSchema(UserV2))
        client.create_producer(topic, schema=AvroSchema(UserV1)).close()  # an existing version still is
    finally:
        client.close()
        broker.stop()
