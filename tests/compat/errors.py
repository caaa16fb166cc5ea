"""The official exception classes: timeouts, use after close, cumulative ack on Shared, bad arguments."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-errors", "sub", consumer_type=pulsar.ConsumerType.Shared)
producer = client.create_producer(prefix + "-errors")


def attempt(label, action):
    try:
        action()
        print(label, "ok")
    except pulsar.PulsarException as error:
        print(label, type(error).__name__, isinstance(error, pulsar.PulsarException))
    except Exception as error:
        print(label, type(error).__name__)


producer.send(b"one")
message = consumer.receive(5000)
attempt("receive timeout:", lambda: consumer.receive(100))
attempt("cumulative ack on Shared:", lambda: consumer.acknowledge_cumulative(message))
attempt("content not bytes:", lambda: producer.send("text"))
attempt("timeout not an int:", lambda: consumer.receive(timeout_millis="100"))
attempt("properties not a dict:", lambda: producer.send(b"x", properties=[("a", "b")]))
attempt("deliver_after not a timedelta:", lambda: producer.send(b"x", deliver_after=100))
attempt("consumer type not a ConsumerType:", lambda: client.subscribe(prefix + "-errors", "s2", consumer_type=1))
attempt("batching with chunking:", lambda: client.create_producer(prefix + "-errors", batching_enabled=True,
                                                                   chunking_enabled=True))
attempt("dead letter count 0:", lambda: pulsar.ConsumerDeadLetterPolicy(0))
attempt("batch receive without limits:", lambda: pulsar.ConsumerBatchReceivePolicy(-1, -1, -1))
attempt("unacked timeout under 10 s:", lambda: client.subscribe(prefix + "-errors", "s3",
                                                                 unacked_messages_timeout_ms=5000))
attempt("one message per batch:", lambda: client.create_producer(prefix + "-errors", batching_max_messages=1))
attempt("seek with a string:", lambda: consumer.seek("earliest"))
attempt("topic with two parts:", lambda: client.create_producer("a/b"))
attempt("topic without a namespace:", lambda: client.subscribe("persistent://x", "s"))
attempt("empty topic:", lambda: client.create_reader("", pulsar.MessageId.earliest))
attempt("service URL without a scheme:", lambda: pulsar.Client("localhost:6650"))
consumer.acknowledge(message)
producer.close()
consumer.close()
attempt("send after close:", lambda: producer.send(b"late"))
attempt("receive after close:", lambda: consumer.receive(100))
client.close()
attempt("create after client close:", lambda: client.create_producer(prefix + "-errors"))
