"""Driver-side patch of vLLM's wait for worker replies (any speculators generator on a CPU
platform): opt-in polling that yields the CPU to the model's threads (performance goal P2 in
benchmarks/RESULTS.md).

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

import logging
import os
import time
from types import ModuleType
from typing import Any

from ...core import bindings, switches
from ...core.proof import Claim, Proof
from ...core.registry import Changes, NotNeeded, Patch, TargetChanged, register
from .. import _guards as guard
from ._generator_target import GENERATOR

log = logging.getLogger("spec_compat")


#: opt-in switch of patch driver-wait-yields-cpu: "spin" (default) or "sleep"


@register
class DriverWaitYieldsCpu(Patch):
    """vLLM ``distributed/device_communicators/shm_broadcast.py`` ``MessageQueue.acquire_read`` busy-waits
    (``sched_yield``) while speculators' driver waits for each worker step (P2).  On a CPU platform with
    other work on the machine the spinning driver takes CPU from the model's threads (Llama, a matrix
    cell beside it: 9508 tok/s spinning, 18745 sleeping, 1.97x); on an idle machine the spin is faster
    (sleeping: 0.94, 0.84 of it; benchmarks/results/capture_overhead_llama_{loaded,idle,idle2}.json).
    Opt-in: ``SPEC_COMPAT_DRIVER_WAIT=sleep`` makes the driver's reply queues poll, then sleep."""

    id = "driver-wait-yields-cpu"
    reads = (switches.DRIVER_WAIT_VAR,)
    proof = Proof("optimization", "tests/engine/test_handoff_engine.py::test_driver_reply_queues_do_not_spin", benchmark="benchmarks/results/capture_overhead_llama_loaded.json", claims=(
        Claim("sleeping / spinning driver, extraction tok/s (median), a matrix cell running beside it",
              "summary.capture.median", "summary.capture-spin.median", value="1.97"),
        Claim("sleeping / spinning driver, extraction tok/s (median), idle machine (run B)",
              "summary.capture.median", "summary.capture-spin.median", value="0.94",
              benchmark="benchmarks/results/capture_overhead_llama_idle.json"),
        Claim("sleeping / spinning driver, extraction tok/s (median), idle machine (run C)",
              "summary.capture.median", "summary.capture-spin.median", value="0.84",
              benchmark="benchmarks/results/capture_overhead_llama_idle2.json")))
    summary = ("opt-in (SPEC_COMPAT_DRIVER_WAIT=sleep), CPU platform: the driver's reply queues sleep "
               "(<= 1 ms) instead of spinning while the worker computes")
    upstream = "vLLM shm_broadcast.py SpinTimer: sched_yield busy-wait in acquire_read (driver of speculators' generator)"
    target = f"{GENERATOR}:MultiprocExecutor"
    # cells that proved it; newer vLLM: re-check the wait loop.  speculators < 0.5: the generator
    # (its target) is gone from 0.5 on
    requires = {"vllm": ">=0.11,<0.17", "speculators": "<0.5"}

    def check(self, module: ModuleType) -> None:
        import torch

        if torch.cuda.is_available():
            raise NotNeeded("CUDA platform: the driver's polling does not take the model's cores")
        guard.has_attrs(guard.attr(module, "MultiprocExecutor"), "MultiprocExecutor", "collective_rpc")
        from vllm.distributed.device_communicators import shm_broadcast

        timer = guard.attr(shm_broadcast, "SpinTimer")
        guard.has_attrs(timer, "SpinTimer", "spin", "record_activity")
        if "_read_spin_timer" not in guard.source(shm_broadcast.MessageQueue.acquire_read, "MessageQueue.acquire_read"):
            raise TargetChanged("MessageQueue.acquire_read no longer polls through _read_spin_timer")
        mode = switches.value(switches.DRIVER_WAIT_VAR)
        if mode == "spin":
            raise NotNeeded(f"{switches.DRIVER_WAIT_VAR} is not 'sleep': vLLM's spin wait kept (faster on an idle "
                            "machine; set it to 'sleep' when other work shares the CPU)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def init(wrapped: Any, executor: Any, args: tuple, kwargs: dict) -> Any:
            out = wrapped(*args, **kwargs)
            queues = reply_queues(executor)
            for mq in queues:
                mq._read_spin_timer = YieldingTimer()
            if not queues:
                log.warning("spec_compat[%s]: the executor has no reply queue with _read_spin_timer; "
                            "the driver keeps spinning", self.id)
            return out

        bindings.wrap_method(changes, module, "MultiprocExecutor", "__init__", init)


def reply_queues(executor: Any) -> list[Any]:
    """The driver's reply queues of a MultiprocExecutor: ``response_mqs`` (vLLM >= 0.12)
    or each worker handle's ``worker_response_mq`` (0.11)."""
    found: dict[int, Any] = {}
    candidates = list(getattr(executor, "response_mqs", None) or ())
    candidates += [getattr(w, "worker_response_mq", None) for w in getattr(executor, "workers", None) or ()]
    for mq in candidates:
        if mq is not None and hasattr(mq, "_read_spin_timer"):
            found[id(mq)] = mq
    return list(found.values())


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
