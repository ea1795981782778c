"""Worker-side patches: speculators' ``HiddenStatesWorkerExtension`` inside vLLM's
spawned workers, reached through the ``vllm.general_plugins`` entry point.

Four patches stack on ``_setup_hidden_states_capture``; their order is declared
(``after``): decoder-stack-locator replaces it, then capture-layer-hooks,
capture-per-request and capture-handoff-shm wrap it, in that order.
"""

from __future__ import annotations

from types import ModuleType

from ...core import switches
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
        from ...shims.worker_capture import locating_setup

        changes.setattr(module.HiddenStatesWorkerExtension, "_setup_hidden_states_capture",
                        locating_setup(module, self.id))


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
        from ...shims.worker_capture import layer_hooks_setup

        ext = module.HiddenStatesWorkerExtension
        changes.setattr(ext, "_setup_hidden_states_capture", layer_hooks_setup(ext._setup_hidden_states_capture, self.id))


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
        from ...shims.worker_capture import per_request_methods

        ext = module.HiddenStatesWorkerExtension
        for name, fn in per_request_methods(ext).items():
            changes.setattr(ext, name, fn)


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
                        *CapturePerRequest._METHODS)

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.worker_capture import handoff_methods

        ext = module.HiddenStatesWorkerExtension
        for name, fn in handoff_methods(ext, lambda: self.uses("rows-by-request-id")).items():
            changes.setattr(ext, name, fn)
