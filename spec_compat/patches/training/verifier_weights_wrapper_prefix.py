"""T2: speculators' EAGLE-3 trainer on Kimi-K2.5 (and other wrapper) verifiers: the verifier's
wrapper-prefixed weights."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ...core.naming import through
from ...core.proof import Proof, TRAINING
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ..ranges import SPEC_03
from ._targets import CORE

log = logging.getLogger("spec_compat")


@register
class VerifierWeightsWrapperPrefix(Patch):
    """speculators 0.3.0 core.py:239 loads ``model.embed_tokens.weight`` / ``lm_head.weight``
    by exact name; Kimi-K2.5 stores them as ``language_model.model.embed_tokens.weight`` /
    ``language_model.lm_head.weight`` -> KeyError.  Missing names are looked up under the
    wrapper prefix and returned under the requested name."""

    id = "verifier-weights-wrapper-prefix"
    proof = Proof("fails", TRAINING, r"ValueError: None of the requested tensor names were found in the index\.", using="kimi-k25")
    fixes = ("T2",)
    summary = ("verifier tensors that speculators asks for by their text-model name are found under a "
               "multimodal wrapper's 'language_model.' prefix when the plain name is absent")
    upstream = "speculators 0.3.0 models/eagle3/core.py:239 exact weight names (suffix matching since 0.4.0)"
    target = f"{CORE}:load_model_layers"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "load_model_layers"), f"{CORE}.load_model_layers", "layer_names", "model_path")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.verifier import checkpoint_names, find_prefixed

        def load_model_layers(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
            return _load_model_layers(wrapped, *args, **kwargs)

        def _load_model_layers(inner: Any, /, layer_names: list[str], model_path: str) -> dict[str, Any]:
            pid = VerifierWeightsWrapperPrefix.id
            renamed = find_prefixed(layer_names, checkpoint_names(model_path, pid))
            if not renamed:
                with through(pid, f"{CORE}.load_model_layers"):
                    return inner(layer_names, model_path)
            log.info("spec_compat: %s: %s", pid, ", ".join(f"{k} <- {v}" for k, v in renamed.items()))
            with through(pid, f"{CORE}.load_model_layers with wrapper-prefixed names"):
                got = inner([renamed.get(n, n) for n in layer_names], model_path)
            back = {v: k for k, v in renamed.items()}
            return {back.get(k, k): v for k, v in got.items()}

        changes.wrap(module, "load_model_layers", load_model_layers)
