"""worker-forward-embed-input-ids: the capture forward that speculators binds onto the base model,
for vLLM >= 0.11.1 (``embed_input_ids``, extra layer kwargs).  The forward itself is
:func:`spec_compat.shims.capture.capture_forward` (shared with the other capture units).
"""

from __future__ import annotations

from types import ModuleType

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ..ranges import SPEC_03
from ._worker import CUSTOM_WORKER


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
