"""Timers on time on any event loop (pulsarwire.timers): asyncio's own loop waits whole
milliseconds, so a short timer (a 1 ms batching delay) goes to a thread that wakes the loop at its
time; pulsarwire's loop and longer timers keep the loop's own."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pulsarwire import timers


def test_a_short_timer_on_asyncios_loop_fires_on_time_from_the_thread():
    async def lateness(arm):
        loop = asyncio.get_running_loop()
        late = []
        for _ in range(30):
            fired = loop.create_future()
            due = loop.time() + 0.0003
            handle = arm(loop, due, lambda f=fired: f.set_result(loop.time()))
            # the loop wakes for I/O meanwhile, as a client's loop does: its own wait is then rounded up
            loop.call_later(0.0001, lambda: None)
            late.append(await fired - due)
            assert handle is not None
        return sorted(late)[len(late) // 2], min(late)

    async def compare():
        threaded = await lateness(timers.call_at)
        own = await lateness(lambda loop, due, callback: loop.call_at(due, callback))
        return threaded, own

    (threaded_median, threaded_min), (own_median, _) = asyncio.run(compare())
    # handed over ahead by what the hand-over takes (ThreadTimers.leads): never more than LEAD_MAX early
    assert threaded_min >= -timers.ThreadTimers.LEAD_MAX and threaded_median < own_median


def test_thread_timers_learn_how_far_ahead_to_hand_over():
    """Each kind of timer learns its lead from how its callbacks ran: it settles near the shortest
    hand-overs (hand-overs of 60-100 us: a lead near 60 us, a fifth of the callbacks early, by a
    few microseconds), a busy loop's seconds move it by LEAD_MAX / 32 at most, it stays within
    [0, LEAD_MAX], and kinds apart."""
    import random

    learner = timers.ThreadTimers()
    batch = timers.ThreadTimers.kind_of(lambda: None)
    paced = timers.ThreadTimers.kind_of(test_a_short_timer_on_asyncios_loop_fires_on_time_from_the_thread)
    rng = random.Random(7)
    early, earliest = 0, 0.0
    for n in range(2000):
        late = rng.uniform(60e-6, 100e-6) - learner.leads.get(batch, 0.0)
        if n >= 1000:
            early += late < 0
            earliest = min(earliest, late)
        learner.ran(batch, late)
    assert 55e-6 <= learner.leads[batch] <= 75e-6
    assert early < 300 and earliest > -15e-6  # a fifth early, by a few microseconds
    assert paced not in learner.leads
    before = learner.leads[batch]
    learner.ran(batch, 5.0)  # a loop busy for seconds
    assert learner.leads[batch] <= before + timers.ThreadTimers.LEAD_MAX * timers.ThreadTimers.LEAD_GAIN_LATE + 1e-12
    for _ in range(1000):
        learner.ran(paced, 5.0)
    assert learner.leads[paced] == timers.ThreadTimers.LEAD_MAX
    for _ in range(100):
        learner.ran(paced, -5.0)
    assert learner.leads[paced] == 0.0


def test_a_cancelled_thread_timer_never_runs_and_others_keep_their_order():
    async def scenario():
        loop = asyncio.get_running_loop()
        ran = []
        first = timers.call_at(loop, loop.time() + 0.002, lambda: ran.append("first"))
        cancelled = timers.call_at(loop, loop.time() + 0.001, lambda: ran.append("cancelled"))
        timers.call_at(loop, loop.time() + 0.003, lambda: ran.append("last"))
        assert isinstance(cancelled, timers.ThreadTimer)
        cancelled.cancel()
        await asyncio.sleep(0.05)
        first.cancel()  # once run, a cancel does nothing
        return ran
    assert asyncio.run(scenario()) == ["first", "last"]


def test_the_loops_own_timers_serve_where_they_are_on_time_or_far_enough_ahead():
    loop = timers.new_event_loop()
    stock = asyncio.new_event_loop()
    try:
        assert isinstance(timers.call_at(loop, loop.time() + 0.001, lambda: None), asyncio.TimerHandle)
        assert isinstance(timers.call_at(stock, stock.time() + timers.THREAD_TIMERS_WITHIN + 0.01, lambda: None),
                          asyncio.TimerHandle)
        short = timers.call_at(stock, stock.time() + 0.001, lambda: None)
        assert isinstance(short, timers.ThreadTimer)
        short.cancel()
    finally:
        loop.close()
        stock.close()
    time.sleep(0.01)  # a timer of a closed loop is dropped by the thread, nothing raised


def test_a_loop_thread_is_borrowed_only_while_it_waits_for_io_and_woken_for_what_was_left_to_it():
    """LoopThread.borrow(): another thread may run the loop's work while the loop's own thread
    waits for I/O (never while it runs a callback, never from itself, never in asyncio's debug
    mode); give_back() wakes the loop for a callback or an earlier timer scheduled meanwhile."""
    import threading

    from pulsarwire.blocking import LoopThread

    lt = LoopThread()
    try:
        time.sleep(0.05)  # its thread is waiting for I/O by now
        assert lt.borrow()
        assert not lt.borrow()  # one borrower at a time
        ran = threading.Event()
        lt.loop.call_soon(ran.set)  # not thread-safe, but the loop is borrowed
        lt.give_back()
        assert ran.wait(1)  # woken for it: the loop's own wait had no end

        fired = threading.Event()
        time.sleep(0.01)
        assert lt.borrow()
        lt.loop.call_at(lt.loop.time() + 0.005, fired.set)
        lt.give_back()
        assert fired.wait(1)

        busy = threading.Event()
        release = threading.Event()
        lt.loop.call_soon_threadsafe(lambda: (busy.set(), release.wait(2)))
        assert busy.wait(1)
        assert not lt.borrow()  # its thread runs a callback
        release.set()

        on_loop = lt.call(lt.borrow)
        assert on_loop is False  # the loop's own thread holds it

        lt.loop.call_soon_threadsafe(lt.loop.set_debug, True)
        time.sleep(0.02)
        assert not lt.borrow()
    finally:
        lt.stop()
    assert not lt.borrow()  # stopped: nothing to borrow


def test_a_borrower_that_never_gives_the_loop_back_does_not_stop_it_for_good(monkeypatch):
    """A borrower interrupted between taking the loop and giving it back (a KeyboardInterrupt
    there) leaves the lock taken: the loop's thread takes it back after GIVE_BACK_WITHIN rather
    than wait forever."""
    import threading

    from pulsarwire.blocking import LoopThread

    monkeypatch.setattr(timers.Borrowing, "GIVE_BACK_WITHIN", 0.2)
    lt = LoopThread()
    try:
        time.sleep(0.05)
        assert lt.borrow()  # and never given back
        ran = threading.Event()
        lt.loop.call_soon_threadsafe(ran.set)
        assert not ran.wait(0.1)  # the loop's thread waits for the borrower...
        assert ran.wait(2)  # ...and then takes the loop back
        assert lt.call(lambda: 42) == 42
        time.sleep(0.05)
        assert lt.borrow()  # and lends it again
        lt.give_back()

        def slow_borrower(times):  # a borrower still in its section (a stopped process, say) is waited for
            assert lt.borrow()
            try:
                time.sleep(0.5)
            finally:
                times.append(time.monotonic())
                lt.give_back()
        monkeypatch.setattr(timers.Borrowing, "sections", {slow_borrower.__code__})
        given_back = []
        time.sleep(0.05)
        borrower = threading.Thread(target=slow_borrower, args=(given_back,))
        borrower.start()
        time.sleep(0.05)
        ran_at = []
        lt.loop.call_soon_threadsafe(lambda: ran_at.append(time.monotonic()))
        borrower.join(2)
        deadline = time.monotonic() + 2
        while not ran_at and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ran_at and given_back and ran_at[0] >= given_back[0]
    finally:
        lt.stop()


def test_a_time_of_asyncios_own_clock_is_converted_without_reading_the_clock():
    """asyncio's loops keep time.monotonic(): a due time converted through two clock readings
    came out early by what passed between them (a paced send 39 us early on a busy machine)."""
    import asyncio

    from pulsarwire import timers

    loop = asyncio.new_event_loop()
    try:
        assert timers.monotonic_at(loop, 123.456) == 123.456
        assert timers.loop_time_at(loop, 123.456) == 123.456
    finally:
        loop.close()


def test_signal_handlers_are_held_on_the_main_thread_and_run_once_released():
    """hold_signals(): a Python-level handler (one set after the last look among them too, from
    the next look on) does not run while held, and runs at release_signals(), raising there."""
    import os
    import signal
    seen = []

    def handler(signum, frame):
        seen.append(signum)
        raise RuntimeError("from the handler")
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        time.sleep(timers.HANDLERS_LOOKED_FOR_EVERY)  # looked for again at the next hold
        held = timers.hold_signals()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)  # it would have run by now
        assert seen == []
        with pytest.raises(RuntimeError, match="from the handler"):
            timers.release_signals(held)
        assert seen == [signal.SIGUSR1] and signal.getsignal(signal.SIGUSR1) is handler
        off_main = []
        thread = threading.Thread(target=lambda: off_main.append(timers.hold_signals()))
        thread.start()
        thread.join()
        assert off_main == [None]  # Python runs handlers on the main thread alone
    finally:
        signal.signal(signal.SIGUSR1, old)
