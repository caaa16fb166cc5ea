"""batch_receive() under a ConsumerBatchReceivePolicy."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-batch", "sub",
                            batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(10, -1, 300))
producer = client.create_producer(prefix + "-batch")
for i in range(25):
    producer.send(("msg-%d" % i).encode())

batches = []
while sum(len(b) for b in batches) < 25:
    batch = consumer.batch_receive()
    if not batch:
        break
    batches.append(batch)
    for message in batch:
        consumer.acknowledge(message)
print("batches within the limit:", all(0 < len(b) <= 10 for b in batches))
print("messages:", [m.data().decode() for b in batches for m in b])
print("an empty batch after the timeout:", consumer.batch_receive())
client.close()
