"""EAGLE-3 drafts trained by speculators 0.9 (``norm_before_fc`` / ``fc_norm`` / ``norm_output``,
on by default for ``norm_before_fc`` and ``norm_output``) served by vLLM 0.15/0.16, whose
speculators-config reader drops those fields and whose ``llama_eagle3`` draft has no input
norm: loading such a draft fails ("KeyError: 'input_norm.weight'")."""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard

ALGOS = "vllm.transformers_utils.configs.speculators.algos"
LLAMA_EAGLE3 = "vllm.model_executor.models.llama_eagle3"
#: the second parameter of ``update_eagle3``: ``vllm_config`` in 0.15.1 (called by keyword), later renamed
CONFIG_PARAM_NAMES = ("pre_trained_config", "vllm_config")
#: vLLM releases measured (0.16.0 and 0.15.1)
VLLM_NO_INPUT_NORM = ">=0.15,<0.17"
#: ``spec-compat evaluate`` of the draft stock ``speculators train`` 0.9.0 wrote, with the patch off
SPEC09_SERVING = "tests/server/test_speculators_pipeline.py::test_served_draft_fails_without_the_patch"
SYMPTOM = r"KeyError: 'input_norm\.weight'"


@register
class Eagle3SpeculatorsNormFlags(Patch):
    """vLLM 0.15/0.16 ``transformers_utils/configs/speculators/algos.py`` ``update_eagle3``
    copies draft_vocab_size, target_hidden_size, norm_before_residual and the aux layer ids
    from a speculators config and drops ``norm_before_fc`` / ``fc_norm`` / ``norm_output``:
    the draft is built without the norms it was trained with."""

    id = "eagle3-speculators-norm-flags"
    proof = Proof("fails", SPEC09_SERVING, SYMPTOM, using="llama")
    fixes = ("S2",)
    summary = "a speculators EAGLE-3 config's norm_before_fc, fc_norm and norm_output reach the draft's config"
    upstream = "vLLM 0.15/0.16 transformers_utils/configs/speculators/algos.py update_eagle3 (later releases copy them)"
    target = f"{ALGOS}:update_eagle3"
    requires = {"vllm": VLLM_NO_INPUT_NORM}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "update_eagle3")
        where = f"{ALGOS}.update_eagle3"
        names = list(guard.params(fn, where))
        if len(names) != 2 or names[0] != "config_dict" or names[1] not in CONFIG_PARAM_NAMES:
            raise TargetChanged(f"{where} takes ({', '.join(names)}), expected (config_dict, "
                                f"{' | '.join(CONFIG_PARAM_NAMES)})")
        registry = module.__dict__.get("SUPPORTED_SPECULATORS_TYPES")
        if not isinstance(registry, dict) or registry.get("eagle3") is not fn:
            raise TargetChanged("SUPPORTED_SPECULATORS_TYPES['eagle3'] is not update_eagle3")
        if "norm_before_fc" in guard.source(fn, "update_eagle3"):
            raise TargetChanged("update_eagle3 already reads norm_before_fc")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.eagle3_norms import carry_flags

        registry = module.SUPPORTED_SPECULATORS_TYPES
        stock = registry["eagle3"]
        signature = inspect.signature(stock)
        target_name = list(signature.parameters)[1]

        # vLLM 0.15.1 calls it with keywords (config_dict=, vllm_config=), 0.16.0 names the second
        # pre_trained_config: the wrapper keeps the stock signature and binds whatever the caller passes
        def update_eagle3(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
            bound = signature.bind(*args, **kwargs)
            wrapped(*args, **kwargs)
            carry_flags(bound.arguments["config_dict"], bound.arguments[target_name])

        wrapper = changes.wrap(module, "update_eagle3", update_eagle3)
        changes.setitem(registry, "eagle3", wrapper, label=f"{module.__name__} registry['eagle3']")


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
        from ...shims.eagle3_norms import add_input_norms, fed_back, normed_aux_states

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
