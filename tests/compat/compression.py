"""Every compression type, with and without batching."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-zip", "sub")
kinds = [pulsar.CompressionType.NONE, pulsar.CompressionType.LZ4, pulsar.CompressionType.ZLib,
         pulsar.CompressionType.ZSTD, pulsar.CompressionType.SNAPPY]
for kind in kinds:
    for batching in (False, True):
        producer = client.create_producer(prefix + "-zip", compression_type=kind, batching_enabled=batching)
        producer.send(("%s %s " % (kind, batching)).encode() * 100)
        producer.close()
for _ in range(len(kinds) * 2):
    message = consumer.receive(5000)
    print(message.data()[:40], len(message.data()))
client.close()
