"""O7: speculators' EAGLE-3 trainer trains on what vLLM serves with: targets from the
verifier's final-norm output."""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ..ranges import SPEC_03
from ._targets import CORE, DRAFT

log = logging.getLogger("spec_compat")


@register
class TargetsAfterFinalNorm(Patch):
    """speculators 0.3.0 core.py:328 computes training targets as ``verifier_lm_head(h)`` from the
    last captured layer *before* the verifier's final norm (fixed in 0.4.0, #313): the draft
    learns from logits the verifier never produces.  The verifier's final RMSNorm is loaded
    (frozen, not saved) and applied to ``verifier_last_hidden_states`` first."""

    id = "targets-after-final-norm"
    after = ("draft-eager-without-cuda",)
    proof = Proof("wrong-values", "tests/engine/test_training.py::test_targets_use_the_final_norm", r"targets equal verifier_lm_head\(last layer\) without the final norm")
    fixes = ("O7",)
    summary = ("training targets come from the verifier's final-norm output: its norm weight is loaded with the "
               "embeddings (frozen, not part of the saved draft) and applied before verifier_lm_head")
    upstream = "speculators <0.4.0 models/eagle3/core.py:328 targets from pre-norm states (fixed by #313 in 0.4.0)"
    target = f"{CORE}:{DRAFT}"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, DRAFT)
        guard.has_params(cls._setup_embeddings_and_lm_heads, "_setup_embeddings_and_lm_heads", "self", "config")
        guard.has_params(cls.forward, f"{DRAFT}.forward", "verifier_last_hidden_states")
        guard.attr(module, "load_model_layers")
        if "verifier_norm" in guard.source(cls, DRAFT):
            raise TargetChanged(f"{DRAFT} already applies a verifier norm")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.verifier import rms_norm

        cls = getattr(module, DRAFT)
        forward = cls.forward

        def _setup_embeddings_and_lm_heads(wrapped: Any, draft: Any, args: tuple, kwargs: dict) -> Any:
            return setup_with_verifier_norm(wrapped, draft, *args, **kwargs)

        def setup_with_verifier_norm(setup: Any, draft: Any, /, config: Any, *args: Any, **kwargs: Any) -> Any:
            out = setup(config, *args, **kwargs)
            import torch

            # module.load_model_layers: the binding verifier-weights-wrapper-prefix may adapt
            weights = module.load_model_layers(["model.norm.weight"], config.name_or_path)
            weight = weights.get("model.norm.weight")
            if weight is None:
                log.warning("spec_compat: %s: no model.norm.weight in %s; targets use a unit-weight RMSNorm",
                            TargetsAfterFinalNorm.id, config.name_or_path)
                weight = torch.ones(draft.hidden_size)
            eps = float(getattr(draft.config.transformer_layer_config, "rms_norm_eps", 1e-6))
            # a plain attribute: not a parameter, not a buffer, never saved
            object.__setattr__(draft, "_spec_compat_verifier_norm", (weight.detach().float(), eps))
            return out

        # plain function, not changes.wrap: the forward of a torch.compile'd model, which dynamo may trace
        @functools.wraps(forward)
        def forward_(self: Any, *args: Any, **kwargs: Any) -> Any:
            norm = self.__dict__.get("_spec_compat_verifier_norm")
            target = kwargs.get("verifier_last_hidden_states")
            if norm is not None and target is not None:
                kwargs["verifier_last_hidden_states"] = rms_norm(target, norm[0].to(target.dtype), norm[1])
            return forward(self, *args, **kwargs)

        changes.wrap(cls, "_setup_embeddings_and_lm_heads", _setup_embeddings_and_lm_heads)
        changes.setattr(cls, "forward", forward_)
