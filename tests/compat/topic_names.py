"""Topic names as the official client takes them: a local name may hold '/' in a fully qualified
name (five segments and more); short names are `topic` or `tenant/namespace/topic`."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
for name in ("persistent://public/default/%s/a/b" % prefix, "persistent://public/default/%s/x" % prefix,
             "public/default/%s/y" % prefix, "%s/z" % prefix):
    try:
        consumer = client.subscribe(name, "sub")
        producer = client.create_producer(name)
        producer.send(b"hello")
        print(name.replace(prefix, "P"), producer.topic().replace(prefix, "P"), consumer.receive(5000).data())
    except pulsar.PulsarException as error:
        print(name.replace(prefix, "P"), type(error).__name__)
client.close()
