"""Consumer seek to the earliest message, to a publish time, and to a message id."""
import sys
import time

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-seek"
client = pulsar.Client(service_url)
consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
producer = client.create_producer(topic)
ids = []
for i in range(3):
    ids.append(producer.send(("first-%d" % i).encode()))
time.sleep(0.05)
middle = int(time.time() * 1000)
time.sleep(0.05)
for i in range(3):
    ids.append(producer.send(("second-%d" % i).encode()))

for _ in range(6):
    consumer.acknowledge(consumer.receive(5000))
consumer.seek(pulsar.MessageId.earliest)
print("after seek to earliest:", consumer.receive(5000).data())
consumer.seek(middle)
print("after seek to a time:", consumer.receive(5000).data())
