"""reads: socket reads stay under glibc's mmap threshold unless the flow is bulk."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import pytest

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


_CHURN = """
import resource, sys
from pulsarwire import reads
kept = reads.keep_read_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(100):  # what a bulk read's buffers do: megabytes allocated and freed, sizes varying
    held = [b"x" * (1 << 20) for _ in range(3)]
    held.append(b"y" * ((3 << 20) - 1000 * i))
    del held
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _churn(**env: str) -> tuple[bool, int]:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("MALLOC_", "PULSARWIRE_TUNE", "GLIBC_TUNABLES"))}
    environment.update(env)
    out = subprocess.run([sys.executable, "-c", _CHURN], env=environment, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_read_buffers_are_kept_for_the_next_reads_not_faulted_in_again():
    kept, faults = _churn()
    assert kept
    assert faults < 100 * 64  # 6 MiB a round, 1 536 pages: faulted in once, then reused
    untouched, untouched_faults = _churn(PULSARWIRE_TUNE_MALLOC="0")
    assert not untouched and untouched_faults > 10 * faults
    # a user's own malloc tuning is theirs
    assert _churn(MALLOC_TRIM_THRESHOLD_="1048576")[0] is False
    assert _churn(GLIBC_TUNABLES="glibc.malloc.trim_threshold=1048576")[0] is False
    assert _churn(GLIBC_TUNABLES="glibc.rtld.nns=4")[0] is True  # not malloc's
