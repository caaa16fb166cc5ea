"""Dead letter policy: after max_redeliver_count redeliveries the message goes to the DLQ topic."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic, dlq = prefix + "-work", prefix + "-work-dlq"
client = pulsar.Client(service_url)
dlq_consumer = client.subscribe(dlq, "dlq-sub")
consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                            negative_ack_redelivery_delay_ms=100,
                            dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2,
                                                                              dead_letter_topic=dlq))
producer = client.create_producer(topic)
producer.send(b"poison", properties={"k": "v"})
for attempt in range(3):
    message = consumer.receive(5000)
    print("attempt", attempt, message.data(), message.redelivery_count())
    consumer.negative_acknowledge(message)
dead = dlq_consumer.receive(5000)
print("dead letter:", dead.data(), dead.properties().get("k"))
try:
    consumer.receive(500)
except pulsar.Timeout:
    print("not redelivered again")
client.close()
