"""Sequence ids: initial_sequence_id, custom ids, and last_sequence_id across producer sessions."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-seq"
client = pulsar.Client(service_url)
consumer = client.subscribe(topic, "sub")
producer = client.create_producer(topic, producer_name=prefix + "-p", initial_sequence_id=10)
print("before sending:", producer.last_sequence_id())
for i in range(3):
    producer.send(b"m-%d" % i)
print("after 3:", producer.last_sequence_id())
producer.send(b"custom", sequence_id=100)
print("after custom:", producer.last_sequence_id())
producer.close()
again = client.create_producer(topic, producer_name=prefix + "-p")
print("new session:", again.last_sequence_id())
again.send(b"next")
print("after next:", again.last_sequence_id())
print([consumer.receive(5000).data() for _ in range(5)])
client.close()
