"""EAGLE-3 heads published for Kimi-K2.5 served by vLLM 0.15/0.16 (failure S3 in docs/failures.md):
the aux-layer id convention of their configs."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ...core import switches
from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ._published_heads import HEADS_TEST, VLLM_S3, _eagle3

log = logging.getLogger("spec_compat")


@register
class Eagle3AuxIdsConvention(Patch):
    """vLLM 0.15/0.16 ``v1/worker/gpu_model_runner.py`` ``_get_eagle3_aux_layers_from_config``
    reads only a top-level ``eagle_aux_hidden_state_layer_ids``: the ids SGLang / TorchSpec heads
    name in ``eagle_config`` (outputs of layers) are ignored and the target's defaults served --
    silently other layers than the head was trained on."""

    id = "eagle3-aux-ids-convention"
    proof = Proof("wrong-values", f"{HEADS_TEST}::test_output_convention_head_needs_the_patch",
                  r"^served the layers \(2, 4, 5\)$", using="llama")
    summary = ("an EAGLE-3 head's aux layer ids are served in vLLM's convention (input of layer i): ids named in "
               "eagle_config (SGLang / TorchSpec: output of layer i) + 1; SPEC_COMPAT_AUX_IDS overrides; logged")
    upstream = "vLLM 0.15/0.16 v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config (S3)"
    fixes = ("S3",)
    target = "vllm.config.speculative:SpeculativeConfig"
    requires = {"vllm": VLLM_S3}
    side = "server"
    reads = (switches.AUX_IDS_VAR,)

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "SpeculativeConfig")
        guard.has_attrs(cls, "SpeculativeConfig", "__post_init__")
        if "__post_init__" not in vars(cls):
            raise TargetChanged("SpeculativeConfig.__post_init__ is inherited, not its own")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def __post_init__(wrapped: Any, spec: Any, args: tuple, kwargs: dict) -> Any:
            out = wrapped(*args, **kwargs)
            if _eagle3(spec):
                _apply_convention(spec, switches.value(switches.AUX_IDS_VAR))
            return out

        changes.wrap(module.SpeculativeConfig, "__post_init__", __post_init__)


def _apply_convention(spec: Any, override: str) -> None:
    from ...shims.draft_heads import CONVENTIONS, KEY, VAR, served_ids

    cfg = spec.draft_model_config.hf_config
    ids, convention, where = served_ids(cfg, override)
    draft = spec.draft_model_config.model
    if ids is None:
        log.info("spec_compat[eagle3-aux-ids-convention]: draft %s names no aux layer ids; serving the target's "
                 "default layers (vLLM's and SGLang's defaults are the same layers)", draft)
        return
    named = list((vars(cfg).get(KEY) if where == "top-level" else cfg.eagle_config[KEY]))
    log.info("spec_compat[eagle3-aux-ids-convention]: draft %s names aux layer ids %s in %s; assumed convention "
             "'%s' (%s); serving the inputs of target layers %s. Override with %s=input or %s=output.",
             draft, named, where, convention, CONVENTIONS[convention], list(ids), VAR, VAR)
    setattr(cfg, KEY, list(ids))
