"""JSON schema over an official-style Record class."""
# corpus: xfail=needs the official Record classes (pulsar.schema.Record, String, Integer) in pulsarwire.schema
import sys

import pulsar
from pulsar.schema import Integer, JsonSchema, Record, String

service_url, prefix = sys.argv[1], sys.argv[2]


class User(Record):
    name = String()
    age = Integer()


client = pulsar.Client(service_url)
users = client.subscribe(prefix + "-users", "sub", schema=JsonSchema(User))
user_producer = client.create_producer(prefix + "-users", schema=JsonSchema(User))
user_producer.send(User(name="ada", age=36))
user = users.receive(5000).value()
print("record:", type(user).__name__, user.name, user.age)
client.close()
