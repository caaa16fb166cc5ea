"""Readers: from the earliest message, from a given id (exclusive, then inclusive), serialized ids,
has_message_available, read_next with a timeout, and a reader listener."""
import sys
import threading

import pulsar
from pulsar import MessageId

service_url, prefix = sys.argv[1], sys.argv[2]
topic = prefix + "-reader"
client = pulsar.Client(service_url)
producer = client.create_producer(topic)
ids = [producer.send(("msg-%d" % i).encode()) for i in range(5)]

reader = client.create_reader(topic, MessageId.earliest)
seen = []
while reader.has_message_available():
    seen.append(reader.read_next().data())
print("from earliest:", seen)
try:
    reader.read_next(timeout_millis=200)
except pulsar.Timeout:
    print("read_next timed out")
reader.close()

stored = ids[2].serialize()
start = MessageId.deserialize(stored)
print("deserialized equals:", start == ids[2], "ledger/entry kept:",
      (start.ledger_id(), start.entry_id()) == (ids[2].ledger_id(), ids[2].entry_id()))
after = client.create_reader(topic, start)
print("after id 2:", after.read_next(5000).data())
after.close()
inclusive = client.create_reader(topic, start, start_message_id_inclusive=True)
print("from id 2 inclusive:", inclusive.read_next(5000).data())
inclusive.close()

latest = client.create_reader(topic, MessageId.latest)
print("latest has messages:", latest.has_message_available())
producer.send(b"new")
print("latest reads:", latest.read_next(5000).data())
latest.close()

got = []
finished = threading.Event()


def on_message(reader, message):
    got.append(message.data())
    if len(got) == 6:
        finished.set()


listening = client.create_reader(topic, MessageId.earliest, reader_listener=on_message)
print("listener got all:", finished.wait(10), got)
listening.close()
client.close()
