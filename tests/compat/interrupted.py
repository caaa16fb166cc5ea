"""Ctrl-C (SIGINT) while receive() waits raises pulsar.Interrupted, as the official client does."""
import signal
import sys
import threading
import time

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-sigint", "sub")


def interrupt():
    time.sleep(0.5)
    signal.raise_signal(signal.SIGINT)


threading.Thread(target=interrupt).start()
try:
    consumer.receive()
    print("received")
except pulsar.Interrupted as error:
    print("interrupted:", type(error).__name__, isinstance(error, pulsar.PulsarException))
except KeyboardInterrupt:
    print("KeyboardInterrupt")
client.close()
