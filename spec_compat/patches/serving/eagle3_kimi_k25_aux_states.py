"""EAGLE-3 for Kimi-K2.5 targets before vLLM 0.18 (failure S1 in docs/failures.md), inside vLLM's
workers: the ``SupportsEagle3`` capability (aux hidden states out of the decoder loop) on the
Kimi-K2.5 wrapper (shared with the DeepSeek model's: ``_eagle3_aux_states.py``), and what vLLM's
drafter reads from it."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SERVING
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ._eagle3_aux_states import VLLM_S1, _check_not_eagle3, _install_eagle3


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
