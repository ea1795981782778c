"""kimi-k25-load-unfused-qkv-a (K5): vLLM 0.15.x's Kimi-K2.5 weights loaded without MLA; with MLA
(the fused projection exists) every weight goes to vLLM's own ``load_weights`` unchanged (see
:mod:`._kimi_k25`)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ._kimi_k25 import CLS, KIMI, VLLM_015

# the renames of 0.15.x KimiK25ForConditionalGeneration.load_weights (kimi_k25.py:464-483)
# that matter for the attention's a-projections
_LM_PREFIX = ("language_model.model", "language_model")
_A_PROJ = (".q_a_proj", ".kv_a_proj_with_mqa")
_FUSED = ".fused_qkv_a_proj"


@register
class KimiK25LoadUnfusedQkvA(Patch):
    """vLLM 0.15.x kimi_k25.py:482-483/523 always maps q_a_proj/kv_a_proj_with_mqa onto
    ``fused_qkv_a_proj``, which only the MLA attention has: with VLLM_MLA_DISABLE=1
    (CPU) loading raises KeyError '...self_attn.fused_qkv_a_proj.weight'.  As
    deepseek_v2.py:1356 does, they load into the unfused modules when no fused one exists."""

    id = "kimi-k25-load-unfused-qkv-a"
    proof = Proof("fails", SELFTEST, r"KeyError: 'language_model\.layers\.\d+\.self_attn\.fused_qkv_a_proj\.weight'", using="kimi-k25 short")
    fixes = ("K5",)
    summary = ("q_a_proj / kv_a_proj_with_mqa weights load into the non-MLA attention's own modules "
               "when the model has no fused_qkv_a_proj (VLLM_MLA_DISABLE=1); otherwise vLLM's loader as is")
    upstream = ("vLLM 0.15.x model_executor/models/kimi_k25.py:482,523 fused_qkv_a_proj mapping without "
                "fallback -> KeyError with VLLM_MLA_DISABLE=1")
    target = f"{KIMI}:{CLS}"
    requires = {"vllm": VLLM_015}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, CLS)
        guard.has_params(cls.load_weights, f"{CLS}.load_weights", "self", "weights")
        src = guard.source(cls.load_weights, f"{CLS}.load_weights")
        needed = ['"language_model.model": "language_model"',
                  '(".fused_qkv_a_proj", ".q_a_proj", 0)',
                  '(".fused_qkv_a_proj", ".kv_a_proj_with_mqa", 1)']
        missing = [s for s in needed if s not in src]
        if missing:
            raise TargetChanged(f"{CLS}.load_weights no longer maps {'; '.join(missing)}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def load_weights(wrapped: Any, model: Any, args: tuple, kwargs: dict) -> Any:
            return load_unfused(wrapped, model, *args, **kwargs)

        def load_unfused(inner: Any, model: Any, /, weights: Any) -> Any:
            from vllm.model_executor.model_loader.weight_utils import default_weight_loader

            params = dict(model.named_parameters())

            def rest() -> Any:
                for item in weights:
                    name = item[0]
                    proj = next((p for p in _A_PROJ if p + "." in name), None)
                    if proj is not None:
                        mapped = name.replace(*_LM_PREFIX)
                        if mapped.replace(proj, _FUSED) not in params and mapped in params:
                            param = params[mapped]
                            kwargs = item[2] if len(item) > 2 else {}
                            getattr(param, "weight_loader", default_weight_loader)(param, item[1], **kwargs)
                            continue
                    yield item

            return inner(rest())

        changes.wrap(getattr(module, CLS), "load_weights", load_weights)
