"""EAGLE-3 for DeepSeek-V2/V3 and Kimi-K2.5 targets before vLLM 0.18 (failure S1 in
docs/failures.md), inside vLLM's workers.

The speculative config's model-type allow-list, and the ``SupportsEagle3`` capability
(aux hidden states out of the decoder loop) on the DeepSeek model and the Kimi-K2.5 wrapper.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SERVING
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from .._statements import function_statements

VLLM_S1 = ">=0.15,<0.18"
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


def _eagle3_methods(patch_id: str, find_stack: Any) -> dict[str, Any]:
    """``SupportsEagle3`` members for a model class whose decoder loop has no aux states."""
    from ...shims.aux_states import AuxStateCollector, default_aux_layers

    def set_aux_hidden_state_layers(self: Any, layers: tuple[int, ...]) -> None:
        old = self.__dict__.pop("_spec_compat_aux", None)
        if old is not None:
            old.remove()
        self.__dict__["_spec_compat_aux"] = AuxStateCollector(find_stack(self, patch_id), layers, patch_id)

    def get_eagle3_aux_hidden_state_layers(self: Any) -> tuple[int, ...]:
        return default_aux_layers(len(find_stack(self, patch_id).layers), patch_id)

    # every member of vLLM's runtime-checkable SupportsEagle3 protocol (SupportsEagleBase's flags too:
    # isinstance() looks for each of them)
    return {"supports_eagle3": True,
            "has_own_lm_head": False,
            "has_own_embed_tokens": False,
            "set_aux_hidden_state_layers": set_aux_hidden_state_layers,
            "get_eagle3_aux_hidden_state_layers": get_eagle3_aux_hidden_state_layers}


def _install_eagle3(cls: Any, patch_id: str, changes: Changes) -> None:
    from ...shims.decoder import find_decoder_stack

    for name, value in _eagle3_methods(patch_id, find_decoder_stack).items():
        if name.startswith("has_own_") and hasattr(cls, name):
            continue  # the model's own answer stands
        changes.setattr(cls, name, value)  # new members: nothing to wrap
    # a wrapt wrapper keeps forward's signature, which vLLM reads (is_vllm_model: input_ids, positions)
    changes.wrap(cls, "forward", _forward_with_aux)


def _forward_with_aux(wrapped: Any, model: Any, args: tuple, kwargs: dict) -> Any:
    collector = model.__dict__.get("_spec_compat_aux")
    if collector is None:
        return wrapped(*args, **kwargs)
    collector.start()
    out = wrapped(*args, **kwargs)
    if not hasattr(out, "shape"):  # IntermediateTensors of a non-last pipeline rank, or already a tuple
        return out
    return out, collector.collect()


def _check_not_eagle3(cls: Any, where: str) -> None:
    if getattr(cls, "supports_eagle3", False) or hasattr(cls, "set_aux_hidden_state_layers"):
        raise TargetChanged(f"{where} already declares SupportsEagle3")
    guard.has_params(cls.forward, f"{where}.forward", "input_ids", "positions")


@register
class Eagle3DeepseekAuxStates(Patch):
    """vLLM <0.18 ``model_executor/models/deepseek_v2.py``: DeepseekV2/V3ForCausalLM
    is not ``SupportsEagle3`` (no aux hidden states out of the decoder loop) ->
    "Model does not support EAGLE3 interface" at load (added upstream in 0.18)."""

    id = "eagle3-deepseek-aux-states"
    proof = Proof("fails", SERVING, r"RuntimeError: spec_compat\[cpu-runner-loads-drafter\]: DeepseekV3ForCausalLM does not collect EAGLE-3 aux hidden states \(no SupportsEagle3\)", using="deepseek-v3")
    summary = "DeepseekV2ForCausalLM (and V3) returns EAGLE-3 aux hidden states: inputs of the chosen layers"
    upstream = "vLLM <0.18 model_executor/models/deepseek_v2.py: no SupportsEagle3 (S1)"
    fixes = ("S1",)
    target = "vllm.model_executor.models.deepseek_v2:DeepseekV2ForCausalLM"
    requires = {"vllm": VLLM_S1}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "DeepseekV2ForCausalLM")
        _check_not_eagle3(cls, "DeepseekV2ForCausalLM")

    def install(self, module: ModuleType, changes: Changes) -> None:
        _install_eagle3(module.DeepseekV2ForCausalLM, self.id, changes)


@register
class Eagle3KimiK25Delegation(Patch):
    """vLLM <0.18 ``model_executor/models/kimi_k25.py``: the Kimi-K2.5 wrapper is not
    ``SupportsEagle3``; its text model (DeepSeek-V3) holds the decoder loop, and
    the drafter reads ``config.image_token_index``, which Kimi's config lacks
    (and, on 0.15, ``get_language_model().model``, which the bare text model lacks)."""

    id = "eagle3-kimi-k25-aux-states"
    proof = Proof("fails", SERVING, r"AttributeError: 'KimiK25Config' object has no attribute 'image_token_index'", using="kimi-k25")
    summary = ("KimiK25ForConditionalGeneration returns EAGLE-3 aux hidden states of its text model's layers; "
               "its config names image_token_index for the drafter")
    upstream = "vLLM <0.18 model_executor/models/kimi_k25.py: no SupportsEagle3 on the wrapper (S1)"
    fixes = ("S1",)
    target = "vllm.model_executor.models.kimi_k25:KimiK25ForConditionalGeneration"
    requires = {"vllm": VLLM_S1}
    side = "worker"
    # on vLLM 0.15 kimi-k25-device-without-cuda wraps the same __init__ (the S1 wrapper goes outside it)
    after = ("kimi-k25-device-without-cuda",)

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "KimiK25ForConditionalGeneration")
        _check_not_eagle3(cls, "KimiK25ForConditionalGeneration")
        guard.has_attrs(cls, "KimiK25ForConditionalGeneration", "get_language_model")
        guard.has_params(cls.__init__, "KimiK25ForConditionalGeneration.__init__", "vllm_config")

    def install(self, module: ModuleType, changes: Changes) -> None:
        cls = module.KimiK25ForConditionalGeneration
        _install_eagle3(cls, self.id, changes)

        def __init__(wrapped: Any, wrapper: Any, args: tuple, kwargs: dict) -> None:
            wrapped(*args, **kwargs)
            # EagleProposer.load_model (v1/spec_decode/eagle.py ~1362) reads the wrapper's
            # config.image_token_index; Kimi-K2.5 calls its image token media_placeholder_token_id
            cfg = getattr(wrapper, "config", None)
            if cfg is not None and not hasattr(cfg, "image_token_index") \
                    and hasattr(cfg, "media_placeholder_token_id"):
                cfg.image_token_index = cfg.media_placeholder_token_id
            _expose_text_model_as_causal_lm(wrapper)

        # vLLM reads the signature (initialize_model, is_vllm_model: keyword vllm_config, prefix);
        # inspect.signature of the wrapt wrapper is the original's
        changes.wrap(cls, "__init__", __init__)


def _expose_text_model_as_causal_lm(wrapper: Any) -> None:
    """vLLM 0.15's Kimi-K2.5 wrapper holds a bare ``DeepseekV2Model`` as ``language_model``
    (0.16 holds a ``DeepseekV3ForCausalLM``), while 0.15's ``EagleProposer.load_model``
    (v1/spec_decode/eagle.py:1145) reads ``get_language_model().model.embed_tokens`` and
    ``.lm_head``.  Give the bare text model those two names as plain attributes (not
    registered submodules: parameters, state dicts and module walks are unchanged)."""
    lm = getattr(wrapper, "language_model", None)
    if lm is None or not hasattr(lm, "embed_tokens") or "model" in vars(lm) or "model" in getattr(lm, "_modules", {}):
        return  # 0.16 layout (a causal LM with .model), or not a text model: nothing to expose
    object.__setattr__(lm, "model", lm)
    head = getattr(wrapper, "lm_head", None)
    if head is not None and not hasattr(lm, "lm_head"):
        object.__setattr__(lm, "lm_head", head)
