"""A reader opened with is_read_compacted=True on a topic never compacted reads every message,
keyed or not, empty values included."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
topic = prefix + "-compacted"
producer = client.create_producer(topic)
for value, key in ((b"a1", "a"), (b"b1", "b"), (b"a2", "a"), (b"", "b"), (b"plain", None)):
    producer.send(value, partition_key=key) if key else producer.send(value)
reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
read = []
while reader.has_message_available():
    message = reader.read_next(5000)
    read.append((message.partition_key(), message.data()))
print(read)
client.close()
