"""Schemas: a String schema and the default bytes; value() decodes."""
import sys

import pulsar
from pulsar.schema import BytesSchema, StringSchema

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
strings = client.subscribe(prefix + "-strings", "sub", schema=StringSchema())
producer = client.create_producer(prefix + "-strings", schema=StringSchema())
producer.send("hello")
producer.send("wörld", properties={"lang": "de"})
for _ in range(2):
    message = strings.receive(5000)
    print("string:", repr(message.value()), message.data(), message.properties())
try:
    producer.send(b"bytes into a string schema")
except Exception as error:
    print("bytes refused:", type(error).__name__)

raw = client.subscribe(prefix + "-raw", "sub", schema=pulsar.schema.BytesSchema())
client.create_producer(prefix + "-raw", schema=BytesSchema()).send(b"\x00\x01")
print("bytes:", raw.receive(5000).value())
client.close()
