"""close() after shutdown() is no error (once; a second close raises AlreadyClosed), as closing twice."""
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
for shut_down_first in (True, False):
    client = pulsar.Client(service_url)
    client.create_producer(prefix + "-shutdown").send(b"x")
    if shut_down_first:
        client.shutdown()
    for attempt in range(2):
        try:
            client.close()
            print("shutdown" if shut_down_first else "plain", "close", attempt, "ok")
        except pulsar.AlreadyClosed as error:
            print("shutdown" if shut_down_first else "plain", "close", attempt, str(error))
