"""A consumer and a reader with an Avro schema decode messages a second producer wrote with a
newer compatible version (fields in another order, one added with a default) by resolving the
writer's version into their own, as the official client does."""
import sys

import pulsar
from pulsar.schema import AvroSchema, Integer, Record, String

service_url, prefix = sys.argv[1], sys.argv[2]


class User(Record):
    name = String()
    age = Integer()


class UserV2(Record):
    _sorted_fields = True
    name = String()
    age = Integer()
    city = String(default="nowhere", required_default=True)


client = pulsar.Client(service_url)
topic = prefix + "-users"
consumer = client.subscribe(topic, "sub", schema=AvroSchema(User))
reader = client.create_reader(topic, pulsar.MessageId.earliest, schema=AvroSchema(User))
old = client.create_producer(topic, schema=AvroSchema(User))
new = client.create_producer(topic, schema=AvroSchema(UserV2))
for i in range(2):
    old.send(User(name="old-%d" % i, age=i))
    new.send(UserV2(name="new-%d" % i, age=100 + i, city="c"))
for source in (consumer.receive, reader.read_next):
    print([(value.name, value.age) for value in (source(5000).value() for _ in range(4))])
client.close()
