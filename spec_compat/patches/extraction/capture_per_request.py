"""capture-per-request: the worker keys captured rows by request id (F10); wraps the extension's
setup / store / reset / collect methods after capture-layer-hooks (see :mod:`._worker`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ..ranges import SPEC_03
from ._worker import CAPTURE_METHODS, CUSTOM_WORKER


@register
class CapturePerRequest(Patch):
    """speculators 0.3.0 concatenates every forward's rows and the driver slices
    them in input order (generator:278), but the engine runs requests in its own
    order (chunked prompts continue after new ones): rows silently belong to other
    sequences.  The worker now keys captured rows by request id."""

    id = "capture-per-request"
    after = ("capture-layer-hooks",)
    proof = Proof("fails", SELFTEST, r"RowCountError: spec_compat\[rows-by-request-id\]: the worker returned rows without request ids", using="llama short")
    summary = "worker keys captured rows by request id (input_batch.req_ids x num_scheduled_tokens)"
    upstream = "speculators 0.3.0 custom_worker:88 one list per layer, no request ids; engine reorders (F10)"
    fixes = ("F10",)
    target = f"{CUSTOM_WORKER}:HiddenStatesWorkerExtension"
    requires = {"speculators": SPEC_03}
    side = "worker"

    _METHODS = CAPTURE_METHODS

    def check(self, module: ModuleType) -> None:
        guard.has_attrs(guard.attr(module, "HiddenStatesWorkerExtension"), "HiddenStatesWorkerExtension", *self._METHODS)

    def install(self, module: ModuleType, changes: Changes) -> None:
        ext = module.HiddenStatesWorkerExtension
        for name, fn in per_request_methods(ext).items():
            changes.setattr(ext, name, fn)


def per_request_methods(ext: type) -> dict[str, Callable[..., Any]]:
    """Replacements of the extension's setup / store / reset / collect methods that key captured
    rows by request id (``input_batch.req_ids`` x the step's scheduled tokens)."""
    from ...shims.capture import BY_REQUEST, PerRequestStore

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
