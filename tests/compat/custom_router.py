"""A custom message router on a partitioned topic."""
# corpus: partitioned=routed:3
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)


def router(message, num_partitions):
    return int(message.partition_key()) % num_partitions


producer = client.create_producer(prefix + "-routed", message_router=router)
print([producer.send(b"m", partition_key=str(i)).partition() for i in range(6)])
client.close()
