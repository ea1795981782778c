"""EAGLE-3 drafts trained by speculators 0.9 served by vLLM 0.15/0.16 (shared: ``_eagle3_norms.py``):
vLLM's ``llama_eagle3`` draft has no input norm and always feeds back the pre-norm states."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ._eagle3_norms import (SPEC09_SERVING, SYMPTOM, VLLM_NO_INPUT_NORM, add_input_norms, fed_back,
                            normed_aux_states)

LLAMA_EAGLE3 = "vllm.model_executor.models.llama_eagle3"


@register
class Eagle3DraftInputNorms(Patch):
    """vLLM 0.15/0.16 ``model_executor/models/llama_eagle3.py``: the draft has no
    ``input_norm`` / ``fc_norm`` (``load_weights`` line 258: ``params_dict[name]`` raises
    KeyError for 'input_norm.weight'), ``combine_hidden_states`` applies only ``fc``, and the
    pre-norm states are always fed back (speculators' ``norm_output`` feeds the post-norm)."""

    id = "eagle3-draft-input-norms"
    proof = Proof("fails", SPEC09_SERVING, SYMPTOM, using="llama")
    fixes = ("S2",)
    summary = ("the EAGLE-3 draft builds and applies the input norm(s) its config names before fc, and with "
               "norm_output feeds the post-norm hidden states to the next draft step")
    upstream = "vLLM 0.15/0.16 model_executor/models/llama_eagle3.py LlamaModel / Eagle3LlamaForCausalLM.combine_hidden_states"
    target = f"{LLAMA_EAGLE3}:LlamaModel"
    requires = {"vllm": VLLM_NO_INPUT_NORM}
    side = "worker"
    depends_on = ("eagle3-speculators-norm-flags",)

    def check(self, module: ModuleType) -> None:
        model = guard.attr(module, "LlamaModel")
        head = guard.attr(module, "Eagle3LlamaForCausalLM")
        src = guard.source(model, "llama_eagle3.LlamaModel")
        if "input_norm" in src or "norm_output" in src:
            raise TargetChanged("llama_eagle3.LlamaModel already has input_norm / norm_output")
        if "self.fc = " not in src or "hidden_prenorm" not in src:
            raise TargetChanged("llama_eagle3.LlamaModel no longer builds fc or returns hidden_prenorm")
        guard.has_params(model.forward, "LlamaModel.forward", "input_ids", "positions", "hidden_states")
        guard.has_params(head.combine_hidden_states, "Eagle3LlamaForCausalLM.combine_hidden_states", "hidden_states")
        guard.has_attrs(module, LLAMA_EAGLE3, "RMSNorm", "nn")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def __init__(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
            wrapped(*args, **kwargs)
            add_input_norms(instance, module.RMSNorm, module.nn.ModuleList)

        def forward(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            return fed_back(instance, wrapped(*args, **kwargs))

        def combine_hidden_states(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            inner = instance.model
            if not getattr(inner, "use_aux_hidden_state", True):
                return wrapped(*args, **kwargs)
            (hidden_states,) = args or (kwargs.pop("hidden_states"),)
            return wrapped(normed_aux_states(inner, hidden_states))

        changes.wrap(module.LlamaModel, "__init__", __init__)
        changes.wrap(module.LlamaModel, "forward", forward)
        changes.wrap(module.Eagle3LlamaForCausalLM, "combine_hidden_states", combine_hidden_states)
