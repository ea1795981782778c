"""capture-handoff-shm: captured rows streamed into shared-memory (/dev/shm) segments as they are
computed, the worker's reply a descriptor (P4, P5); wraps the methods capture-per-request installed
(see :mod:`._worker`).  The segments, descriptors and the driver's reading are
:mod:`spec_compat.shims.handoff` (shared with the driver half, ``rows-by-request-id``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...core import switches
from ...core.proof import Claim, Proof
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ..ranges import SPEC_03
from ._worker import CAPTURE_METHODS, CUSTOM_WORKER

log = logging.getLogger("spec_compat")

#: below this much free /dev/shm the worker keeps the pickled reply (a container's 64 MB default)
MIN_FREE_SHM = 1 << 30


@register
class CaptureHandoffShm(Patch):
    """speculators 0.3.0 returns the captured tensors through ``collective_rpc`` (custom_worker:95),
    pickled by vLLM's message queue - several full copies of every captured byte, the extraction
    bottleneck upstream (speculators PR #322).  Rows now go into shared-memory (/dev/shm) segments as
    they are captured; the reply is a descriptor (P2, P4, P5; 2-core CPU, 448 MiB: 3.22x faster, median
    of 5 paired repeats; memory peak 1.130x the captured bytes, upstream's 3.069x;
    benchmarks/results/handoff_cpu.json)."""

    id = "capture-handoff-shm"
    after = ("capture-per-request",)
    reads = (switches.POOL_VAR,)
    proof = Proof("optimization", "tests/engine/test_handoff_engine.py::test_handoff_rows_equal_the_pickled_path", benchmark="benchmarks/results/handoff_cpu.json", claims=(
        Claim("pickled / hand-off seconds per call (P4), median of 5 paired repeats",
              "p4.seconds.pickled.all", "p4.seconds.handoff.all", paired=True, value="3.22"),
        Claim("memory peak above start / captured bytes, rows written per layer as computed (P5)",
              "p5.handoff-layers.sampled_rss_plus_shm_peak_above_start", "config.captured_bytes", value="1.130"),
        Claim("memory peak above start / captured bytes, upstream with its pickled reply (P5)",
              "p5.upstream.rss_hwm_with_reply_above_start", "config.captured_bytes", value="3.069")))
    summary = ("captured rows streamed into shared-memory segments per layer as they are computed; the worker "
               "returns a descriptor; the driver maps each layer whose rows lie in input order (steps that kept "
               "the requests' order) and reads others straight into its output (no pickled payload); opt-in "
               "SPEC_COMPAT_SHM_POOL_MB: segments no tensor reads any more are written again by the next call")
    upstream = "speculators 0.3.0 custom_worker:95 returns tensors through collective_rpc (pickled; PR #322)"
    target = f"{CUSTOM_WORKER}:HiddenStatesWorkerExtension"
    requires = {"speculators": SPEC_03}
    side = "worker"
    #: the driver half that reads descriptors: with it switched off a descriptor would reach stock
    #: speculators unread (its segment left in /dev/shm), so the worker keeps the pickled reply
    depends_on = ("rows-by-request-id",)

    def check(self, module: ModuleType) -> None:
        guard.has_attrs(guard.attr(module, "HiddenStatesWorkerExtension"), "HiddenStatesWorkerExtension",
                        *CAPTURE_METHODS)

    def install(self, module: ModuleType, changes: Changes) -> None:
        ext = module.HiddenStatesWorkerExtension
        for name, fn in handoff_methods(ext, lambda: self.uses("rows-by-request-id")).items():
            changes.setattr(ext, name, fn)


def handoff_methods(ext: type, driver_reads_descriptors: Callable[[], bool]) -> dict[str, Callable[..., Any]]:
    """Replacements that stream captured rows into shared-memory segments and return a descriptor,
    while ``driver_reads_descriptors()`` (the driver half is on) and /dev/shm has room; otherwise
    the per-request store's pickled reply, as before."""
    from ...shims.capture import BY_REQUEST, PerRequestStore
    from ...shims.handoff import SegmentedCapture, unlink_segment

    orig_setup = ext._setup_hidden_states_capture
    orig_reset = ext._reset_capture
    orig_get = ext._get_captured_states

    def _fresh_store(self: Any) -> None:
        old = self.__dict__.get("_spec_compat_store")
        if isinstance(old, SegmentedCapture):
            old.discard()  # segments of an abandoned call: unlinked, not leaked
        elif not isinstance(old, PerRequestStore):
            return  # capture-per-request is off: rows are not keyed by request, nothing to hand over
        if not driver_reads_descriptors() or not shm_usable():
            self._spec_compat_store = PerRequestStore()  # the pickled reply, as before
            return
        # "shm" also for CUDA tensors: one device-to-host copy into shared memory (the driver
        # keeps the rows on the host, as speculators does)
        self._spec_compat_store = SegmentedCapture(mode="shm")

    def _setup_hidden_states_capture(self: Any, layer_ids: list[int]) -> Any:
        out = orig_setup(self, layer_ids)
        _fresh_store(self)
        return out

    def _reset_capture(self: Any) -> Any:
        out = orig_reset(self)
        _fresh_store(self)
        return out

    def _spec_compat_reset_capture(self: Any, spares: list[str]) -> Any:
        """``_reset_capture`` plus the driver's recycled segments for this call."""
        out = _reset_capture(self)
        store = self.__dict__.get("_spec_compat_store")
        if isinstance(store, SegmentedCapture):
            store.adopt(spares)
        else:  # the pickled reply this call: nobody will write them
            for name in spares:
                unlink_segment(name)
        return out

    def _get_captured_states(self: Any) -> Any:
        store = self.__dict__.get("_spec_compat_store")
        if not isinstance(store, SegmentedCapture):
            return orig_get(self)
        self._captured_states = None
        descriptor = store.finish()
        self._spec_compat_store = (SegmentedCapture(mode="shm") if driver_reads_descriptors() and shm_usable()
                                   else PerRequestStore())
        return None if descriptor is None else {BY_REQUEST: descriptor}

    def _spec_compat_layer_writer(self: Any) -> Any:
        """A writer for this forward's captured layers, one ``add`` per layer (P5: no per-step
        list, no clone); None outside a scheduled step."""
        store = self.__dict__.get("_spec_compat_store")
        if not isinstance(store, SegmentedCapture):
            return None
        store.abort_writer()  # a forward that raised half-way committed no rows
        batch = self.model_runner.input_batch
        return store.forward(batch.req_ids[: batch.num_reqs])

    return {"_setup_hidden_states_capture": _setup_hidden_states_capture,
            "_reset_capture": _reset_capture,
            "_spec_compat_reset_capture": _spec_compat_reset_capture,
            "_get_captured_states": _get_captured_states,
            "_spec_compat_layer_writer": _spec_compat_layer_writer}


def shm_usable() -> bool:
    """Whether /dev/shm has :data:`MIN_FREE_SHM` free (else the worker keeps the pickled reply)."""
    try:
        st = os.statvfs("/dev/shm")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    if free < MIN_FREE_SHM:
        log.warning("spec_compat[capture-handoff-shm]: /dev/shm has %d MiB free (< %d MiB): captured rows go back "
                    "pickled, as upstream", free >> 20, MIN_FREE_SHM >> 20)
        return False
    return True
