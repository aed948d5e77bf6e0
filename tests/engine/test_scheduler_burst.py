"""Burst coalescing: while requests stream in, the worker waits for the burst to land instead of
decoding a batch that is small next to the queue; it never waits without a reason."""

from __future__ import annotations

import threading
import time

from slime.engine import scheduler
from slime.engine.request import Req
from slime.engine.sampling import SamplingParams
from slime.engine.scheduler import BURST_GAP_S, BURST_MAX_WAIT_S, Scheduler


def reqs(n: int) -> list[Req]:
    return [Req(input_ids=[1, 2, 3], params=SamplingParams(max_new_tokens=4)) for _ in range(n)]


def test_waits_until_the_burst_has_landed(monkeypatch):
    # A loaded machine may stall this test between the first submit and the wait for longer than the
    # burst gap (2 ms): the burst is then over as far as the scheduler can tell. So the gap is 50 ms
    # here (the stream is still 100x faster than it), and up to 5 tries; each one that waits must
    # end as designed.
    monkeypatch.setattr(scheduler, "BURST_GAP_S", 0.05)
    for _ in range(5):
        sch = Scheduler(runner=None, max_running_requests=256)
        sch.submit(reqs(3))  # a burst has begun: 3 waiting, 1 running

        def stream(sch=sch):
            for _ in range(40):  # one request every 0.5 ms: faster than the burst gap
                time.sleep(0.0005)
                sch.submit(reqs(1))

        t = threading.Thread(target=stream)
        t0 = time.perf_counter()
        t.start()
        waited = sch._settle_burst(alive=1)
        with sch._cv:  # what the wait saw when it ended
            elapsed = time.perf_counter() - t0
            quiet = time.perf_counter() - sch._last_submit
            arrived = len(sch._waiting)
        t.join()
        if waited:
            break
    assert waited
    # It ends only on a quiet gap (or the cap): on a quiet machine that is after the stream; a busy
    # one may stall the stream for a gap, and then the wait may end mid-stream, as designed.
    assert arrived == 43 or quiet >= scheduler.BURST_GAP_S or elapsed >= BURST_MAX_WAIT_S, (arrived, quiet, elapsed)


def test_no_wait_without_a_burst():
    sch = Scheduler(runner=None, max_running_requests=256)
    sch.submit(reqs(2))
    time.sleep(3 * BURST_GAP_S)  # the last arrival is old: no burst in progress
    # False: the wait loop's body never ran (no timing here: a busy machine makes any bound flaky)
    assert sch._settle_burst(alive=1) is False
    sch.submit(reqs(1))  # a fresh arrival, but the running batch is not small next to the queue
    assert sch._settle_burst(alive=8) is False
    sch.submit(reqs(300))  # the batch would be full with what waits: take it now
    assert sch._settle_burst(alive=1) is False


def test_an_interrupt_ends_the_wait():
    sch = Scheduler(runner=None, max_running_requests=256)

    def stream():
        for _ in range(400):
            time.sleep(0.0005)
            sch.submit(reqs(1))

    sch.submit(reqs(5))
    t = threading.Thread(target=stream)
    t.start()
    threading.Timer(0.02, sch.pause, args=("retract",)).start()  # a pause interrupts the worker
    t0 = time.perf_counter()
    sch._settle_burst(alive=1)
    assert time.perf_counter() - t0 < 0.15
    t.join()
