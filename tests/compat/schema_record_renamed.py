"""An Avro record schema followed on the same topic by one of another record name with the same
fields, and by one adding a field with a default, is compatible (BACKWARD, as Pulsar judges
records by their fields); one adding a required field is refused."""
import sys

import pulsar
from pulsar.schema import AvroSchema, Integer, Record, String

service_url, prefix = sys.argv[1], sys.argv[2]


class Example(Record):
    name = String()
    age = Integer()


class ExampleRenamed(Record):
    name = String()
    age = Integer()


class ExampleWithDefault(Record):
    name = String()
    age = Integer()
    city = String(default="nowhere", required_default=True)


class ExampleWithRequired(Record):
    name = String()
    age = Integer()
    zip = Integer(required=True)


client = pulsar.Client(service_url)
topic = prefix + "-avro"
for record in (Example, ExampleRenamed, ExampleWithDefault, ExampleWithRequired):
    try:
        producer = client.create_producer(topic, schema=AvroSchema(record))
        producer.send(record(name="x", age=1))
        print(record.__name__, "accepted")
    except pulsar.PulsarException as error:
        print(record.__name__, type(error).__name__)
client.close()
