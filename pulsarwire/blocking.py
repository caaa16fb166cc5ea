"""Blocking facade over the asyncio client with pulsarwire's own names and types
(`pulsarwire.MessageId`, `callback(error, message_id)`), for code that is not async;
the spark source uses it. `pulsarwire.sync` is the official client's surface instead.

A private event loop runs in a daemon thread (`LoopThread`); every call hands a
coroutine to it and waits. Callbacks (`send_async`) run on that loop's thread.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import select
import selectors
import sys
import threading
import time
from typing import Any, Callable, Coroutine, Iterable, Iterator, TypeVar

from . import client as aio
from . import timers
from .timers import has_precise_timers, less_timer_slack, new_event_loop  # noqa: F401 - also offered here
from .errors import AlreadyClosedError, ConnectionClosedError, TopicTerminatedError
from .messages import Message, MessageId, MessageIds


T = TypeVar("T")

# how often a caller blocked on the main thread wakes to let Python run signal handlers
SIGNAL_CHECK_INTERVAL = 0.1


def _wait(future: concurrent.futures.Future[T], timeout: float | None) -> T:
    """`future.result(timeout)`; on the main thread in slices, so that Ctrl-C interrupts the wait
    even when the signal reached another thread (as the official client checks every 100 ms)."""
    if threading.current_thread() is not threading.main_thread():
        return future.result(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = SIGNAL_CHECK_INTERVAL if deadline is None else \
            max(0.0, min(SIGNAL_CHECK_INTERVAL, deadline - time.monotonic()))
        try:
            return future.result(step)
        except concurrent.futures.TimeoutError:
            if future.done():  # done meanwhile, or its own TimeoutError: what it holds is the answer
                return future.result()
            if deadline is not None and time.monotonic() >= deadline:
                raise


def _nothing() -> None:  # a callback that only wakes the loop's thread
    pass


class LoopThread:
    """An event loop running in a daemon thread; blocking callers hand it coroutines."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self._borrowing = timers.borrowable(self.loop)
        self._marks: tuple[int, Any] = (0, None)
        # read_while_waiting: the sockets a caller reads itself (their descriptor -> that thread's
        # ident; changed while the loop is borrowed or on its thread), and eventfds to wake them
        self._read_owners: dict[int, int] = {}
        self._wake_fds: list[int] = []
        self._owners_checked = False  # _check_read_owners is scheduled
        self.reading_borrowed = False  # a caller runs the loop's reading: no user callback may run in it
        self.answers_deferred = 0  # answers sent from such a caller to the loop's thread, not yet given there
        self._serving = True  # until _serve ends
        self.thread = threading.Thread(target=self._serve, name="pulsarwire-loop", daemon=True)
        self.thread.start()

    def borrow(self) -> bool:
        """Take the loop, from another thread, while its own thread waits for I/O: True when taken.
        The caller may then run what the loop's thread would (code that never waits), in place of
        a wake-up and a hand-over, and must `give_back()`. Never waits: False when the loop's
        thread is busy or wants the loop back."""
        borrowing = self._borrowing
        # (asyncio's debug mode refuses call_soon() from any thread but the loop's)
        if borrowing is None or borrowing.loop_waits or self.loop.get_debug() or not borrowing.lock.acquire(False):
            return False
        borrowing.holder = threading.get_ident()
        loop: Any = self.loop
        self._marks = (len(loop._ready), loop._scheduled[0] if loop._scheduled else None)
        return True

    def give_back(self) -> None:
        """Give the borrowed loop back, waking its thread when the borrower scheduled work for it
        (a callback, or a timer earlier than those its thread waits for)."""
        loop: Any = self.loop
        ready_mark, first_timer = self._marks
        wake = (loop._scheduled[0] if loop._scheduled else None) is not first_timer
        if not wake:
            ready = loop._ready
            for index in range(ready_mark, len(ready)):
                if not getattr(ready[index]._callback, "wakes_nothing", False):
                    wake = True
                    break
        assert self._borrowing is not None
        self._borrowing.lock.release()
        if wake:
            try:
                loop.call_soon_threadsafe(_nothing)
            except RuntimeError:  # closed meanwhile: nothing left to run it
                pass

    def read_while_waiting(self, sock: Any, done: Callable[[], bool], waiting: Any,
                           timeout: float | None = None) -> bool:
        """Wait until `done()` on the caller's thread by reading `sock` itself, as the loop's thread
        would: the kernel wakes the caller when the answer arrives and the caller dispatches it, in
        place of a wake-up of the loop's thread and then one of the caller (two wake-ups, each tens
        of microseconds on a VM, and a hand-over of the GIL). Meanwhile the loop's thread is not
        told about input on `sock` (its epoll interest drops EPOLLIN; other sockets and timers go on
        there). One caller a socket; returns early, leaving the rest to the caller's own wait,
        whenever this cannot go on (the loop busy, the socket owned, paused or gone, 100 ms without
        input). `waiting.wake_fd` is set for the time of the wait: whoever answers it from another
        thread writes that eventfd (`sync._Awaited._report`). On the main thread, signal handlers (Ctrl-C)
        are held back while the loop's work runs here (`timers.hold_signals`): the wait itself
        stays interruptible, never a dispatch or the giving back. A socket whose caller left
        without giving it back anyway (a signal in the instants between) is given back by the
        loop's thread within `OWNERS_CHECKED_EVERY` (`_check_read_owners`). `timeout` (seconds)
        bounds the wait. True when it ended with `done()`, or with no input for 100 ms or the
        timeout: the caller may wait this way again; False when it could not go on (the caller
        waits its own way)."""
        if self._borrowing is None or sock is None or not hasattr(os, "eventfd"):
            return False
        fd = sock.fileno()
        me = threading.get_ident()
        if fd < 0:
            return False
        deadline = None if timeout is None else time.monotonic() + timeout
        try:  # before the socket is taken: nothing may fail between taking it and the finally below
            wake = self._wake_fds.pop() if self._wake_fds else os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.register(wake, select.POLLIN)
        except OSError:  # out of descriptors, say: wait the caller's own way
            return False
        held = timers.hold_signals()
        try:
            owned = False
            if self.borrow():
                try:
                    owned = fd not in self._read_owners and self._take_reads(fd)
                    if owned:
                        self._read_owners[fd] = me
                        if not self._owners_checked:
                            self._owners_checked = True
                            self.loop.call_later(self.OWNERS_CHECKED_EVERY, self._check_read_owners)
                finally:
                    self.give_back()
            if not owned:
                self._wake_fds.append(wake)
                return False
            waiting.wake_thread = me
            waiting.wake_fd = wake
            try:
                timers.release_signals(held)  # a signal held meanwhile is raised here: the finally gives back
                held = None
                while not done():
                    wait_ms = 100  # idle this long: the caller may wait this way again
                    if deadline is not None:
                        # input for other callers (another thread's receipts, say) must not
                        # carry this wait past its timeout: it counted only quiet time before
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return True
                        wait_ms = min(wait_ms, math.ceil(left * 1000))
                    ready = poller.poll(wait_ms)
                    if not ready:
                        return True
                    readable = False
                    for ready_fd, events in ready:
                        if ready_fd == wake:
                            try:
                                os.eventfd_read(wake)
                            except BlockingIOError:
                                pass
                        elif events & select.POLLNVAL:
                            return False  # closed under the wait: the loop's thread has seen to it
                        else:
                            readable = True
                    if readable and not self._read_borrowed(fd):
                        return False
                return True
            finally:
                held = timers.hold_signals()
                waiting.wake_fd = -1
                if self.loop.is_closed():
                    os.close(wake)
                else:
                    self._wake_fds.append(wake)
                self._give_reads_back(fd, me)
        finally:
            timers.release_signals(held)

    # how often the loop's thread looks for a socket whose caller left read_while_waiting without
    # giving it back, while callers take sockets
    OWNERS_CHECKED_EVERY = 0.1

    def _check_read_owners(self) -> None:
        """On the loop's thread: give back every socket whose owner is no longer in
        read_while_waiting; again later while sockets are owned."""
        if self._read_owners:
            frames = sys._current_frames()
            for fd, owner in list(self._read_owners.items()):
                frame = frames.get(owner)
                while frame is not None and frame.f_code is not _READ_WHILE_WAITING:
                    frame = frame.f_back
                if frame is None:
                    self._restore_reads(fd, owner)
        self._owners_checked = bool(self._read_owners)  # else the next caller to take a socket schedules it
        if self._owners_checked:
            self.loop.call_later(self.OWNERS_CHECKED_EVERY, self._check_read_owners)

    def _take_reads(self, fd: int) -> bool:
        """Borrowed: stop the loop's epoll reporting input on `fd`; False when the loop does not
        read it now (not registered, reading paused)."""
        selector: Any = self.loop._selector  # type: ignore[attr-defined]
        try:
            key = selector.get_key(fd)
        except (KeyError, ValueError):
            return False
        if not key.events & selectors.EVENT_READ:
            return False
        selector._selector.modify(fd, select.EPOLLOUT if key.events & selectors.EVENT_WRITE else 0)
        return True

    def _read_borrowed(self, fd: int) -> bool:
        """Run the loop's reader of `fd` on this thread, the loop borrowed; False when it could not."""
        held = timers.hold_signals()
        try:
            if not self.borrow():
                return False
            previous: asyncio.AbstractEventLoop | None = None
            running = False
            try:
                selector: Any = self.loop._selector  # type: ignore[attr-defined]
                try:
                    reader = selector.get_key(fd).data[0]
                except (KeyError, ValueError):
                    return False
                if reader is None or reader._cancelled:
                    return False
                previous = asyncio.events._get_running_loop()
                running = True
                asyncio.events._set_running_loop(self.loop)  # code run here may look for its loop
                self.reading_borrowed = True
                reader._run()
                return True
            finally:
                self.reading_borrowed = False
                if running:
                    asyncio.events._set_running_loop(previous)
                self.give_back()
        finally:
            timers.release_signals(held)

    def _restore_reads(self, fd: int, owner: int) -> None:
        """Borrowed or on the loop's thread: `fd`, owned by `owner`, is the loop's to read again,
        with the epoll interest asyncio's registration says."""
        if self._read_owners.get(fd) != owner:
            return
        del self._read_owners[fd]
        selector: Any = self.loop._selector  # type: ignore[attr-defined]
        try:
            key = selector.get_key(fd)
        except (KeyError, ValueError):
            return  # unregistered meanwhile: nothing to give back
        mask = (select.EPOLLIN if key.events & selectors.EVENT_READ else 0) | \
            (select.EPOLLOUT if key.events & selectors.EVENT_WRITE else 0)
        try:
            selector._selector.modify(fd, mask)
        except OSError:  # closed meanwhile
            pass

    def _give_reads_back(self, fd: int, me: int) -> None:
        """The loop's epoll reports input on `fd` again (once it is borrowed, or on its thread)."""
        if self.borrow():
            try:
                self._restore_reads(fd, me)
            finally:
                self.give_back()
            return
        try:
            self.loop.call_soon_threadsafe(self._restore_reads, fd, me)
        except RuntimeError:  # the loop is closed: nothing reads any more
            pass

    def _serve(self) -> None:
        less_timer_slack()
        try:
            self.loop.run_forever()
        finally:
            self._serving = False
            self.loop.close()  # here, so that a loop stopped from its own thread is closed too
            while self._wake_fds:
                os.close(self._wake_fds.pop())

    @property
    def stopped(self) -> bool:
        # not thread.is_alive(): in CPython 3.11 a KeyboardInterrupt inside it can mark a running
        # thread as stopped for good (and every later call would answer AlreadyClosed)
        return self.loop.is_closed() or not self._serving

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self.stopped:  # the client was closed: a typed error, not "Event loop is closed"
            coro.close()
            raise AlreadyClosedError("client is closed")
        if threading.current_thread() is self.thread:
            coro.close()
        self.refuse_own_thread()
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return _wait(future, timeout)
        except BaseException:
            # an interrupted caller (Ctrl-C, a timeout) must not leave the operation running on
            # the loop: an orphaned receive would take a message that nobody gets
            future.cancel()
            raise

    def refuse_own_thread(self) -> None:
        """Raise when called on the loop's thread: waiting there would wait for this very thread."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("a blocking pulsarwire call was made from a callback on its own event-loop "
                               "thread; use the asyncio API or hand the work to another thread")

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain function on the loop's thread (at once when already on it) and return its result."""
        if self.stopped:
            raise AlreadyClosedError("client is closed")
        if threading.current_thread() is self.thread:
            return fn(*args)

        async def invoke() -> T:
            return fn(*args)
        return self.run(invoke())

    def stop(self) -> None:
        """Cancel what still runs on the loop (so that callers blocked on it get an answer), then stop it."""
        if self.loop.is_closed():
            return

        async def cancel_the_rest() -> None:
            for _ in range(10):  # a cancelled task's cleanup may start another: a few rounds
                await asyncio.sleep(0)  # callbacks already scheduled run first (they may start tasks)
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                if not tasks:
                    return
                for task in tasks:
                    task.cancel()
                await asyncio.wait(tasks, timeout=1)

        if threading.current_thread() is self.thread:  # cannot wait for itself: stop once the rest is done
            async def cancel_then_stop() -> None:
                await cancel_the_rest()
                self.loop.stop()
            self.loop.create_task(cancel_then_stop())
            return
        try:
            asyncio.run_coroutine_threadsafe(cancel_the_rest(), self.loop).result(5)
        except Exception:  # noqa: BLE001 - stopping goes on regardless
            pass
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # closed meanwhile: stopped already
            return
        self.thread.join(timeout=5)


