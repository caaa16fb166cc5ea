"""Consumer and reader seek to a message id: exclusive by default, as the official client."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-seekid"
client = pulsar.Client(service_url)
consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
producer = client.create_producer(topic)
ids = [producer.send(("msg-%d" % i).encode()) for i in range(5)]
for _ in range(5):
    consumer.acknowledge(consumer.receive(5000))
consumer.seek(ids[2])
print("consumer after seek to id 2:", consumer.receive(5000).data())

reader = client.create_reader(topic, pulsar.MessageId.earliest)
reader.seek(ids[2])
print("reader after seek to id 2:", reader.read_next(5000).data())
inclusive = client.create_reader(topic, pulsar.MessageId.earliest, start_message_id_inclusive=True)
inclusive.seek(ids[2])
print("inclusive reader after seek to id 2:", inclusive.read_next(5000).data())
client.close()
