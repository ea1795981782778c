"""The capture methods installed on speculators' ``HiddenStatesWorkerExtension`` (vLLM's workers).

Four patches stack on ``_setup_hidden_states_capture`` in this order (declared with ``after``):

* :func:`locating_setup` (decoder-stack-locator) replaces it: capture on the decoder stack of any
  wrapper (K2);
* :func:`layer_hooks_setup` (capture-layer-hooks) wraps it: forward hooks on the chosen layers, the
  model's own forward back in place (K3);
* :func:`per_request_methods` (capture-per-request) wraps it and the store/reset/collect methods:
  rows keyed by request id (F10);
* :func:`handoff_methods` (capture-handoff-shm) wraps those: rows into /dev/shm segments, the reply
  a descriptor.

Each function takes the method(s) it wraps and returns the replacement(s); the patches put them in
place through their undo log.
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Callable
from typing import Any

log = logging.getLogger("spec_compat")

#: below this much free /dev/shm the worker keeps the pickled reply (a container's 64 MB default)
MIN_FREE_SHM = 1 << 30


def locating_setup(module: types.ModuleType, patch_id: str) -> Callable[[Any, list[int]], None]:
    """``_setup_hidden_states_capture`` that finds the decoder stack under any wrapper and binds
    ``module._patched_forward`` (looked up at call time: a patched one is used) onto it."""
    from .decoder import find_decoder_stack

    def _setup_hidden_states_capture(self: Any, layer_ids: list[int]) -> None:
        self._layer_ids = frozenset(layer_ids)
        self._captured_states = None
        stack = find_decoder_stack(self.model_runner.model, patch_id)
        stack._extension = self
        stack.forward = types.MethodType(module._patched_forward, stack)
        log.info("spec_compat: capture set up on %s for layers %s", type(stack).__name__, sorted(layer_ids))

    return _setup_hidden_states_capture


def layer_hooks_setup(inner: Callable[..., Any], patch_id: str) -> Callable[[Any, list[int]], Any]:
    """``inner`` (the setup that binds the capture forward), then the model's own forward back in
    place and forward hooks on the chosen layers (on the first tensor-parallel rank only)."""
    from .decoder import hook_layers

    def _setup_hidden_states_capture(self: Any, layer_ids: list[int]) -> Any:
        from vllm.distributed import get_tp_group

        out = inner(self, layer_ids)
        stacks = [m for m in self.model_runner.model.modules() if m.__dict__.get("_extension") is self]
        if len(stacks) != 1:
            raise RuntimeError(f"spec_compat[{patch_id}]: expected one capture target, found {len(stacks)}")
        stack = stacks[0]
        stack.__dict__.pop("forward", None)  # the model's own forward again
        for handle in getattr(self, "_spec_compat_hooks", ()):
            handle.remove()
        self._spec_compat_hooks = hook_layers(self, stack, layer_ids) if get_tp_group().rank_in_group == 0 else []
        return out

    return _setup_hidden_states_capture


def per_request_methods(ext: type) -> dict[str, Callable[..., Any]]:
    """Replacements of the extension's setup / store / reset / collect methods that key captured
    rows by request id (``input_batch.req_ids`` x the step's scheduled tokens)."""
    from .capture import BY_REQUEST, PerRequestStore

    orig_setup = ext._setup_hidden_states_capture
    orig_reset = ext._reset_capture

    def _setup_hidden_states_capture(self: Any, layer_ids: list[int]) -> Any:
        out = orig_setup(self, layer_ids)
        self._spec_compat_store = PerRequestStore()
        runner = self.model_runner
        if not getattr(runner.execute_model, "_spec_compat_step", False):
            run = runner.execute_model

            def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
                store = getattr(self, "_spec_compat_store", None)
                if store is not None:
                    store.begin_step(scheduler_output.num_scheduled_tokens)
                try:
                    return run(scheduler_output, *args, **kwargs)
                finally:
                    if store is not None:
                        store.end_step()

            execute_model._spec_compat_step = True  # type: ignore[attr-defined]
            runner.execute_model = execute_model
        return out

    def _store_captured_states(self: Any, aux_hidden_states: list[Any]) -> None:
        batch = self.model_runner.input_batch
        self._spec_compat_store.store(aux_hidden_states, batch.req_ids[: batch.num_reqs])

    def _reset_capture(self: Any) -> Any:
        out = orig_reset(self)
        self._spec_compat_store = PerRequestStore()
        return out

    def _get_captured_states(self: Any) -> Any:
        self._captured_states = None
        store = getattr(self, "_spec_compat_store", None)
        got = store.collect() if store is not None else None
        return None if got is None else {BY_REQUEST: got}

    return {"_setup_hidden_states_capture": _setup_hidden_states_capture,
            "_store_captured_states": _store_captured_states,
            "_reset_capture": _reset_capture,
            "_get_captured_states": _get_captured_states}


def handoff_methods(ext: type, driver_reads_descriptors: Callable[[], bool]) -> dict[str, Callable[..., Any]]:
    """Replacements that stream captured rows into shared-memory segments and return a descriptor,
    while ``driver_reads_descriptors()`` (the driver half is on) and /dev/shm has room; otherwise
    the per-request store's pickled reply, as before."""
    from .capture import BY_REQUEST, PerRequestStore
    from .handoff import SegmentedCapture, unlink_segment

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