class Client:
    """Blocking client: `Client("pulsar://127.0.0.1:6650")`; same options as the asyncio one."""

    def __init__(self, service_url: str, **options: Any) -> None:
        self._loop = LoopThread()

        async def make() -> aio.Client:
            return aio.Client(service_url, **options)
        try:
            self._client = self._loop.run(make())
        except BaseException:
            self._loop.stop()
            raise

    def create_producer(self, topic: str, **options: Any) -> "Producer":
        return Producer(self._loop, self._loop.run(self._client.create_producer(topic, **options)))

    def subscribe(self, topic: str | list[str], subscription_name: str, **options: Any) -> "Consumer":
        return Consumer(self._loop, self._loop.run(self._client.subscribe(topic, subscription_name, **options)))

    def create_reader(self, topic: str, start_message_id: MessageId, **options: Any) -> "Reader":
        return Reader(self._loop, self._loop.run(self._client.create_reader(topic, start_message_id, **options)))

    def get_topic_partitions(self, topic: str) -> list[str]:
        return self._loop.run(self._client.get_topic_partitions(topic))

    def close(self) -> None:
        if self._loop.stopped:
            return
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Producer:
    def __init__(self, loop: LoopThread, producer: aio.Producer) -> None:
        self._loop = loop
        self._producer = producer

    def send(self, content: bytes, **options: Any) -> MessageId:
        return self._loop.run(self._producer.send(content, **options))

    def send_async(self, content: bytes,
                   callback: Callable[[BaseException | None, MessageId | None], None] | None,
                   **options: Any) -> None:
        """Queue a message; callback(error, message_id) runs when the broker answers."""
        async def queue() -> None:
            future = await self._producer.send_async(content, **options)
            if callback is not None:
                def done(f: asyncio.Future[MessageId]) -> None:
                    error = f.exception()
                    callback(error, None if error else f.result())
                future.add_done_callback(done)
        self._loop.run(queue())

    def send_many(self, messages: Iterable[Any]) -> MessageIds:
        """Send messages (payloads, or (payload, partition_key, properties) tuples) and wait for
        every receipt; their MessageIds in order."""
        async def send() -> MessageIds:
            receipts = await self._producer.send_many(messages)
            self._producer.flush_batches()
            return await receipts
        return self._loop.run(send())

    def send_many_async(self, messages: Iterable[Any],
                        callback: Callable[[BaseException | None, MessageIds | None], None] | None) -> None:
        """Queue messages; callback(error, message_ids) runs once, when all are acknowledged or one fails."""
        async def queue() -> None:
            receipts = await self._producer.send_many(messages)
            if callback is not None:
                def done(f: asyncio.Future[MessageIds]) -> None:
                    error = f.exception()
                    callback(error, None if error else f.result())
                receipts.add_done_callback(done)
        self._loop.run(queue())

    def flush(self) -> None:
        self._loop.run(self._producer.flush())

    def topic(self) -> str:
        return self._producer.topic()

    def producer_name(self) -> str:
        return self._loop.call(self._producer.producer_name)

    def last_sequence_id(self) -> int:
        return self._loop.call(self._producer.last_sequence_id)

    def close(self) -> None:
        self._loop.run(self._producer.close())


