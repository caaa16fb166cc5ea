"""A message over the broker's limit without chunking fails with MessageTooBig."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
producer = client.create_producer(prefix + "-big")
try:
    producer.send(b"x" * (6 * 1024 * 1024))
except pulsar.MessageTooBig:
    print("too big")
print("small still goes:", producer.send(b"small").entry_id() >= 0)
client.close()
