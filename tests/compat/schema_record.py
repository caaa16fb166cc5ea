"""Records declared with pulsar.schema's field classes, sent with JSON and Avro schemas."""
import enum
import sys

import pulsar
from pulsar.schema import (Array, AvroSchema, Boolean, Double, Integer, JsonSchema, Map, Record, String)

service_url, prefix = sys.argv[1], sys.argv[2]


class Color(enum.Enum):
    red = 1
    green = 2


class Address(Record):
    street = String()
    number = Integer()


class User(Record):
    _avro_namespace = "example"
    name = String(required=True)
    age = Integer(default=0, required_default=True)
    score = Double()
    active = Boolean()
    color = Color
    home = Address()
    tags = Array(String())
    counters = Map(Integer())


print("definition:", User.schema())
user = User(name="ada", age=36, score=9.5, active=True, color=Color.green,
            home=Address(street="main", number=7), tags=["a", "b"], counters={"x": 1})
try:
    User(name=5)
except TypeError:
    print("wrong field type refused")

client = pulsar.Client(service_url)
for kind, schema in (("json", JsonSchema(User)), ("avro", AvroSchema(User))):
    consumer = client.subscribe(prefix + "-" + kind, "sub", schema=schema)
    producer = client.create_producer(prefix + "-" + kind, schema=schema)
    producer.send(user)
    got = consumer.receive(5000).value()
    print(kind, type(got).__name__, got.name, got.age, got.score, got.active, got.color, got.home.street,
          got.home.number, got.tags, got.counters, got == user)
client.close()
