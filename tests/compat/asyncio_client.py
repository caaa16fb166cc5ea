"""The asyncio client (pulsar.asyncio)."""
import asyncio
import sys

import pulsar
from pulsar.asyncio import Client, PulsarException

service_url, prefix = sys.argv[1], sys.argv[2]


async def main():
    client = Client(service_url)
    topic = prefix + "-async"
    consumer = await client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = await client.create_producer(topic)
    ids = await asyncio.gather(*(producer.send(("msg-%d" % i).encode(), properties={"i": str(i)})
                                 for i in range(5)))
    print("ids:", len(ids), type(ids[0]).__name__)
    for _ in range(5):
        message = await consumer.receive()
        print(message.data(), message.properties())
        await consumer.acknowledge(message)
    try:
        await asyncio.wait_for(consumer.receive(), 0.3)
    except asyncio.TimeoutError:
        print("no more")
    print("names:", producer.topic().endswith(topic), consumer.subscription_name(), len(consumer.consumer_name()))
    reader = await client.create_reader(topic, pulsar.MessageId.earliest)
    print("reader:", await reader.has_message_available(), (await reader.read_next()).data())
    await reader.close()
    await producer.close()
    try:
        await producer.send(b"late")
    except PulsarException as error:
        print("after close:", error.error(), type(error).__name__)
    shared = await client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
    try:
        await shared.acknowledge_cumulative(message)
    except PulsarException as error:
        print("cumulative on shared:", error.error())
    print("partitions:", len(await client.get_topic_partitions(topic)))
    await client.close()


asyncio.run(main())
