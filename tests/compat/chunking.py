"""Chunking: a message larger than the broker's limit is split and put back together."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-chunks", "sub")
producer = client.create_producer(prefix + "-chunks", chunking_enabled=True)
payload = bytes(range(256)) * (7 * 1024 * 1024 // 256)
producer.send(payload)
producer.send(b"small")
message = consumer.receive(10000)
print("whole:", len(message.data()), message.data() == payload)
consumer.acknowledge(message)
print("next:", consumer.receive(5000).data())
client.close()
