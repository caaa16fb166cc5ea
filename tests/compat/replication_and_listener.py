"""send(replication_clusters=..., disable_replication=...) on a single cluster stores the message;
Client(listener_name=...) names an advertised listener; a lookup naming one the broker lacks is
retried until the operation timeout (Timeout)."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-repl"
client = pulsar.Client(service_url)
consumer = client.subscribe(topic, "sub")
producer = client.create_producer(topic)
producer.send(b"to-some", replication_clusters=["standalone", "elsewhere"])
producer.send(b"local-only", disable_replication=True)
print([consumer.receive(5000).data() for _ in range(2)])
try:
    producer.send(b"x", replication_clusters="standalone")
except ValueError:
    print("clusters not a list: ValueError")
client.close()

client = pulsar.Client(service_url, listener_name="no-such-listener", operation_timeout_seconds=2)
try:
    client.create_producer(topic)
    print("created")
except pulsar.PulsarException as error:
    # the refused lookup is retried until the operation timeout
    print("unknown listener:", type(error).__name__)
client.close()
