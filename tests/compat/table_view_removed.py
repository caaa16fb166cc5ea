"""A table view's listener sees a removed key (an empty value) as b'' (the decoded empty value with
a schema), as the official client passes it."""
import sys
import time

import pulsar
from pulsar.schema import StringSchema

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
for suffix, schema, values in (("-raw", None, (b"v1", b"")), ("-str", StringSchema(), ("v1", ""))):
    topic = prefix + suffix
    view = client.create_table_view(topic, schema=schema) if schema else client.create_table_view(topic)
    events = []
    view.for_each_and_listen(lambda key, value: events.append((key, value)))
    producer = client.create_producer(topic, schema=schema) if schema else client.create_producer(topic)
    for value in values:
        producer.send(value, partition_key="k")
    deadline = time.time() + 5
    while len(events) < 2 and time.time() < deadline:
        time.sleep(0.05)
    print(suffix, events, len(view))
client.close()
