"""Timers on time: asyncio's own epoll loop waits whole milliseconds, rounded up, so a timer
due in 0.2 ms (a batch's publish delay) runs up to 1 ms late whenever the loop woke for I/O
meanwhile. `new_event_loop()` is a loop whose own timers are on time (the loop thread of
`pulsarwire.sync` runs one); on any other loop, `ThreadTimers` fires a callback at its time from
a thread of its own, which wakes the loop as input arriving on a socket would."""
from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import os
import select as _select
import signal as _signal
import selectors
import sys
import threading
import time
import types
from typing import Any, Callable

if hasattr(selectors, "EpollSelector"):
    class _SubMillisecondSelector(selectors.EpollSelector):
        """epoll waits whole milliseconds, rounded up: a timer due in 0.2 ms (a batch's publish
        delay, say) fired up to 1 ms late whenever the loop woke for I/O meanwhile, which made a
        1 ms batching delay 1.6 ms at its median. The whole milliseconds are waited in epoll, and
        what is left under one in select() on the epoll descriptor (microseconds; it is readable
        as soon as anything registered is), then epoll is read without waiting. A sleeping thread
        wakes some 50 us after its time (timer slack, the scheduler; more on a VM), so the wait
        ends EARLY before the timer and the rest is spent polling epoll: a 1 ms batch timer fired
        at 1.045 ms at its median, now at its time."""

        STEP = 0.0002  # without select(): the longest that I/O waits while a timer is that close
        EARLY = 0.00006  # polled rather than slept: the wake-up latency, at most this long per timer

        # `Borrowing`, when a LoopThread runs this loop: held by the loop's thread except while it
        # waits here, so that another thread may run the loop's work meanwhile (see LoopThread.borrow)
        borrowing: "Borrowing | None" = None

        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            borrowing = self.borrowing
            if borrowing is None:
                return self._wait(timeout)
            borrowing.lock.release()
            try:
                return self._wait(timeout)
            finally:
                borrowing.loop_waits = True  # a borrower gives way: the loop's thread has work
                borrowing.take_back()
                borrowing.loop_waits = False

        def _wait(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is None or timeout <= 0:
                return super().select(timeout)
            wait = timeout - self.EARLY
            if wait >= 0.001:
                return super().select(math.floor(wait * 1e3) * 1e-3)  # the loop asks again for the rest
            deadline = time.monotonic() + timeout
            if wait > 0:
                epoll_fd = self.fileno()
                if epoll_fd < 1024:  # select() takes descriptors under FD_SETSIZE only
                    _select.select([epoll_fd], [], [], wait)
                else:
                    ready = super().select(0)
                    if ready:
                        return ready
                    time.sleep(min(wait, self.STEP))
            while True:
                ready = super().select(0)
                if ready or time.monotonic() >= deadline:
                    return ready

    def borrowable(loop: asyncio.AbstractEventLoop) -> "Borrowing | None":
        """Make `loop` (one of new_event_loop()'s, not yet running) one that other threads may
        borrow while its thread waits for I/O; None for any other loop."""
        selector = getattr(loop, "_selector", None)
        if not isinstance(selector, _SubMillisecondSelector):
            return None
        selector.borrowing = Borrowing()
        return selector.borrowing

    def new_event_loop() -> asyncio.AbstractEventLoop:
        """An event loop whose timers fire within about 0.2 ms of their time (not up to 1 ms late)."""
        return asyncio.SelectorEventLoop(_SubMillisecondSelector())

    def has_precise_timers(loop: asyncio.AbstractEventLoop) -> bool:
        """Whether `loop` is one of new_event_loop()'s."""
        return isinstance(getattr(loop, "_selector", None), _SubMillisecondSelector)
else:  # pragma: no cover - not Linux
    new_event_loop = asyncio.new_event_loop

    def borrowable(loop: asyncio.AbstractEventLoop) -> "Borrowing | None":
        return None

    def has_precise_timers(loop: asyncio.AbstractEventLoop) -> bool:
        return False



def wake_reader(waiting: Any) -> None:
    """From any thread but its own, wake a caller that reads a loop's socket itself while it waits
    on `waiting` (`LoopThread.read_while_waiting` sets its `wake_fd` and `wake_thread`): its
    eventfd is written. Nothing while no caller reads."""
    wake = waiting.wake_fd
    if wake >= 0 and threading.get_ident() != waiting.wake_thread:
        try:
            os.eventfd_write(wake, 1)
        except OSError:  # closed meanwhile (the client shut down): nobody waits on it
            pass


class Borrowing:
    """The lock that a borrowable loop's thread holds except while it waits for I/O. Whoever
    holds it may do what the loop's thread would (call the loop's callbacks' code, write to its
    transports), without waiting on anything; LoopThread.give_back wakes the loop's thread for
    what the holder scheduled on it."""

    __slots__ = ("lock", "loop_waits", "holder")

    # A borrow never waits on anything, so it lasts microseconds. When the loop's thread has
    # waited this long for the lock, it looks at the borrower: one no longer running a
    # `section` (a KeyboardInterrupt came between its borrow and its give-back) is lost, and the
    # loop's thread takes the lock back rather than wait forever; one still in its section (a
    # stopped process, say) is waited for.
    GIVE_BACK_WITHIN = 2.0
    sections: set[types.CodeType] = set()  # the code of functions that hold a borrow until they return

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()  # the loop's: until its thread first waits for I/O
        self.loop_waits = False  # the loop's thread waits for the lock: borrowers give way
        self.holder = 0  # the thread ident of the last borrower

    def take_back(self) -> None:
        """On the loop's thread, its wait over: hold the lock again, once the borrower (if any)
        gives it back, or at once if that borrower was lost."""
        while not self.lock.acquire(timeout=self.GIVE_BACK_WITHIN):
            frame = sys._current_frames().get(self.holder)
            while frame is not None and frame.f_code not in self.sections:
                frame = frame.f_back
            if frame is None:
                return  # lost: still locked, the loop's thread holds it as its own from here on


try:  # signal's C module: getsignal() and signal() in tenths of a microsecond (signal's wrappers: 1-2 us)
    import _signal as _signals
except ImportError:  # pragma: no cover - every CPython has it
    import signal as _signals
_CATCHABLE = tuple(sorted(int(signum) for signum in _signal.valid_signals()
                          if signum not in (_signal.SIGKILL, _signal.SIGSTOP)))
_MAIN_THREAD = threading.main_thread().ident
# The signals with a Python-level handler, looked for among all of them at most this often (some
# 2 us a look; a handler set meanwhile is held from the next look on); between looks, those found.
HANDLERS_LOOKED_FOR_EVERY = 0.1
_handled: tuple[int, ...] = ()
_handled_seen_at = -math.inf

# what hold_signals() swapped: (signal, its handler) pairs, the signals that came meanwhile, the stand-in
HeldSignals = tuple[list[tuple[int, Callable]], list[int], Callable]


def hold_signals() -> HeldSignals | None:
    """On the main thread, where Python runs signal handlers (Ctrl-C's KeyboardInterrupt), hold
    every Python-level handler back until `release_signals`: for a section that runs the event
    loop's work in a caller's thread (a connection's input dispatched, a frame written), which an
    exception raised in its middle would leave half done (a delivered message dropped, a socket
    nobody reads). The section never waits, so a signal is held microseconds. None elsewhere,
    and where no Python handler is set."""
    if threading.get_ident() != _MAIN_THREAD:
        return None
    global _handled, _handled_seen_at
    now = time.monotonic()
    if now - _handled_seen_at >= HANDLERS_LOOKED_FOR_EVERY:
        _handled = tuple(signum for signum, handler in zip(_CATCHABLE, map(_signals.getsignal, _CATCHABLE))
                         if callable(handler))
        _handled_seen_at = now
    held: HeldSignals | None = None
    for signum in _handled:
        handler = _signals.getsignal(signum)
        if callable(handler):
            if held is None:
                came: list[int] = []
                held = ([], came, lambda signum, frame: came.append(signum))
            try:
                _signals.signal(signum, held[2])
            except ValueError:  # not the main interpreter: its handlers are not ours to move
                break
            held[0].append((signum, handler))
    return held


def release_signals(held: HeldSignals | None) -> None:
    """Put back what hold_signals() held, then run the handler of each signal that came meanwhile
    (a KeyboardInterrupt is raised here, the section done)."""
    if held is None:
        return
    swapped, came, _ = held
    for signum, handler in swapped:
        _signals.signal(signum, handler)
    handlers = dict(swapped)
    for signum in came:
        handlers[signum](signum, None)


def less_timer_slack() -> None:
    """Linux lets a sleeping thread wake up to 50 us late (its timer slack) to save wake-ups; the
    loop thread's sub-millisecond waits are what a batching delay is made of, so it asks for 1 us."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in ns
    except (OSError, AttributeError):  # no libc prctl: the default slack stays
        pass




class ThreadTimer:
    """A callback due on a loop at a time, fired by ThreadTimers; cancel() on the loop's thread."""

    __slots__ = ("loop", "callback", "cancelled", "due", "timers", "kind")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None], due: float,
                 timers: "ThreadTimers", kind: object) -> None:
        self.loop = loop
        self.callback = callback
        self.cancelled = False
        self.due = due  # time.monotonic() time
        self.timers = timers
        self.kind = kind  # what its lead is learnt for (ThreadTimers.kind_of)

    def cancel(self) -> None:
        self.cancelled = True

    def _run(self) -> None:  # on the loop's thread
        if not self.cancelled:
            self.cancelled = True
            self.timers.ran(self.kind, time.monotonic() - self.due)
            self.callback()


