"""Token authentication, with the token given or supplied by a function."""
# corpus: broker=auth
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url, authentication=pulsar.AuthenticationToken("corpus-token"))
producer = client.create_producer(prefix + "-secure")
consumer = client.subscribe(prefix + "-secure", "sub", initial_position=pulsar.InitialPosition.Earliest)
producer.send(b"secret")
print("received:", consumer.receive(5000).data())
client.close()

supplier = pulsar.Client(service_url, authentication=pulsar.AuthenticationToken(lambda: "corpus-token"))
print("token from a function:", supplier.create_producer(prefix + "-secure").send(b"again").entry_id() >= 0)
supplier.close()
