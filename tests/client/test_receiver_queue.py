"""The receiver queue's cross-thread takes: `take()` pops without a lock while the loop's
thread drops a partition's messages (`remove_from`) or another thread takes a bounded batch
(`take_many`); no message may be lost or handed out twice."""
from __future__ import annotations

import threading

from pulsarwire.client.consumer import MessageQueue


class _Owner:
    pass


class _Unit:
    __slots__ = ("owner",)

    def __init__(self, owner: _Owner) -> None:
        self.owner = owner


class _Message:
    __slots__ = ("_ack_unit", "n", "_payload")

    def __init__(self, owner: _Owner, n: int, size: int = 1) -> None:
        self._ack_unit = _Unit(owner)
        self.n = n
        self._payload = memoryview(bytes(size))

    def payload_view(self) -> memoryview:
        return self._payload


def test_take_without_a_lock_against_remove_from_loses_and_repeats_nothing():
    queue = MessageQueue()
    kept_owner, dropped_owner = _Owner(), _Owner()
    total = 200_000
    for n in range(total):
        queue.put(_Message(kept_owner if n % 3 else dropped_owner, n))  # type: ignore[arg-type]
    taken: list[int] = []
    stop = threading.Event()

    def taker() -> None:
        while not stop.is_set() or len(queue):
            message = queue.take()
            if message is not None:
                taken.append(message.n)

    thread = threading.Thread(target=taker)
    thread.start()
    removed = 0
    for _ in range(50):
        removed += queue.remove_from(dropped_owner)  # type: ignore[arg-type]
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    assert len(taken) == len(set(taken))  # none handed out twice
    dropped_taken = sum(1 for n in taken if n % 3 == 0)
    assert len(taken) + removed == total  # every message taken or removed
    assert dropped_taken + removed == len(range(0, total, 3))
    kept_in_order = [n for n in taken if n % 3]
    assert kept_in_order == sorted(kept_in_order)  # one taker sees the queue's order


def test_take_many_stops_at_max_bytes_and_leaves_the_next_message_first():
    queue = MessageQueue()
    owner = _Owner()
    for n in range(5):
        queue.put(_Message(owner, n, size=10))  # type: ignore[arg-type]
    out, size, full = queue.take_many(10, max_bytes=25)
    assert [m.n for m in out] == [0, 1] and size == 20 and full  # type: ignore[attr-defined]
    assert queue.take().n == 2  # type: ignore[union-attr]


def test_take_many_and_take_together_lose_and_repeat_nothing():
    queue = MessageQueue()
    owner = _Owner()
    total = 100_000
    for n in range(total):
        queue.put(_Message(owner, n))  # type: ignore[arg-type]
    got: list[int] = []
    lock = threading.Lock()

    def single() -> None:
        while len(queue):
            message = queue.take()
            if message is not None:
                with lock:
                    got.append(message.n)

    thread = threading.Thread(target=single)
    thread.start()
    while len(queue):
        out, _, _ = queue.take_many(100, max_bytes=50)
        with lock:
            got.extend(m.n for m in out)  # type: ignore[attr-defined]
    thread.join(30)
    assert sorted(got) == list(range(total))
