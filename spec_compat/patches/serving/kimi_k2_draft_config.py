"""EAGLE-3 heads published for Kimi-K2.5 served by vLLM 0.15/0.16 (failure S3 in docs/failures.md):
the MLA head's config (``model_type: kimi_k2``)."""

from __future__ import annotations

from types import ModuleType

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ._published_heads import HEADS_TEST, VLLM_S3


@register
class KimiK2DraftConfig(Patch):
    """vLLM <=0.16 ``transformers_utils/config.py`` ``_CONFIG_REGISTRY`` has no ``kimi_k2`` and
    transformers has no such model type: the MLA draft head's config (``model_type: kimi_k2``,
    DeepSeek-V3 fields) fails to load before anything else is read."""

    id = "kimi-k2-draft-config"
    proof = Proof("fails", f"{HEADS_TEST}::test_mla_head_fails_without_the_patch",
                  r"model type `kimi_k2` but Transformers does not recognize this architecture", using="kimi-k25")
    summary = "a draft config with model_type kimi_k2 loads as DeepSeek-V3's config (as later vLLM releases map it)"
    upstream = "vLLM <=0.16 transformers_utils/config.py _CONFIG_REGISTRY lacks kimi_k2 (S3)"
    fixes = ("S3",)
    target = "vllm.transformers_utils.config:_CONFIG_REGISTRY"
    requires = {"vllm": VLLM_S3}
    side = "server"

    def check(self, module: ModuleType) -> None:
        registry = guard.attr(module, "_CONFIG_REGISTRY")
        if not isinstance(registry, dict):
            raise TargetChanged("_CONFIG_REGISTRY is not a dict")
        if "kimi_k2" in registry:
            raise TargetChanged("_CONFIG_REGISTRY already maps kimi_k2")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from transformers import DeepseekV3Config

        changes.setitem(module._CONFIG_REGISTRY, "kimi_k2", DeepseekV3Config,
                        label="vllm.transformers_utils.config._CONFIG_REGISTRY['kimi_k2']")
