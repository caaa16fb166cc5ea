"""send(None) publishes a null value (a tombstone): received with has_null_value() True and
data()/value() empty, unlike an empty payload; alone or in a batch, with a key and properties; a
table view drops its key, and a StringSchema producer sends it too."""
import sys
import time

import pulsar
from pulsar.schema import StringSchema

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
for batching in (False, True):
    topic = f"{prefix}-batching-{batching}"
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=batching)
    producer.send(b"value", partition_key="k1")
    producer.send_async(None, lambda result, message_id: None, partition_key="k1", properties={"op": "delete"})
    producer.send(None)
    producer.send(b"", partition_key="k2")
    producer.flush()
    for _ in range(4):
        message = consumer.receive(5000)
        print(batching, repr(message.data()), repr(message.value()), message.has_null_value(),
              repr(message.partition_key()), message.properties())
    view = client.create_table_view(topic)
    print("table view", len(view), view.get("k1"), view.get("k2"))
    view.close()

topic = prefix + "-string"
consumer = client.subscribe(topic, "sub", schema=StringSchema())
producer = client.create_producer(topic, schema=StringSchema())
producer.send("text", partition_key="k")
producer.send(None, partition_key="k")
for _ in range(2):
    message = consumer.receive(5000)
    print("string", repr(message.value()), message.has_null_value())
view = client.create_table_view(topic, schema=StringSchema())
producer.send("again", partition_key="k")
deadline = time.time() + 5
while view.get("k") != "again" and time.time() < deadline:
    time.sleep(0.05)
producer.send(None, partition_key="k")
while view.get("k") is not None and time.time() < deadline:
    time.sleep(0.05)
print("string table view", len(view), view.get("k"))
client.close()
