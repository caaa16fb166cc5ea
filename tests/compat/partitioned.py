"""A partitioned topic: round-robin and single-partition routing, keyed messages, one consumer."""
# corpus: partitioned=orders:3
import collections
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-orders"
client = pulsar.Client(service_url)
print("partitions:", [p.rsplit("-", 1)[1] for p in client.get_topic_partitions(topic)])
consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)

producer = client.create_producer(topic, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
spread = collections.Counter(producer.send(b"rr-%d" % i).partition() for i in range(9))
print("round robin per partition:", sorted(spread.values()))
keyed = collections.defaultdict(set)
for i in range(12):
    key = "key-%d" % (i % 4)
    keyed[key].add(producer.send(b"keyed-%d" % i, partition_key=key).partition())
print("a key keeps its partition:", all(len(parts) == 1 for parts in keyed.values()))
print("partition of each key:", [sorted(keyed[key])[0] for key in sorted(keyed)])

single = client.create_producer(topic, message_routing_mode=pulsar.PartitionsRoutingMode.UseSinglePartition)
print("single partition:", len({single.send(b"single-%d" % i).partition() for i in range(6)}))

data = sorted(consumer.receive(5000).data() for _ in range(27))
print("received:", len(data), data[:3], data[-3:])
client.close()
