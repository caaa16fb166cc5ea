"""Key_Shared with sticky hash ranges given by the consumer."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-sticky"
client = pulsar.Client(service_url)
policy = pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[(0, 65535)])
print("policy:", policy.key_shared_mode, policy.sticky_ranges, policy.allow_out_of_order_delivery)
consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.KeyShared, key_shared_policy=policy)
producer = client.create_producer(topic)
for i in range(10):
    producer.send(b"m-%d" % i, partition_key="key-%d" % i)
print(sorted(consumer.receive(5000).data() for _ in range(10)))
client.close()
