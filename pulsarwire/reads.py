"""How much an asyncio socket transport reads at a time, for the client's connections and the
broker's, and how the memory of the client's reads is kept for the next ones (keep_read_memory).

asyncio's selector transport reads up to 256 KiB into a new bytes object each time. glibc serves
an allocation over its 128 KiB threshold with mmap and shrinks it with mremap, so every read of a
few bytes cost three system calls and a page fault: 8.6 us for a 60-byte receipt, against 0.9 us
from the heap (a send loop's round trip went from 150 to 141 us). So reads start just under the
threshold, and grow to BULK_READ_SIZE while they come back full (a bulk flow: fewer reads, and
fewer frames split across two of them), back again once one comes back small."""
from __future__ import annotations

import ctypes
import os
import sys
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


# glibc's mallopt(3) parameters, and what the client sets them to (keep_read_memory)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
HEAP_UP_TO_BYTES = 4 * 1024 * 1024
KEEP_FREED_BYTES = 8 * 1024 * 1024
# a user's own malloc tuning is left as it is
_USER_TUNING = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_kept: bool | None = None  # None: not decided yet in this process


def keep_read_memory() -> bool:
    """Have glibc serve allocations up to HEAP_UP_TO_BYTES from its heap and keep up to
    KEEP_FREED_BYTES of freed memory for reuse (once per process; whether it did).

    A client reading a bulk flow allocates a megabyte-sized bytes object for each read, and one
    for each frame split across two reads, and frees them as their messages are dropped. glibc
    gave that memory back to the system at once (its trim threshold follows its mmap threshold,
    2 MiB at most by then) and faulted it in again for the next read, page by page: a fifth of
    the loop thread's time receiving 1 KiB messages (some 19 000 page faults a 100 000 messages
    before, none after). The cost: up to KEEP_FREED_BYTES freed and not returned per malloc
    arena. Not done where PULSARWIRE_TUNE_MALLOC=0, where the user tunes malloc through its own
    environment variables (or GLIBC_TUNABLES' glibc.malloc), or where the C library is not glibc."""
    global _kept
    if _kept is None:
        _kept = False
        if sys.platform.startswith("linux") and os.environ.get("PULSARWIRE_TUNE_MALLOC", "1") != "0" \
                and not any(name in os.environ for name in _USER_TUNING) \
                and "glibc.malloc" not in os.environ.get("GLIBC_TUNABLES", ""):
            try:
                libc = ctypes.CDLL(None)
            except OSError:
                return False
            if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
                return False  # not glibc (musl's mallopt does nothing)
            mallopt = libc.mallopt
            mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
            _kept = bool(mallopt(_M_MMAP_THRESHOLD, HEAP_UP_TO_BYTES)) and \
                bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))
    return _kept
