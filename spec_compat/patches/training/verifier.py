"""T2: speculators' EAGLE-3 trainer and its stock scripts (``scripts/train.py``,
``scripts/build_vocab_mapping.py``) on Kimi-K2.5 (and other wrapper / MLA) verifiers:
the verifier's text-model config and its wrapper-prefixed weights."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ...core.naming import through
from ...core.proof import Proof, TRAINING
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.callers import caller_is_speculators
from ...shims.hf_config import declares_remote_config
from .. import _guards as guard
from ..ranges import SPEC_03
from .targets import AUTO_CONFIG, CORE, SPEC_TRAIN

log = logging.getLogger("spec_compat")


@register
class VerifierConfigTextModel(Patch):
    """speculators (train.py:90, core.py:226, build_vocab_mapping.py:88) loads the verifier
    config without ``trust_remote_code`` and reads top-level ``hidden_size``/``vocab_size``/
    ``head_dim``: Kimi-K2.5's remote-code config fails to load, nests them in ``text_config``,
    and DeepseekV3Config's ``head_dim`` is the rope size (64 heads x 64 instead of x 112)."""

    id = "verifier-config-text-model"
    proof = Proof("fails", TRAINING, r"in _setup_embeddings_and_lm_heads\n(?:  .*\n)*ValueError: The repository \S+ contains custom code which must be executed to correctly load the model", using="kimi-k25")
    fixes = ("T2",)
    summary = ("speculators' training code and stock scripts get the verifier's text-model config: remote "
               "code trusted for a path whose config.json declares it (speculators' own generator already "
               "loads that path with trust_remote_code=True), text_config of wrapper configs, and an MLA "
               "config's head_dim set to hidden/heads; other callers unchanged")
    upstream = ("speculators 0.3.0 scripts/train.py:90, models/eagle3/core.py:226; 0.4.0.1 train.py:117 - "
                "AutoConfig without trust_remote_code, top-level sizes, DeepseekV3Config.head_dim = rope dim")
    target = f"{AUTO_CONFIG}:AutoConfig"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "AutoConfig")
        raw = cls.__dict__.get("from_pretrained")
        if not isinstance(raw, classmethod):
            raise TargetChanged("AutoConfig.from_pretrained is no longer a classmethod")
        guard.has_params(raw.__func__, "AutoConfig.from_pretrained", "pretrained_model_name_or_path")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.verifier import text_config

        def from_pretrained(wrapped: Any, klass: Any, args: tuple, kwargs: dict) -> Any:
            # caller_is_speculators() starts at this wrapper's caller (wrapt's frames are passed over)
            if not caller_is_speculators():
                return wrapped(*args, **kwargs)
            return for_speculators(wrapped, *args, **kwargs)

        def for_speculators(inner: Any, /, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
            if "trust_remote_code" not in kwargs and declares_remote_config(pretrained_model_name_or_path):
                log.info("spec_compat: %s: loading %s with trust_remote_code=True for speculators (its generator "
                         "trusts the same path)", VerifierConfigTextModel.id, pretrained_model_name_or_path)
                kwargs["trust_remote_code"] = True
            return text_config(inner(pretrained_model_name_or_path, *args, **kwargs))

        changes.wrap(module.AutoConfig, "from_pretrained", from_pretrained)


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
