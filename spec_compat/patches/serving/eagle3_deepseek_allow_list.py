"""EAGLE-3 for DeepSeek-V2/V3 and Kimi-K2.5 targets before vLLM 0.18 (failure S1 in
docs/failures.md), inside vLLM's workers: the speculative config's model-type allow-list."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SERVING
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from .._statements import function_statements

DEEPSEEK_FAMILY = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")


def _text_model_type(spec_config: Any) -> str:
    target = getattr(spec_config, "target_model_config", None)
    text = getattr(target, "hf_text_config", None)
    return str(getattr(text, "model_type", ""))


@register
class Eagle3DeepseekAllowList(Patch):
    """vLLM <=0.16 ``config/speculative.py:689`` allows EAGLE-3 only for a list of
    target model types (llama, qwen, ...): a DeepSeek-V3 / Kimi-K2.5 target is
    refused ("Eagle3 is only supported for ...") before anything loads."""

    id = "eagle3-deepseek-allow-list"
    proof = Proof("fails", SERVING, r"ValidationError: \d+ validation errors? for SpeculativeConfig\n  Value error, Eagle3 is only supported for \[.*\] models\. Got self\.target_model_config\.hf_text_config\.model_type='deepseek_v3'", using="deepseek-v3")
    summary = "the speculative config accepts EAGLE-3 for deepseek_v2/v3 and kimi_k2/k25 targets"
    upstream = "vLLM <=0.16 config/speculative.py:689 eagle3_target_supported excludes deepseek_v3 (S1)"
    fixes = ("S1",)
    target = "vllm.config.speculative:SpeculativeConfig"
    requires = {"vllm": ">=0.15,<0.17"}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "SpeculativeConfig")
        decorators = getattr(cls, "__pydantic_decorators__", None)
        dec = getattr(decorators, "model_validators", {}).get("_verify_args") if decorators else None
        if dec is None:
            raise TargetChanged("SpeculativeConfig has no pydantic model validator _verify_args")
        body = function_statements(dec.func, "SpeculativeConfig._verify_args")
        if "eagle3_target_supported" not in "\n".join(body):
            raise TargetChanged("SpeculativeConfig._verify_args has no eagle3 allow-list")
        if body[-2:] != ["self.verify_equal_vocab_size_if_draft_model()", "return self"]:
            raise TargetChanged("SpeculativeConfig._verify_args no longer ends with the vocab check")
        if "Eagle3 is only supported" not in body[-3]:
            raise TargetChanged("the eagle3 allow-list is not the last check of SpeculativeConfig._verify_args")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import dataclasses

        from pydantic.dataclasses import rebuild_dataclass

        cls = module.SpeculativeConfig
        validators = cls.__pydantic_decorators__.model_validators
        dec = validators["_verify_args"]
        orig = dec.func

        def _verify_args(self: Any) -> Any:
            try:
                return orig(self)
            except ValueError as exc:
                if not (str(exc).startswith("Eagle3 is only supported")
                        and _text_model_type(self).startswith(DEEPSEEK_FAMILY)):
                    raise
                # the allow-list was the last check but one: run the one after it
                self.verify_equal_vocab_size_if_draft_model()
                return self

        # through the undo log: restored on undo, reported, and checked for an undeclared stack;
        # the class is rebuilt from its validator table after the swap and again after the restore
        changes.setitem(validators, "_verify_args", dataclasses.replace(dec, func=_verify_args),
                        label="vllm.config.speculative.SpeculativeConfig model validator _verify_args",
                        then=lambda: rebuild_dataclass(cls, force=True))
