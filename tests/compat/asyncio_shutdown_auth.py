"""pulsar.asyncio: close() after shutdown() is no error; a token supplier that fails gives an
AuthenticationError carrying the supplier's message."""
import asyncio
import os
import sys

import pulsar
from pulsar.asyncio import Client, PulsarException

service_url, prefix = sys.argv[1], sys.argv[2]


def failing_supplier():
    raise Exception("token supplier failed")


async def main():
    client = Client(service_url)
    producer = await client.create_producer(prefix + "-shutdown")
    await producer.send(b"one")
    client.shutdown()
    try:
        await producer.send(b"late")
    except PulsarException as error:
        print("after shutdown:", error.error())
    await client.close()
    print("close after shutdown: ok")
    try:
        await client.close()
        print("second close: ok")
    except PulsarException as error:
        print("second close:", error.error())
    client = Client(service_url, operation_timeout_seconds=5,
                    authentication=pulsar.AuthenticationToken(failing_supplier))
    results = []
    sys.stdout.flush()
    saved = os.dup(1)  # the official client prints the supplier's traceback to stdout: not compared
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    try:
        for label, action in (("producer", lambda: client.create_producer(prefix + "-auth")),
                              ("consumer", lambda: client.subscribe(prefix + "-auth", "sub"))):
            try:
                await action()
                results.append((label, "created"))
            except PulsarException as error:
                results.append((label, error.error(), "token supplier failed" in str(error)))
    finally:
        os.dup2(saved, 1)
    for result in results:
        print(*result)
    await client.close()


asyncio.run(main())
