"""EAGLE-3 heads published for Kimi-K2.5 served by vLLM 0.15/0.16 (failure S3 in docs/failures.md):
heads that do not fit the target, refused before anything loads."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ._published_heads import HEADS_TEST, VLLM_S3, _eagle3


def _target_facts(spec: Any) -> tuple[int, int, int]:
    text = spec.target_model_config.hf_text_config
    return int(text.hidden_size), int(spec.target_model_config.get_vocab_size()), int(text.num_hidden_layers)


#: targets whose aux states the S1 collector gathers (its own distinct defaults, _eagle3_aux_states.py)
S1_TARGETS = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration")


def _default_ids(spec: Any, layers: int) -> tuple[int, ...] | None:
    """The layers served to a draft that names none: the S1 collector's defaults on DeepSeek / Kimi
    targets (distinct), vLLM's ``(2, N//2, N-3)`` on its own models."""
    from ...shims.draft_heads import vllm_default_ids

    archs = list(getattr(spec.target_model_config, "architectures", None) or [])
    if any(a in S1_TARGETS for a in archs):
        return None  # distinct by construction (_eagle3_aux_states.default_aux_layers)
    return vllm_default_ids(layers)


def _check_fit(spec: Any) -> None:
    from ...shims.draft_heads import KEY, DraftFitError, d2t_problems, fit_problems, integer_tensor, tensor_shapes

    hidden, vocab, layers = _target_facts(spec)
    draft_dir = spec.draft_model_config.model
    # the ids vLLM serves: top-level (eagle3-aux-ids-convention put them there in vLLM's convention)
    top = vars(spec.draft_model_config.hf_config).get(KEY)
    ids, convention = (tuple(top), "input") if top else (_default_ids(spec, layers), "default")
    shapes = tensor_shapes(draft_dir) if os.path.isdir(draft_dir) else {}
    problems = fit_problems(spec.draft_model_config.hf_config, shapes, target_hidden=hidden, target_vocab=vocab,
                            target_layers=layers, ids=ids, convention=convention)
    if not problems and shapes:
        problems = d2t_problems(integer_tensor(draft_dir, "d2t"), vocab)
    if problems:
        target = spec.target_model_config.model
        raise DraftFitError(f"spec_compat[eagle3-draft-fits-target]: the EAGLE-3 draft {draft_dir} does not fit the target "
                            f"{target} (hidden size {hidden}, vocabulary {vocab}, {layers} decoder layers): "
                            + "; ".join(problems) + ". Nothing was loaded.")


@register
class Eagle3DraftFitsTarget(Patch):
    """vLLM 0.15/0.16 load a draft head whose width, vocabulary mapping or aux ids do not fit the
    target and fail later: a head twice the target's width dies in the engine's first step
    (no message names the two widths); a d2t of the wrong length fails in the weight loader, one that
    names tokens past the target's vocabulary indexes its logits out of range."""

    id = "eagle3-draft-fits-target"
    proof = Proof("guard", f"{HEADS_TEST}::test_unfit_head_is_refused_before_loading",
                  r"RuntimeError: mat1 and mat2 shapes cannot be multiplied \(\d+x768 and 1536x512\)", using="kimi-k25")
    summary = ("an EAGLE-3 head whose fc width, target_hidden_size, vocabulary (d2t shape and values / t2d / lm_head) or aux ids "
               "do not fit the target is refused at configuration, naming both sides, before any weight loads")
    upstream = "vLLM 0.15/0.16 config/speculative.py checks none of them (S3)"
    fixes = ("S3",)
    target = "vllm.config.speculative:SpeculativeConfig"
    requires = {"vllm": VLLM_S3}
    side = "server"
    after = ("eagle3-aux-ids-convention",)

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "SpeculativeConfig")
        guard.has_attrs(cls, "SpeculativeConfig", "__post_init__")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def __post_init__(wrapped: Any, spec: Any, args: tuple, kwargs: dict) -> Any:
            out = wrapped(*args, **kwargs)
            if _eagle3(spec):
                _check_fit(spec)
            return out

        changes.wrap(module.SpeculativeConfig, "__post_init__", __post_init__)
