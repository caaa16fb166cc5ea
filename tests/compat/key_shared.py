"""Key_Shared: every key goes to exactly one of the consumers."""
import collections
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-keys"
client = pulsar.Client(service_url)
consumers = [client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="c%d" % i)
             for i in range(2)]
producer = client.create_producer(topic)
for i in range(40):
    producer.send(b"m-%d" % i, partition_key="key-%d" % (i % 8))

owners = collections.defaultdict(set)
count = 0
for index, consumer in enumerate(consumers):
    while True:
        try:
            message = consumer.receive(300)
        except pulsar.Timeout:
            break
        owners[message.partition_key()].add(index)
        consumer.acknowledge(message)
        count += 1
print("received:", count, "keys:", len(owners), "one consumer per key:", all(len(o) == 1 for o in owners.values()))
client.close()
