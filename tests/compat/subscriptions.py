"""Failover and Exclusive subscriptions, unsubscribe, the last message id, flush with batching."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-subs"
client = pulsar.Client(service_url)
first = client.subscribe(topic, "failover", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a")
second = client.subscribe(topic, "failover", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
try:
    client.subscribe(topic, "exclusive")
    client.subscribe(topic, "exclusive")
except pulsar.ConsumerBusy:
    print("exclusive subscription busy")

producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
for i in range(6):
    producer.send_async(b"m-%d" % i, None)
producer.flush()
counts = []
for consumer in (first, second):
    count = 0
    while True:
        try:
            consumer.acknowledge(consumer.receive(300))
            count += 1
        except pulsar.Timeout:
            break
    counts.append(count)
print("one active consumer got all:", sorted(counts))
last = first.get_last_message_id()
print("last message id type:", type(last).__name__, last.entry_id() >= 0)
second.close()
first.unsubscribe()
print("unsubscribed, connected:", first.is_connected())
fresh = client.subscribe(topic, "failover", initial_position=pulsar.InitialPosition.Earliest)
print("resubscribed from the earliest:", fresh.receive(5000).data())
client.close()
