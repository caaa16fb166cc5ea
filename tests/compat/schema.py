"""Schemas: String and JSON records; value() decodes."""
# corpus: xfail=needs schemas (issue 14 features)
import sys

import pulsar
from pulsar.schema import JsonSchema, Record, String, Integer, StringSchema

service_url, prefix = sys.argv[1], sys.argv[2]


class User(Record):
    name = String()
    age = Integer()


client = pulsar.Client(service_url)
strings = client.subscribe(prefix + "-strings", "sub", schema=StringSchema())
producer = client.create_producer(prefix + "-strings", schema=StringSchema())
producer.send("hello")
message = strings.receive(5000)
print("string:", repr(message.value()), message.data())

users = client.subscribe(prefix + "-users", "sub", schema=JsonSchema(User))
user_producer = client.create_producer(prefix + "-users", schema=JsonSchema(User))
user_producer.send(User(name="ada", age=36))
user = users.receive(5000).value()
print("record:", type(user).__name__, user.name, user.age)
client.close()
