"""With batching (the asyncio default), the id send() returns is the id the consumer sees."""
import asyncio
import sys

import pulsar
from pulsar.asyncio import Client

service_url, prefix = sys.argv[1], sys.argv[2]


async def main():
    client = Client(service_url)
    consumer = await client.subscribe(prefix + "-ids", "sub")
    producer = await client.create_producer(prefix + "-ids")
    sent = await producer.send(b"one")
    received = (await consumer.receive()).message_id()
    print("batch index:", sent.batch_index(), received.batch_index(), "same id:", str(sent) == str(received))
    await client.close()


asyncio.run(main())
