"""A reply wait that leaves the CPU to the worker (opt-in patch driver-wait-yields-cpu;
performance goal P2 in benchmarks/RESULTS.md).

vLLM's ``MessageQueue.acquire_read`` polls its shared-memory ring with ``sched_yield()``
in a tight loop (``SpinTimer``).  speculators' driver waits like that for every forward
step of its worker.  Alone on a CPU machine the yielding costs little (0.004 CPU s per 1k
tokens measured), but with other work on the machine the driver took 0.052 and slowed the
worker's threads (extraction at about half speed).  :class:`YieldingTimer` keeps the first
polls of a wait as cheap yields (a fast reply is not delayed) and then sleeps, doubling
from 50 us to 1 ms: a reply is noticed at most ~1 ms late.  Its wake-ups cost 6-16 % on an
idle machine, hence opt-in.
"""

from __future__ import annotations

import os
import time

#: yields before the first sleep of a wait
YIELDS = 64
MIN_SLEEP_S = 50e-6
MAX_SLEEP_S = 1e-3
#: a poll more than this after the previous one starts a new wait
NEW_WAIT_GAP_S = 5e-3


class YieldingTimer:
    """Drop-in for vLLM's ``SpinTimer`` (``record_activity()`` / ``spin()``)."""

    def __init__(self) -> None:
        self._polls = 0
        self._last = 0.0

    def record_activity(self) -> None:
        self._polls = 0

    def spin(self) -> None:
        now = time.monotonic()
        if now - self._last > NEW_WAIT_GAP_S:
            self._polls = 0
        self._polls += 1
        if self._polls <= YIELDS:
            os.sched_yield()
        else:
            time.sleep(min(MAX_SLEEP_S, MIN_SLEEP_S * 2 ** min(self._polls - YIELDS - 1, 10)))
        self._last = time.monotonic()
