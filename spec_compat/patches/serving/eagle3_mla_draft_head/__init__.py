"""EAGLE-3 heads published for Kimi-K2.5 served by vLLM 0.15/0.16 (failure S3 in docs/failures.md):
the MLA head's model class (TorchSpec's ``Eagle3DeepseekV2ForCausalLM``), served with spec-compat's
draft class (``mla_draft.py`` beside this declaration; vLLM imports it by name)."""

from __future__ import annotations

import functools
from types import ModuleType

from ....core.proof import Proof
from ....core.registry import Changes, Patch, TargetChanged, register
from ... import _guards as guard
from .._published_heads import HEADS_TEST, VLLM_S3

MLA_ARCHS = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
MLA_CLASS = "spec_compat.patches.serving.eagle3_mla_draft_head.mla_draft:Eagle3DeepseekMlaForCausalLM"


@register
class Eagle3MlaDraftHead(Patch):
    """vLLM <0.18 has no EAGLE-3 draft with MLA attention (``Eagle3DeepseekV2ForCausalLM``, the
    format of TorchSpec's Kimi-K2.5 MLA head): "Model architectures [...] are not supported"."""

    id = "eagle3-mla-draft-head"
    proof = Proof("fails", f"{HEADS_TEST}::test_mla_head_fails_without_the_patch",
                  r"Model architectures \['Eagle3DeepseekV2ForCausalLM'\] are not supported", using="kimi-k25")
    summary = ("vLLM's model registry serves Eagle3DeepseekV2ForCausalLM / V3 heads (MLA attention, DeepSeek "
               "projections) with spec-compat's draft class")
    upstream = "vLLM <0.18 model_executor/models/registry.py: no Eagle3DeepseekV2ForCausalLM (S3)"
    fixes = ("S3",)
    target = "vllm.model_executor.models.registry:ModelRegistry"
    requires = {"vllm": VLLM_S3}
    side = "server"
    depends_on = ("kimi-k2-draft-config",)

    def check(self, module: ModuleType) -> None:
        reg = guard.attr(module, "ModelRegistry")
        guard.has_attrs(reg, "ModelRegistry", "register_model", "models")
        present = [a for a in MLA_ARCHS if a in reg.models]
        if present:
            raise TargetChanged(f"vLLM's model registry already serves {', '.join(present)}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        reg = module.ModelRegistry
        for arch in MLA_ARCHS:
            changes.call(reg.models, arch, functools.partial(reg.register_model, arch, MLA_CLASS),
                         functools.partial(reg.models.pop, arch, None),
                         label=f"vLLM ModelRegistry.models[{arch!r}]")
