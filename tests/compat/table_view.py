"""A table view: the latest value of every key of a topic."""
import sys
import time

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
producer = client.create_producer(prefix + "-table")
for key, value in (("a", b"1"), ("b", b"2"), ("a", b"3")):
    producer.send(value, partition_key=key)
view = client.create_table_view(prefix + "-table")
deadline = time.time() + 5
while len(view) < 2 and time.time() < deadline:
    time.sleep(0.05)
print(len(view), view.get("a"), view.get("b"), view.get("missing"))
view.close()
client.close()
