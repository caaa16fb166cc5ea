"""Producer and consumer loop, as in the official client's README."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-my-topic"

client = pulsar.Client(service_url)
consumer = client.subscribe(topic, "my-subscription")
producer = client.create_producer(topic, producer_name=prefix + "-producer")

for i in range(10):
    producer.send(("Hello-%d" % i).encode("utf-8"), properties={"index": str(i)},
                  partition_key="key-%d" % (i % 3), event_timestamp=1_700_000_000_000 + i)
print("producer:", producer.producer_name() == prefix + "-producer", producer.topic().endswith(topic))
print("last sequence id:", producer.last_sequence_id(), "connected:", producer.is_connected())

for _ in range(10):
    msg = consumer.receive()
    try:
        print("Received message '{}' properties={} key={} event={} redelivered={}".format(
            msg.data(), msg.properties(), msg.partition_key(), msg.event_timestamp() - 1_700_000_000_000,
            msg.redelivery_count()))
        consumer.acknowledge(msg)
    except Exception:
        consumer.negative_acknowledge(msg)

try:
    consumer.receive(timeout_millis=200)
except pulsar.Timeout:
    print("no more messages")

print("subscription:", consumer.subscription_name(), "named:", len(consumer.consumer_name()) > 0)
print("topic:", consumer.topic().endswith(topic), "connected:", consumer.is_connected())
print("message id:", type(msg.message_id()).__name__, msg.topic_name().endswith(topic))
print("no ordering key:", repr(msg.ordering_key()), "publish time set:", msg.publish_timestamp() > 0)
consumer.close()
producer.close()
client.close()
