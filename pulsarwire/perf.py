"""Load generation and measurement, like pulsar-perf: produce, consume, end-to-end.

Each message carries its send time (8 bytes, big-endian nanoseconds from
time.time_ns) at the start of its payload, so end-to-end latency is exact
rather than rounded to the broker's millisecond publish time.
"""
from __future__ import annotations

import asyncio
import functools
import os
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import timers
from .client import Client, InitialPosition
from .messages import MessageId

_STAMP = struct.Struct(">Q")


async def pace_until(loop: asyncio.AbstractEventLoop, due: float) -> None:
    """Return at monotonic time `due`, on time on any loop (timers.call_at: asyncio's own loop
    sleeps whole milliseconds, so asyncio.sleep sent a millisecond's messages at once there: at
    20 000 msg/s, bursts of 20 that each started a batch and waited out its whole delay, 1.96 ms
    at the median where evenly spaced sends on pulsarwire's loop waited 0.88 ms)."""
    woken = loop.create_future()
    timers.call_at(loop, timers.loop_time_at(loop, due), functools.partial(_wake, woken))
    await woken


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


def _after(callback: Callable[[asyncio.Future[MessageId], float], None], sent_at: float,
           future: asyncio.Future[MessageId]) -> None:
    callback(future, sent_at)


@dataclass
class Result:
    role: str
    messages: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / 1e6 if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "messages": self.messages, "bytes": self.payload_bytes,
                "seconds": round(self.seconds, 3), "msg_per_s": round(self.rate, 1),
                "mb_per_s": round(self.mb_per_s, 2), "p50_ms": round(self.percentile(0.5), 3),
                "p99_ms": round(self.percentile(0.99), 3), "max_ms": round(self.percentile(1.0), 3),
                "errors": self.errors}


def format_table(results: list[Result]) -> str:
    header = f"{'role':<10}{'messages':>12}{'msg/s':>14}{'MB/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'errors':>8}"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r.role:<10}{r.messages:>12,}{r.rate:>14,.0f}{r.mb_per_s:>10.1f}"
                     f"{r.percentile(0.5):>10.2f}{r.percentile(0.99):>10.2f}{r.percentile(1.0):>10.2f}"
                     f"{r.errors:>8}")
    return "\n".join(lines)


def _payload(size: int) -> bytearray:
    return bytearray(os.urandom(max(size, _STAMP.size)))


class _Progress:
    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled
        self.count = 0
        self._last = time.monotonic()
        self._last_count = 0

    def tick(self, n: int = 1) -> None:
        self.count += n
        if self.enabled:
            now = time.monotonic()
            if now - self._last >= 1.0:
                rate = (self.count - self._last_count) / (now - self._last)
                print(f"  {self.label}: {self.count:,} messages, {rate:,.0f} msg/s", file=sys.stderr)
                self._last, self._last_count = now, self.count


async def produce(client: Client, topic: str, *, messages: int = 0, duration: float = 0, size: int = 1024,
                  rate: float = 0, batching: bool = True, compression: str = "NONE",
                  max_pending: int = 5000, progress: bool = False) -> Result:
    """Send until `messages` are acknowledged or `duration` seconds pass; rate 0 = as fast as possible."""
    producer = await client.create_producer(topic, batching_enabled=batching, compression_type=compression,
                                            max_pending_messages=max_pending, block_if_queue_full=True,
                                            batching_max_publish_delay_ms=1)
    result = Result("produce")
    meter = _Progress("produce", progress)
    payload = _payload(size)
    start = time.monotonic()
    deadline = start + duration if duration else None
    sent = 0
    latencies = result.latencies_ms

    def done(future: asyncio.Future[MessageId], sent_at: float) -> None:
        if future.exception() is not None:
            result.errors += 1
            return
        latencies.append((time.perf_counter() - sent_at) * 1000)
        meter.tick()

    loop = asyncio.get_running_loop()
    while (not messages or sent < messages) and (deadline is None or time.monotonic() < deadline):
        if rate:
            due = start + sent / rate
            if due > time.monotonic():
                await pace_until(loop, due)
        _STAMP.pack_into(payload, 0, time.time_ns())
        future = await producer.send_async(bytes(payload))
        sent_at = time.perf_counter()
        future.add_done_callback(functools.partial(_after, done, sent_at))
        sent += 1
        if sent % 1000 == 0:
            await asyncio.sleep(0)
    await producer.flush()
    result.seconds = time.monotonic() - start
    result.messages = len(latencies)
    result.payload_bytes = result.messages * len(payload)
    await producer.close()
    return result


async def consume(client: Client, topic: str, *, messages: int = 0, duration: float = 0,
                  subscription: str = "perf", earliest: bool = True, progress: bool = False,
                  ready: asyncio.Event | None = None, idle_timeout: float = 10.0,
                  target: dict[str, int] | None = None) -> Result:
    """Receive (and acknowledge) until `messages` arrived or `duration` passed.

    `target`, when given, is read on every round: {"messages": n} sets the count
    to stop at once it is known (end-to-end runs learn it when producing ends).
    """
    consumer = await client.subscribe(topic, subscription, receiver_queue_size=2000,
                                      initial_position=InitialPosition.Earliest if earliest
                                      else InitialPosition.Latest)
    if ready is not None:
        ready.set()
    result = Result("consume")
    meter = _Progress("consume", progress)
    start = None
    deadline = time.monotonic() + duration if duration else None
    latencies = result.latencies_ms
    last_message = time.monotonic()
    while deadline is None or time.monotonic() < deadline:
        limit = target.get("messages", 0) if target is not None else messages
        if limit and result.messages >= limit:
            break
        batch = await consumer.receive_many(1000, timeout_millis=200)
        now_ns = time.time_ns()
        if not batch:
            if time.monotonic() - last_message > idle_timeout:
                break
            continue
        last_message = time.monotonic()
        if start is None:
            start = time.monotonic()
        for message in batch:
            view = message.payload_view()
            if len(view) >= 8:
                latencies.append((now_ns - _STAMP.unpack_from(view)[0]) / 1e6)
            result.payload_bytes += len(view)
            consumer.acknowledge(message)
        result.messages += len(batch)
        meter.tick(len(batch))
    result.seconds = (time.monotonic() - start) if start else 0.0
    await consumer.close()
    return result


async def end_to_end(client: Client, topic: str, **options: Any) -> list[Result]:
    """Produce and consume the same messages at once; latency is send to receive."""
    ready = asyncio.Event()
    target = {"messages": options.get("messages", 0)}
    consume_task = asyncio.ensure_future(consume(client, topic, progress=options.get("progress", False),
                                                 ready=ready, earliest=True, target=target))
    await ready.wait()
    produced = await produce(client, topic, **options)
    target["messages"] = produced.messages
    consumed = await consume_task
    consumed.role = "e2e"
    return [produced, consumed]
