"""EAGLE-3 drafts trained by speculators 0.9 served by vLLM 0.15/0.16 (shared: ``_eagle3_norms.py``):
the speculators-config reader drops ``norm_before_fc`` / ``fc_norm`` / ``norm_output``."""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ._eagle3_norms import SPEC09_SERVING, SYMPTOM, VLLM_NO_INPUT_NORM

ALGOS = "vllm.transformers_utils.configs.speculators.algos"
#: the second parameter of ``update_eagle3``: ``vllm_config`` in 0.15.1 (called by keyword), later renamed
CONFIG_PARAM_NAMES = ("pre_trained_config", "vllm_config")
#: the speculators config fields the draft's config gets
FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


def carry_flags(config_dict: dict, pre_trained_config: dict) -> None:
    """Copy the flags a speculators config sets into the draft's transformers config dict."""
    for name in FLAGS:
        if name in config_dict and config_dict[name] is not None:
            pre_trained_config[name] = bool(config_dict[name])


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
