"""A consumer with a message listener running on the client's listener thread."""
import sys
import threading
import time

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
received = []
threads = set()
done = threading.Event()


def my_listener(consumer, message):
    received.append(message.data())
    threads.add(threading.current_thread() is threading.main_thread())
    consumer.acknowledge(message)
    if len(received) == 10:
        done.set()


client = pulsar.Client(service_url)
consumer = client.subscribe(prefix + "-listener", "my-subscription", consumer_type=pulsar.ConsumerType.Shared,
                            message_listener=my_listener)
producer = client.create_producer(prefix + "-listener")
for i in range(10):
    producer.send(("Hello-%d" % i).encode("utf-8"))
print("all delivered:", done.wait(10))
print(received)
print("on the main thread:", threads)

consumer.pause_message_listener()
producer.send(b"while paused")
time.sleep(0.3)
print("delivered while paused:", len(received) - 10)
consumer.resume_message_listener()
deadline = time.time() + 5
while len(received) < 11 and time.time() < deadline:
    time.sleep(0.01)
print("after resume:", received[10:])
client.close()
