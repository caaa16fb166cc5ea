"""One consumer over a list of topics."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topics = [prefix + "-a", prefix + "-b", prefix + "-c"]
client = pulsar.Client(service_url)
consumer = client.subscribe(topics, "sub", consumer_type=pulsar.ConsumerType.Shared)
for topic in topics:
    producer = client.create_producer(topic)
    for i in range(3):
        producer.send(("%s-%d" % (topic[-1], i)).encode())
got = []
for _ in range(9):
    message = consumer.receive(5000)
    got.append((message.topic_name().rsplit("-", 1)[1], message.data()))
    consumer.acknowledge(message)
print(sorted(got))
try:
    consumer.receive(200)
except pulsar.Timeout:
    print("done")
client.close()
