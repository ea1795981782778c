"""Worker-side patches: speculators' ``HiddenStatesWorkerExtension`` inside vLLM's
spawned workers, reached through the ``vllm.general_plugins`` entry point.

Four patches stack on ``_setup_hidden_states_capture``; their order is declared
(``after``): decoder-stack-locator replaces it, then capture-layer-hooks,
capture-per-request and capture-handoff-shm wrap it, in that order.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Claim, Proof, SELFTEST
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ..ranges import SPEC_03, SPEC_04

#: speculators' worker extension module (loaded in vLLM's workers)
CUSTOM_WORKER = "speculators.data_generation.custom_worker"


@register
class WorkerForwardEmbedInputIds(Patch):
    """vLLM 0.11.1 renamed the base model's ``get_input_embeddings`` to
    ``embed_input_ids`` and gave ``forward`` extra layer kwargs; speculators'
    replacement forward (custom_worker:30) raises AttributeError in the worker."""

    id = "worker-forward-embed-input-ids"
    proof = Proof("fails", SELFTEST, r"AttributeError: 'LlamaModel' object has no attribute 'get_input_embeddings'", also_off=("capture-layer-hooks",), using="llama short")
    summary = "the capture forward bound onto the base model uses embed_input_ids and passes layer kwargs"
    upstream = "vLLM 0.11.1 model_executor/models/*: get_input_embeddings -> embed_input_ids (custom_worker:30)"
    fixes = ("F5",)
    target = f"{CUSTOM_WORKER}:_patched_forward"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11.1"}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "_patched_forward")
        guard.has_params(fn, "custom_worker._patched_forward", "self", "input_ids", "positions")
        guard.has_attrs(guard.attr(module, "HiddenStatesWorkerExtension"), "HiddenStatesWorkerExtension",
                        "_setup_hidden_states_capture", "_store_captured_states")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.capture import capture_forward

        changes.setattr(module, "_patched_forward", capture_forward)


@register
class DecoderStackLocator(Patch):
    """speculators 0.3.0 (custom_worker:102-107) requires SupportsEagle3 and takes
    ``model.model``; 0.4.x takes ``get_language_model().model``.  Kimi-K2.5 and
    DeepSeek-V3 declare no SupportsEagle3 before vLLM 0.18, and Kimi's stack is
    ``language_model.layers`` on vLLM 0.15 -> 'does not support' / AttributeError."""

    id = "decoder-stack-locator"
    proof = Proof("fails", SELFTEST, r"ValueError: Model KimiK25ForConditionalGeneration does not support hidden state extraction", also_off=("eagle3-kimi-k25-aux-states",), using="kimi-k25 short")
    summary = "capture set up on the decoder stack of any wrapper (get_language_model, then .model if it holds .layers)"
    upstream = "speculators 0.3.0 custom_worker:102 supports_eagle3 gate + model.model; 0.4.x get_language_model().model"
    fixes = ("K2",)
    target = f"{CUSTOM_WORKER}:HiddenStatesWorkerExtension"
    requires = ({"speculators": SPEC_03}, {"speculators": SPEC_04, "vllm": "<0.16"})
    side = "worker"

    def check(self, module: ModuleType) -> None:
        guard.has_attrs(guard.attr(module, "HiddenStatesWorkerExtension"), "HiddenStatesWorkerExtension",
                        "_setup_hidden_states_capture", "_store_captured_states")
        guard.has_params(guard.attr(module, "_patched_forward"), "custom_worker._patched_forward", "self", "input_ids")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import logging
        import types

        from ...shims.decoder import find_decoder_stack

        log = logging.getLogger("spec_compat")

        def _setup_hidden_states_capture(self: Any, layer_ids: list[int]) -> None:
            self._layer_ids = frozenset(layer_ids)
            self._captured_states = None
            stack = find_decoder_stack(self.model_runner.model, DecoderStackLocator.id)
            stack._extension = self
            # the module global is looked up now: a patched _patched_forward is used
            stack.forward = types.MethodType(module._patched_forward, stack)
            log.info("spec_compat: capture set up on %s for layers %s", type(stack).__name__, sorted(layer_ids))

        changes.setattr(module.HiddenStatesWorkerExtension, "_setup_hidden_states_capture",
                        _setup_hidden_states_capture)


@register
class CaptureLayerHooks(Patch):
    """speculators replaces the base model's ``forward`` (custom_worker:17) and calls
    each layer by keyword: since vLLM 0.12 DeepSeek layers take ``llama_4_scaling``,
    computed in the model's own forward, and the replacement silently drops it.
    Forward hooks on the chosen layers keep the model's forward intact."""

    id = "capture-layer-hooks"
    after = ("decoder-stack-locator",)
    proof = Proof("wrong-values", SELFTEST, r"FAIL many-blocks: sequence \d+ layer \d+: max\|diff\|=\S+ > tolerance", using="kimi-k25+--llama-4-scaling many-blocks")
    summary = "capture through forward hooks on the chosen layers; the model's own forward stays in place"
    upstream = "vLLM 0.12 deepseek_v2.py layer(positions, hidden, residual, llama_4_scaling); custom_worker:44 drops it"
    fixes = ("K3",)
    target = f"{CUSTOM_WORKER}:HiddenStatesWorkerExtension"
    requires = {"speculators": ">=0.3,<0.5", "vllm": ">=0.12"}
    supersedes = ("worker-forward-embed-input-ids",)
    side = "worker"

    def check(self, module: ModuleType) -> None:
        guard.has_attrs(guard.attr(module, "HiddenStatesWorkerExtension"), "HiddenStatesWorkerExtension",
                        "_setup_hidden_states_capture", "_store_captured_states")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.decoder import hook_layers

        ext = module.HiddenStatesWorkerExtension
        inner = ext._setup_hidden_states_capture

        def _setup_hidden_states_capture(self: Any, layer_ids: list[int]) -> Any:
            from vllm.distributed import get_tp_group

            out = inner(self, layer_ids)
            stacks = [m for m in self.model_runner.model.modules() if m.__dict__.get("_extension") is self]
            if len(stacks) != 1:
                raise RuntimeError(f"spec_compat[capture-layer-hooks]: expected one capture target, found {len(stacks)}")
            stack = stacks[0]
            stack.__dict__.pop("forward", None)  # the model's own forward again
            for handle in getattr(self, "_spec_compat_hooks", ()):
                handle.remove()
            self._spec_compat_hooks = (
                hook_layers(self, stack, layer_ids) if get_tp_group().rank_in_group == 0 else []
            )
            return out

        changes.setattr(ext, "_setup_hidden_states_capture", _setup_hidden_states_capture)


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

    _METHODS = ("_setup_hidden_states_capture", "_store_captured_states", "_reset_capture", "_get_captured_states")

    def check(self, module: ModuleType) -> None:
        guard.has_attrs(guard.attr(module, "HiddenStatesWorkerExtension"), "HiddenStatesWorkerExtension", *self._METHODS)

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.capture import BY_REQUEST, PerRequestStore

        ext = module.HiddenStatesWorkerExtension
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

        for name, fn in (("_setup_hidden_states_capture", _setup_hidden_states_capture),
                         ("_store_captured_states", _store_captured_states),
                         ("_reset_capture", _reset_capture),
                         ("_get_captured_states", _get_captured_states)):
            changes.setattr(ext, name, fn)


