"""A reply wait that leaves the CPU to the worker (issue #7, P2).

vLLM's ``MessageQueue.acquire_read`` polls its shared-memory ring with ``sched_yield()``
in a tight loop (``SpinTimer``): the process waiting for a reply keeps one core busy.
With speculators' generator the driver waits like that for every forward step of its
worker; on a CPU platform the worker's model runs on those same cores, so on a 2-core
machine the driver's spinning took most of a core from the forward (cProfile: 2.0 s of a
2.5 s ``generate`` in ``sched_yield``).  :class:`YieldingTimer` keeps the first polls of a
wait as cheap yields (a fast reply is not delayed) and then sleeps, doubling from 50 us
to 1 ms: a reply is noticed at most ~1 ms late, and the wait costs almost no CPU.
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
