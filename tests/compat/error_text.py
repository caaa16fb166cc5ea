"""What official exceptions print (`Pulsar error: TimeOut`), and the bytes of a hand-built MessageId."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-text", "sub", consumer_type=pulsar.ConsumerType.Shared)
producer = client.create_producer(prefix + "-text")
for label, action in (("timeout", lambda: consumer.receive(100)),
                      ("cumulative on shared", lambda: consumer.acknowledge_cumulative(pulsar.MessageId.earliest))):
    try:
        action()
    except pulsar.PulsarException as error:
        print(label, "->", str(error))
producer.close()
try:
    producer.send(b"late")
except pulsar.PulsarException as error:
    print("closed ->", str(error))
for args in ((), (1, 2, 3, 4), (-1, 5, 6, -1), (0, 7, 8, 0)):
    message_id = pulsar.MessageId(*args)
    print(args, message_id.serialize(), str(message_id))
print("earliest", pulsar.MessageId.earliest.serialize())
print("latest", pulsar.MessageId.latest.serialize())
client.close()