@register
class CaptureHandoffShm(Patch):
    """speculators 0.3.0 returns the captured tensors through ``collective_rpc`` (custom_worker:95),
    pickled by vLLM's message queue - several full copies of every captured byte, the extraction
    bottleneck upstream (speculators PR #322).  Rows now go into /dev/shm segments as they are
    captured; the reply is a descriptor (2-core CPU, 448 MiB: 3.22x faster, median of 5 paired repeats;
    memory peak 1.130x the captured bytes, upstream's 3.069x; benchmarks/results/handoff_cpu.json)."""

    id = "capture-handoff-shm"
    after = ("capture-per-request",)
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
                        *CapturePerRequest._METHODS)

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.capture import BY_REQUEST, PerRequestStore
        from ...shims.handoff import SegmentedCapture, unlink_segment

        patch = self

        def _driver_reads_descriptors() -> bool:
            return patch.uses("rows-by-request-id")

        ext = module.HiddenStatesWorkerExtension
        orig_setup = ext._setup_hidden_states_capture
        orig_reset = ext._reset_capture
        orig_get = ext._get_captured_states

        def _fresh_store(self: Any) -> None:
            old = self.__dict__.get("_spec_compat_store")
            if isinstance(old, SegmentedCapture):
                old.discard()  # segments of an abandoned call: unlinked, not leaked
            elif not isinstance(old, PerRequestStore):
                return  # capture-per-request is off: rows are not keyed by request, nothing to hand over
            if not _driver_reads_descriptors() or not _shm_usable():
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
            self._spec_compat_store = (SegmentedCapture(mode="shm") if _driver_reads_descriptors() and _shm_usable()
                                       else PerRequestStore())
            return None if descriptor is None else {BY_REQUEST: descriptor}

        def _spec_compat_layer_writer(self: Any) -> Any:
            """A writer for this forward's captured layers, one ``add`` per layer (P5:
            no per-step list, no clone); None outside a scheduled step."""
            store = self.__dict__.get("_spec_compat_store")
            if not isinstance(store, SegmentedCapture):
                return None
            store.abort_writer()  # a forward that raised half-way committed no rows
            batch = self.model_runner.input_batch
            return store.forward(batch.req_ids[: batch.num_reqs])

        for name, fn in (("_setup_hidden_states_capture", _setup_hidden_states_capture),
                         ("_reset_capture", _reset_capture),
                         ("_spec_compat_reset_capture", _spec_compat_reset_capture),
                         ("_get_captured_states", _get_captured_states),
                         ("_spec_compat_layer_writer", _spec_compat_layer_writer)):
            changes.setattr(ext, name, fn)



#: below this much free /dev/shm the worker keeps the pickled reply (a container's 64 MB default)
MIN_FREE_SHM = 1 << 30


def _shm_usable() -> bool:
    import logging
    import os

    try:
        st = os.statvfs("/dev/shm")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    if free < MIN_FREE_SHM:
        logging.getLogger("spec_compat").warning(
            "spec_compat[capture-handoff-shm]: /dev/shm has %d MiB free (< %d MiB): captured rows go back "
            "pickled, as upstream", free >> 20, MIN_FREE_SHM >> 20)
        return False
    return True
