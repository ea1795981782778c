"""T4: a draft saved by speculators' trainer reloads through speculators' own loader
(``Eagle3DraftModel.from_pretrained(saved_dir)``), on transformers 4.x and 5."""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ._targets import CORE, DRAFT, SPEC_TRAIN

log = logging.getLogger("spec_compat")


def _post_init_keeping_weights(model: Any) -> None:
    try:
        from transformers import initialization as init  # transformers >= 5

        ctx = init.no_init_weights()
    except (ImportError, AttributeError):
        from transformers.modeling_utils import no_init_weights

        ctx = no_init_weights()
    with ctx:
        model.post_init()


@register
class DraftReloadsWithSpeculatorsLoader(Patch):
    """``Eagle3DraftModel.from_pretrained(saved_dir)`` (speculators' SpeculatorModel loader)
    passes ``verifier=``/``verifier_attachment_mode=`` and no vocab maps to
    ``Eagle3DraftModel.__init__(config, t2d, d2t)``: TypeError 'unexpected keyword verifier'.
    The constructor accepts them and builds placeholder maps that the saved d2t/t2d replace."""

    id = "draft-reloads-with-speculators-loader"
    proof = Proof("fails", "tests/engine/test_training.py::test_reload_needs_shim", r"TypeError: Eagle3DraftModel.__init__\(\) got an unexpected keyword argument 'verifier'")
    fixes = ("T4",)
    summary = ("Eagle3DraftModel accepts the loader's verifier/verifier_attachment_mode arguments and, "
               "without t2d/d2t, placeholder maps of the config's sizes that the checkpoint's own overwrite")
    upstream = "speculators 0.3.0-0.4.x models/eagle3/core.py Eagle3DraftModel.__init__(config, t2d, d2t) vs model.py from_pretrained"
    target = f"{CORE}:{DRAFT}"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        params = guard.params(guard.attr(module, DRAFT).__init__, f"{DRAFT}.__init__")
        if list(params)[:4] != ["self", "config", "t2d", "d2t"]:
            raise TargetChanged(f"{DRAFT}.__init__ is no longer (self, config, t2d, d2t)")
        if "verifier" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise TargetChanged(f"{DRAFT}.__init__ accepts the loader's keywords itself")

    def install(self, module: ModuleType, changes: Changes) -> None:
        cls = getattr(module, DRAFT)

        def __init__(wrapped: Any, draft: Any, args: tuple, kwargs: dict) -> None:
            return init_with_loader_arguments(wrapped, draft, *args, **kwargs)

        def init_with_loader_arguments(init: Any, draft: Any, /, config: Any, t2d: Any = None, d2t: Any = None,
                                       *args: Any, verifier: Any = None, verifier_attachment_mode: Any = None,
                                       **kwargs: Any) -> None:
            if t2d is None and d2t is None:
                import torch

                draft_size = int(config.draft_vocab_size)
                target = int(config.transformer_layer_config.vocab_size)
                t2d = torch.zeros(target, dtype=torch.bool)
                t2d[:draft_size] = True
                d2t = torch.zeros(draft_size, dtype=torch.long)
                log.info("spec_compat: %s: placeholder vocab maps (%d of %d); the checkpoint's d2t/t2d replace them",
                         DraftReloadsWithSpeculatorsLoader.id, draft_size, target)
                if verifier is not None:
                    log.warning("spec_compat: %s: Eagle3DraftModel does not attach a verifier; %r ignored",
                                DraftReloadsWithSpeculatorsLoader.id, verifier)
                layer_config = config.transformer_layer_config
                if getattr(layer_config, "_attn_implementation", None) is None:
                    # set by scripts/train.py after construction, so never saved with the config
                    layer_config._attn_implementation = "simple_flex_attention"
                init(config, t2d, d2t, *args, **kwargs)
                if not hasattr(draft, "all_tied_weights_keys") and hasattr(draft, "post_init"):
                    # transformers >= 5 loads only models that ran post_init() (speculators' does not);
                    # without (re-)initialising the weights copied from the verifier
                    _post_init_keeping_weights(draft)
                # the draft's lm_head (draft vocab) is its own weight, not the embedding
                # (verifier vocab): transformers' loader would tie them and fail on the shapes
                if getattr(draft.config, "tie_word_embeddings", False):
                    draft.config.tie_word_embeddings = False
                return
            init(config, t2d, d2t, *args, **kwargs)

        changes.wrap(cls, "__init__", __init__)

        raw = cls.__dict__.get("get_init_context") or getattr(cls, "get_init_context", None)
        get_init_context = getattr(raw, "__func__", None)
        if get_init_context is not None:
            # plain classmethod, not changes.wrap: usually a NEW attribute of the draft class (inherited
            # from PreTrainedModel), bound to each subclass that calls it
            @functools.wraps(get_init_context)
            def get_init_context_(klass: Any, *args: Any, **kwargs: Any) -> Any:
                # transformers builds models on the meta device (init_empty_weights); this
                # constructor copies the verifier's embeddings and lm_head into its parameters,
                # which needs real tensors
                import torch

                def on_meta(c: Any) -> bool:
                    if isinstance(c, torch.device):  # transformers >= 5: torch.device("meta")
                        return c.type == "meta"
                    return getattr(getattr(c, "func", None), "__name__", "") == "init_empty_weights"  # 4.x

                return [c for c in get_init_context(klass, *args, **kwargs) if not on_meta(c)]

            changes.setattr(cls, "get_init_context", classmethod(get_init_context_))
