"""Broker answers as Pulsar gives them: a second Exclusive producer is fenced (ProducerFenced), a
Shared one beside an exclusive producer is busy (ProducerBusy); a topic in a tenant that does not
exist is not found (TopicNotFound), in `public` it is created."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url, operation_timeout_seconds=5)
topic = prefix + "-exclusive"


def attempt(label, action):
    try:
        action()
        print(label, "ok")
    except pulsar.PulsarException as error:
        print(label, type(error).__name__)


first = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
attempt("second exclusive:", lambda: client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive))
attempt("shared beside exclusive:", lambda: client.create_producer(topic))
first.close()
shared = client.create_producer(topic)
attempt("exclusive beside shared:", lambda: client.create_producer(topic,
                                                                   access_mode=pulsar.ProducerAccessMode.Exclusive))
shared.close()
attempt("unknown tenant producer:", lambda: client.create_producer("persistent://no-such-tenant-%s/ns/t" % prefix))
attempt("unknown tenant consumer:", lambda: client.subscribe("no-such-tenant-%s/ns/t" % prefix, "sub"))
attempt("public tenant:", lambda: client.create_producer("persistent://public/default/%s-made" % prefix))
client.close()
