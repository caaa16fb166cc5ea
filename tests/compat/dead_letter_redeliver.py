"""Dead letter policy with redeliver_unacknowledged_messages(): after max_redeliver_count rounds the
messages go to the dead letter topic instead of coming back."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
topic, dlq = prefix + "-work", prefix + "-work-dlq"
client = pulsar.Client(service_url)
dlq_consumer = client.subscribe(dlq, "dlq-sub")
consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                            dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2, dlq, "init-sub"))
producer = client.create_producer(topic)
for i in range(3):
    producer.send(b"m-%d" % i)
for round_ in range(3):
    received = sorted(consumer.receive(5000).data() for _ in range(3))
    print("round", round_, received)
    consumer.redeliver_unacknowledged_messages()
try:
    consumer.receive(500)
    print("redelivered again")
except pulsar.Timeout:
    print("not redelivered again")
dead = sorted(dlq_consumer.receive(5000).data() for _ in range(3))
print("dead letters:", dead)
client.close()
