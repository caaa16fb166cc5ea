"""redeliver_unacknowledged_messages() sends back what was received and not acknowledged."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-redeliver", "sub")
producer = client.create_producer(prefix + "-redeliver")
for i in range(4):
    producer.send(b"m-%d" % i)
first = [consumer.receive(5000) for _ in range(4)]
consumer.acknowledge(first[0])
consumer.redeliver_unacknowledged_messages()
again = [consumer.receive(5000).data() for _ in range(3)]
print("redelivered:", again)
try:
    consumer.receive(300)
except pulsar.Timeout:
    print("nothing else")
client.close()