class ThreadTimers:
    """One thread that sleeps until the earliest timer and then hands its callback to its loop
    (`call_soon_threadsafe`), whatever the loop's own timers do. Cancelled timers are dropped
    without waking their loop.

    Handed over at its time, a callback ran 40-50 us late at the median on this project's VM (the
    thread's wake-up, then the loop's). So the thread hands each timer over a lead ahead of its
    time, learnt from how the timers of its kind (its callback's code: a producer's batch, a
    paced send) ran before it: a callback that ran early takes half its earliness off the lead,
    one that ran late adds a thirty-second of its lateness (each counted up to LEAD_MAX). The lead
    so settles near the shortest hand-overs, not the typical one: few callbacks run early, by a
    few microseconds, none by more than LEAD_MAX; a loop busy with other work makes its timers
    late, and that must not make every timer early. Kinds apart: frequent timers of one kind
    (paced sends at 20 000 a second) ran later than a producer's batch timers and taught a shared
    lead to send batches early."""

    LEAD_MAX = 0.0002  # seconds
    LEAD_GAIN_LATE = 1 / 32
    LEAD_GAIN_EARLY = 1 / 2

    def __init__(self) -> None:
        self._due: list[tuple[float, int, ThreadTimer]] = []  # a heap, by hand-over time (monotonic)
        self._order = itertools.count()
        self._changed = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        # how far ahead of its time a timer of each kind is handed over (seconds)
        self.leads: dict[object, float] = {}

    @staticmethod
    def kind_of(callback: Callable[[], None]) -> object:
        """A callback's kind: the code it runs (a bound method's or a partial's function's), so
        that the kinds are as few as the program's functions."""
        function = getattr(callback, "__func__", None) or getattr(callback, "func", None) or callback
        return getattr(function, "__code__", None)

    def ran(self, kind: object, late: float) -> None:
        """On a loop's thread: a timer of `kind` ran its callback `late` seconds after its time
        (negative: early). One float written at a time: loops on several threads may race, harmlessly."""
        late = min(self.LEAD_MAX, max(-self.LEAD_MAX, late))  # a busy loop's delay is not the hand-over's
        gain = self.LEAD_GAIN_LATE if late > 0 else self.LEAD_GAIN_EARLY
        self.leads[kind] = min(self.LEAD_MAX, max(0.0, self.leads.get(kind, 0.0) + late * gain))

    def call_at(self, loop: asyncio.AbstractEventLoop, when: float, callback: Callable[[], None]) -> ThreadTimer:
        """`callback` on `loop` at `when`, in the loop's clock (loop.time())."""
        due = monotonic_at(loop, when)
        kind = self.kind_of(callback)
        timer = ThreadTimer(loop, callback, due, self, kind)
        hand_over_at = due - self.leads.get(kind, 0.0)
        with self._changed:
            heapq.heappush(self._due, (hand_over_at, next(self._order), timer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="pulsarwire-timers", daemon=True)
                self._thread.start()
            elif self._due[0][2] is timer:
                self._changed.notify()  # the earliest now: the thread sleeps until it instead
        return timer

    def _serve(self) -> None:
        less_timer_slack()
        due = self._due
        with self._changed:
            while True:
                if due and due[0][2].cancelled:
                    # all the cancelled ones at once (a producer's batches mostly fill before their
                    # delay): the thread then sleeps until a live one rather than wake for each
                    due[:] = [item for item in due if not item[2].cancelled]
                    heapq.heapify(due)
                if not due:
                    self._changed.wait()
                    continue
                wait = due[0][0] - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                timer = heapq.heappop(due)[2]
                try:
                    timer.loop.call_soon_threadsafe(timer._run)
                except RuntimeError:  # its loop is closed: nothing to run it on
                    pass


_thread_timers = ThreadTimers()


def monotonic_at(loop: asyncio.AbstractEventLoop, when: float) -> float:
    """`when`, a time of `loop`'s clock, as time.monotonic() time. asyncio's loops keep
    time.monotonic() itself, and then `when` is returned as is: converting through two clock
    readings made a timer early by whatever passed between them (39 us once, on a busy machine)."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return when
    return time.monotonic() + (when - loop.time())


def loop_time_at(loop: asyncio.AbstractEventLoop, monotonic: float) -> float:
    """A time.monotonic() time as a time of `loop`'s clock (the inverse of monotonic_at)."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return monotonic
    return loop.time() + (monotonic - time.monotonic())


# Up to this far ahead, a timer of a loop with millisecond timers goes to the thread: one up to
# 1 ms late is 20 % late or more. Further ahead the loop's own timer is late by less, and costs
# no thread wake-up (which took 5 % of a producer's throughput when batches filled before a
# 10 ms delay).
THREAD_TIMERS_WITHIN = 0.005


def call_at(loop: asyncio.AbstractEventLoop, when: float,
            callback: Callable[[], None]) -> asyncio.TimerHandle | ThreadTimer:
    """`callback` on `loop` at `when` (loop.time()), on time: the loop's own timer where its
    timers are (new_event_loop()'s) or where it is THREAD_TIMERS_WITHIN away or more, else the
    shared ThreadTimers'."""
    if has_precise_timers(loop) or when - loop.time() >= THREAD_TIMERS_WITHIN:
        return loop.call_at(when, callback)
    return _thread_timers.call_at(loop, when, callback)
