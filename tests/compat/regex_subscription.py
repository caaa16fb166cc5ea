"""A pattern (regex) subscription over every matching topic of the namespace."""
import re
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
for name in ("x", "y"):
    client.create_producer(prefix + "-re-" + name).send(name.encode())
consumer = client.subscribe(re.compile("persistent://public/default/" + re.escape(prefix) + "-re-.*"), "sub",
                            initial_position=pulsar.InitialPosition.Earliest)
print(sorted(consumer.receive(5000).data() for _ in range(2)))
client.close()
