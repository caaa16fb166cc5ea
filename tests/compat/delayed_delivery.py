"""Delayed delivery on a Shared subscription: deliver_after (a timedelta) and deliver_at (ms)."""
import sys
import time
from datetime import timedelta

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-delayed", "sub", consumer_type=pulsar.ConsumerType.Shared)
producer = client.create_producer(prefix + "-delayed")
start = time.time()
producer.send(b"in 400 ms", deliver_after=timedelta(milliseconds=400))
producer.send(b"at +200 ms", deliver_at=int(time.time() * 1000) + 200)
producer.send(b"now")
order = []
for _ in range(3):
    message = consumer.receive(5000)
    order.append((message.data(), time.time() - start >= 0.15 if message.data() != b"now" else True))
    consumer.acknowledge(message)
print(order)
client.close()