class Consumer:
    def __init__(self, loop: LoopThread, consumer: aio.Consumer) -> None:
        self._loop = loop
        self._consumer = consumer

    def receive(self, timeout_millis: int | None = None) -> Message:
        return self._loop.run(self._consumer.receive(timeout_millis))

    def receive_many(self, max_messages: int = 1000, timeout_millis: int | None = None) -> list[Message]:
        """Up to `max_messages` already queued messages, waiting for the first; [] on timeout."""
        return self._loop.run(self._consumer.receive_many(max_messages, timeout_millis))

    def acknowledge(self, message: Message | MessageId) -> None:
        self._loop.call(self._consumer.acknowledge, message)

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        self._loop.call(self._consumer.acknowledge_cumulative, message)

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        self._loop.call(self._consumer.negative_acknowledge, message)

    def redeliver_unacknowledged_messages(self) -> None:
        self._loop.call(self._consumer.redeliver_unacknowledged_messages)

    def seek(self, target: MessageId | int) -> None:
        self._loop.run(self._consumer.seek(target))

    def get_last_message_id(self) -> MessageId:
        return self._loop.run(self._consumer.get_last_message_id())

    def unsubscribe(self) -> None:
        self._loop.run(self._consumer.unsubscribe())

    def topic(self) -> str:
        return self._consumer.topic()

    def subscription_name(self) -> str:
        return self._consumer.subscription_name()

    def close(self) -> None:
        self._loop.run(self._consumer.close())

    def __iter__(self) -> Iterator[Message]:
        while True:
            try:
                yield self.receive()
            except (TopicTerminatedError, ConnectionClosedError):
                return


class Reader:
    def __init__(self, loop: LoopThread, reader: aio.Reader) -> None:
        self._loop = loop
        self._reader = reader

    def read_next(self, timeout_millis: int | None = None) -> Message:
        return self._loop.run(self._reader.read_next(timeout_millis))

    def has_message_available(self) -> bool:
        return self._loop.run(self._reader.has_message_available())

    def seek(self, target: MessageId | int) -> None:
        self._loop.run(self._reader.seek(target))

    def get_last_message_id(self) -> MessageId:
        return self._loop.run(self._reader.get_last_message_id())

    def topic(self) -> str:
        return self._reader.topic()

    def close(self) -> None:
        self._loop.run(self._reader.close())


_READ_WHILE_WAITING = LoopThread.read_while_waiting.__code__
timers.Borrowing.sections.update(f.__code__ for f in (LoopThread.read_while_waiting, LoopThread._read_borrowed,
                                                      LoopThread._give_reads_back))
