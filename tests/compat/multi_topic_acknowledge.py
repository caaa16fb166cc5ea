"""A consumer of several topics takes acknowledgements of received messages and their ids, and
refuses (OperationNotSupported) an id that does not name its topic: the one send() returned, one
made by hand; a consumer of one topic takes them. Cumulative acknowledgement on Shared is refused."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
topic = prefix + "-a"
multi = client.subscribe([topic, prefix + "-b"], "multi", initial_position=pulsar.InitialPosition.Earliest)
single = client.subscribe(topic, "single", initial_position=pulsar.InitialPosition.Earliest,
                          consumer_type=pulsar.ConsumerType.Shared)
producer = client.create_producer(topic)
sent = producer.send(b"one")
for name, message_id in (("sent id", sent), ("made by hand", pulsar.MessageId(-1, sent.ledger_id(), sent.entry_id()))):
    try:
        multi.acknowledge(message_id)
        print("multi", name, "acknowledged")
    except pulsar.OperationNotSupported:
        print("multi", name, "OperationNotSupported")
received = multi.receive(5000)
multi.acknowledge(received)
multi.acknowledge(received.message_id())
print("multi received acknowledged", received.data())
single.acknowledge(sent)
print("single sent id acknowledged")
try:
    single.acknowledge_cumulative(sent)
except pulsar.CumulativeAcknowledgementNotAllowedError:
    print("single cumulative on Shared refused")
client.close()
