"""T2: speculators' EAGLE-3 trainer and its stock scripts (``scripts/train.py``,
``scripts/build_vocab_mapping.py``) on Kimi-K2.5 (and other wrapper / MLA) verifiers:
the verifier's text-model config.

Who is calling: the first frame outside transformers, wrapt, spec_compat and functools
(:func:`caller_is_speculators`)."""

from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import Any

from ...core.proof import Proof, TRAINING
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.hf_config import declares_remote_config
from .. import _guards as guard
from ._targets import AUTO_CONFIG, SPEC_TRAIN

log = logging.getLogger("spec_compat")

_TRAINING_MODULES = ("speculators.models.", "speculators.train.")
_PASSED_THROUGH = ("transformers", "wrapt", "spec_compat", "functools")


def caller_is_speculators(depth: int = 2) -> bool:
    """Whether the code calling AutoConfig is speculators' training side: a module of
    ``speculators.models`` / ``speculators.train``, or a script built on speculators
    (its stock ``scripts/train.py``, ``scripts/build_vocab_mapping.py``).  ``depth``: the
    frame to start from, counted from this function's own (2: its caller's caller)."""
    frame = sys._getframe(depth)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not (name.startswith(_PASSED_THROUGH)):
            break
        frame = frame.f_back
    if frame is None:
        return False
    name = str(frame.f_globals.get("__name__", ""))
    if name.startswith(_TRAINING_MODULES):
        return True
    if name.startswith("speculators"):
        return False  # e.g. data generation: it passes trust_remote_code itself
    for value in list(frame.f_globals.values()):
        mod = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(mod, str) and (mod == "speculators" or mod.startswith("speculators.")):
            return True
    return False


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
