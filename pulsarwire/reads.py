"""How much an asyncio socket transport reads at a time, for the client's connections and the
broker's.

asyncio's selector transport reads up to 256 KiB into a new bytes object each time. glibc serves
an allocation over its 128 KiB threshold with mmap and shrinks it with mremap, so every read of a
few bytes cost three system calls and a page fault: 8.6 us for a 60-byte receipt, against 0.9 us
from the heap (a send loop's round trip went from 150 to 141 us). So reads start just under the
threshold, and grow to BULK_READ_SIZE while they come back full (a bulk flow: fewer reads, and
fewer frames split across two of them), back again once one comes back small."""
from __future__ import annotations

from typing import Any

READ_SIZE = 127 * 1024
BULK_READ_SIZE = 1024 * 1024
# the broker's reads grow no further than asyncio's own: its memory bounds were measured with them
BROKER_BULK_READ_SIZE = 256 * 1024


def tune_reads(transport: Any) -> bool:
    """Start `transport`'s reads at READ_SIZE (a selector socket transport's `max_size`); whether
    its reads can be sized (adapt_reads), which TLS transports' cannot: they read into a buffer
    of their own and keep it."""
    if not hasattr(transport, "max_size"):
        return False
    if transport.max_size > READ_SIZE:
        transport.max_size = READ_SIZE
    return True


def adapt_reads(transport: Any, received: int, bulk: int = BULK_READ_SIZE) -> None:
    """After a read of `received` bytes: a full read means more is waiting (read `bulk` at a
    time), a small one that the flow is not bulk (read small)."""
    size = transport.max_size
    if received >= size:
        if size < bulk:
            transport.max_size = bulk
    elif size > READ_SIZE and received < READ_SIZE // 2:
        transport.max_size = READ_SIZE
