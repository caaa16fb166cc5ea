"""send_async with a callback(res, msg_id); a full non-blocking queue is reported to the callback."""
import sys
import threading

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-cb", "sub")
producer = client.create_producer(prefix + "-cb", block_if_queue_full=True, batching_enabled=True,
                                  batching_max_publish_delay_ms=10)
results = []
lock = threading.Lock()


def callback(res, msg_id):
    with lock:
        results.append((res, msg_id))


for i in range(50):
    producer.send_async(("Hello-%d" % i).encode("utf-8"), callback)
producer.flush()
print("callbacks:", len(results), "all ok:", all(res == pulsar.Result.Ok for res, _ in results))
print("result prints as:", results[0][0], "id type:", type(results[0][1]).__name__)
received = [consumer.receive(5000).data() for _ in range(50)]
print("received in order:", received == [("Hello-%d" % i).encode() for i in range(50)])

# the default: no blocking, a full queue fails the message through its callback
impatient = client.create_producer(prefix + "-cb-full", max_pending_messages=1)
outcomes = []
for i in range(200):
    impatient.send_async(b"x", lambda res, msg_id: outcomes.append(res))
impatient.flush()
print("outcomes:", len(outcomes), "some queue full:", pulsar.Result.ProducerQueueIsFull in outcomes,
      "only ok or full:", set(outcomes) <= {pulsar.Result.Ok, pulsar.Result.ProducerQueueIsFull})
failed = [r for r in outcomes if r != pulsar.Result.Ok]
print("first failure:", failed[0] if failed else None)
impatient.close()
producer.close()
# after close, send_async reports AlreadyClosed to the callback
late = []
producer.send_async(b"late", lambda res, msg_id: late.append((res, str(msg_id))))
print("after close:", late)
client.close()
