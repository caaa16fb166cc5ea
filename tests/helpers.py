"""Builders for frames, and the asyncio client helpers, used across the tests."""
from __future__ import annotations

import asyncio
import errno
import os

from pulsarwire import Client
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.broker.storage import FileOps


def send_command(producer_id=1, sequence_id=0, num_messages=1):
    return pb.BaseCommand(type=pb.BaseCommand.SEND, send=pb.CommandSend(
        producer_id=producer_id, sequence_id=sequence_id, num_messages=num_messages))


def message_command(consumer_id=1, ledger=7, entry=9):
    return pb.BaseCommand(type=pb.BaseCommand.MESSAGE, message=pb.CommandMessage(
        consumer_id=consumer_id, message_id=pb.MessageIdData(ledgerId=ledger, entryId=entry)))


def metadata(count=None, compression=0, uncompressed_size=None, **fields):
    md = pb.MessageMetadata(producer_name="test-producer", sequence_id=fields.pop("sequence_id", 0),
                            publish_time=1_700_000_000_000, compression=compression, **fields)
    if count is not None:
        md.num_messages_in_batch = count
    if uncompressed_size is not None:
        md.uncompressed_size = uncompressed_size
    return md


def batch_frame(twin, payloads, compression=0, with_checksum=True, **add_kwargs):
    """A Send frame carrying `payloads` as one batch, compressed as asked."""
    from pulsarwire import compression as comp

    builder = twin.BatchBuilder()
    for index, payload in enumerate(payloads):
        builder.add(payload, properties={"i": str(index)}, partition_key=f"k{index}",
                    event_time=1000 + index, **add_kwargs)
    raw = builder.build()
    md = metadata(count=len(payloads), compression=compression, uncompressed_size=len(raw))
    return twin.encode_payload_command(send_command(num_messages=len(payloads)), md,
                                       comp.compress(compression, raw), with_checksum=with_checksum)


PING = pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing())


PATIENCE = 30.0  # how long a test waits for something a loaded machine may be slow to do


def wait_until(predicate, timeout: float = PATIENCE, step: float = 0.02):
    """Poll `predicate` until it returns something true or `timeout` passes; its last value.
    For what the code under test does in the background: a fixed sleep is too short on a
    loaded machine and too long on an idle one."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


async def wait_until_async(predicate, timeout: float = PATIENCE, step: float = 0.02):
    """`wait_until` on an event loop: the loop goes on running while it waits."""
    import asyncio
    import time
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(step)


# the asyncio client in a test

def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def client_for(broker, **options):
    options.setdefault("operation_timeout_seconds", 10)
    options.setdefault("initial_backoff_seconds", 0.05)
    options.setdefault("max_backoff_seconds", 0.5)
    return Client(broker.url, **options)


async def drain(consumer, count, timeout_ms=5000, ack=True):
    out = []
    for _ in range(count):
        message = await consumer.receive(timeout_ms)
        out.append(message)
        if ack:
            consumer.acknowledge(message)
    return out


# a file system that fills up

class FillingDisk(FileOps):
    """A file system with `room` bytes left (None: unlimited); writes past it fail with ENOSPC
    after writing what fits, as a real full disk does. `json_fails` fails state-file writes."""

    def __init__(self) -> None:
        self.room: int | None = None
        self.json_fails = False
        self.truncate_fails = False

    def pwrite(self, fd, data, offset):
        if self.room is None:
            return super().pwrite(fd, data, offset)
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        written = super().pwrite(fd, bytes(data[:self.room]), offset)
        self.room -= written
        return written

    def truncate(self, fd, size):
        if self.truncate_fails:
            raise OSError(errno.EIO, "Input/output error")
        if self.room is not None:  # a truncated file gives its space back
            self.room += max(0, os.fstat(fd).st_size - size)
        super().truncate(fd, size)

    def replace_file(self, path, data):
        if self.json_fails:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().replace_file(path, data)


# TLS

def self_signed_certificate(directory):
    """A certificate for 127.0.0.1 (and localhost) with its key, made by openssl in `directory`:
    (cert path, key path). Skips the test where openssl is missing."""
    import pathlib
    import shutil
    import subprocess

    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = pathlib.Path(directory) / "cert.pem", pathlib.Path(directory) / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key
