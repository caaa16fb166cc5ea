"""reads: socket reads stay under glibc's mmap threshold unless the flow is bulk."""
from __future__ import annotations

import asyncio
import socket

from pulsarwire.reads import BULK_READ_SIZE, READ_SIZE, adapt_reads, tune_reads


class _Transport:
    max_size = 256 * 1024


def test_reads_start_under_the_mmap_threshold():
    transport = _Transport()
    assert tune_reads(transport)  # its reads can be sized
    assert transport.max_size == READ_SIZE < 128 * 1024


def test_full_reads_grow_to_bulk_and_a_small_read_brings_them_back():
    transport = _Transport()
    tune_reads(transport)
    adapt_reads(transport, 100)
    assert transport.max_size == READ_SIZE
    adapt_reads(transport, READ_SIZE)  # came back full: more is waiting
    assert transport.max_size == BULK_READ_SIZE
    adapt_reads(transport, BULK_READ_SIZE // 2)  # still a bulk flow
    assert transport.max_size == BULK_READ_SIZE
    adapt_reads(transport, 60)  # a receipt: the flow is not bulk now
    assert transport.max_size == READ_SIZE


def test_a_transport_without_a_read_size_is_left_alone():
    class Tls:
        pass
    transport = Tls()
    assert not tune_reads(transport)
    assert not hasattr(transport, "max_size")


def test_an_asyncio_socket_transport_takes_the_read_size():
    async def main():
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        try:
            assert transport.max_size > READ_SIZE  # asyncio's own: 256 KiB
            tune_reads(transport)
            assert transport.max_size == READ_SIZE
        finally:
            transport.close()
            theirs.close()
    asyncio.run(main())


def test_the_broker_grows_its_reads_no_further_than_asyncio_did():
    from pulsarwire.reads import BROKER_BULK_READ_SIZE
    transport = _Transport()
    tune_reads(transport)
    adapt_reads(transport, READ_SIZE, BROKER_BULK_READ_SIZE)
    assert transport.max_size == BROKER_BULK_READ_SIZE == 256 * 1024
    adapt_reads(transport, BROKER_BULK_READ_SIZE, BROKER_BULK_READ_SIZE)
    assert transport.max_size == BROKER_BULK_READ_SIZE
