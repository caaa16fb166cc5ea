"""Negative acknowledgement: the message comes back after the redelivery delay."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-nack", "sub", consumer_type=pulsar.ConsumerType.Shared,
                            negative_ack_redelivery_delay_ms=100)
producer = client.create_producer(prefix + "-nack")
producer.send(b"fails once")
producer.send(b"fine")

first = consumer.receive(5000)
consumer.negative_acknowledge(first)
second = consumer.receive(5000)
consumer.acknowledge(second)
print("first:", first.data(), first.redelivery_count())
print("then:", second.data())
again = consumer.receive(5000)
print("redelivered:", again.data(), again.redelivery_count(), again.message_id() == first.message_id())
consumer.acknowledge(again)
try:
    consumer.receive(300)
except pulsar.Timeout:
    print("nothing more")
client.close()
