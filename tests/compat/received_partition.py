"""A message received from a partitioned topic names its partition in its id (as the official
client reads it from the broker's delivery), for a custom router's choice and a reader alike."""
# corpus: partitioned=routed:5
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-routed"
client = pulsar.Client(service_url)


def router(message, partitions):
    return 10 % partitions if message.value().startswith(b"hello-") else 11 % partitions


producer = client.create_producer(topic, message_router=router)
sent = [producer.send(value).partition() for value in (b"hello-0", b"hello-1", b"world-0", b"world-1")]
print("sent to", sent)
consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
received = sorted((m.message_id().partition(), m.data()) for m in (consumer.receive(5000) for _ in range(4)))
print("received", received)
reader = client.create_reader(topic + "-partition-1", pulsar.MessageId.earliest)
print("read", [(m.message_id().partition(), m.data()) for m in (reader.read_next(5000) for _ in range(2))])
client.close()
