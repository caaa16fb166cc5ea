"""A partly switched program: the official module's enums, MessageId and policies handed to the
client (the same module with `import pulsar`, pulsarwire's with the import swapped)."""
import importlib
import sys

import pulsar

official = importlib.import_module("pulsar")  # stays the official client after the swap
service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-mixed"
client = pulsar.Client(service_url)
consumer = client.subscribe(topic, "sub", consumer_type=official.ConsumerType.Shared,
                            initial_position=official.InitialPosition.Earliest,
                            key_shared_policy=None, regex_subscription_mode=official.RegexSubscriptionMode.PersistentOnly,
                            dead_letter_policy=official.ConsumerDeadLetterPolicy(3))
producer = client.create_producer(topic, compression_type=official.CompressionType.LZ4,
                                  message_routing_mode=official.PartitionsRoutingMode.UseSinglePartition,
                                  access_mode=official.ProducerAccessMode.Shared)
first = producer.send(b"one")
producer.send(b"two")
print([consumer.receive(5000).data() for _ in range(2)])
reader = client.create_reader(topic, official.MessageId.earliest)
print("reader from earliest:", reader.read_next(5000).data())
official_id = official.MessageId.deserialize(first.serialize())
reader.seek(official_id)
print("reader after seek:", reader.read_next(5000).data())
consumer.acknowledge(official_id)
key_shared = client.subscribe(topic, "ks", consumer_type=official.ConsumerType.KeyShared,
                              key_shared_policy=official.ConsumerKeySharedPolicy(official.KeySharedMode.AutoSplit))
print("key shared:", key_shared.subscription_name())
client.close()
