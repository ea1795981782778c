"""EAGLE-3 heads other frameworks trained and published for Kimi-K2.5 (TorchSpec, SpecForge, SGLang
formats) served by vLLM 0.15/0.16 (failure S3 in docs/failures.md): the MLA head's config and model
class, the aux-layer id convention of their configs, and heads that do not fit the target."""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any

from ...core import switches
from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard

log = logging.getLogger("spec_compat")

VLLM_S3 = ">=0.15,<0.17"
HEADS_TEST = "tests/engine/test_published_heads.py"
MLA_ARCHS = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
MLA_CLASS = "spec_compat.shims.mla_draft:Eagle3DeepseekMlaForCausalLM"


@register
class KimiK2DraftConfig(Patch):
    """vLLM <=0.16 ``transformers_utils/config.py`` ``_CONFIG_REGISTRY`` has no ``kimi_k2`` and
    transformers has no such model type: the MLA draft head's config (``model_type: kimi_k2``,
    DeepSeek-V3 fields) fails to load before anything else is read."""

    id = "kimi-k2-draft-config"
    proof = Proof("fails", f"{HEADS_TEST}::test_mla_head_fails_without_the_patch",
                  r"model type `kimi_k2` but Transformers does not recognize this architecture", using="kimi-k25")
    summary = "a draft config with model_type kimi_k2 loads as DeepSeek-V3's config (as later vLLM releases map it)"
    upstream = "vLLM <=0.16 transformers_utils/config.py _CONFIG_REGISTRY lacks kimi_k2 (S3)"
    fixes = ("S3",)
    target = "vllm.transformers_utils.config:_CONFIG_REGISTRY"
    requires = {"vllm": VLLM_S3}
    side = "server"

    def check(self, module: ModuleType) -> None:
        registry = guard.attr(module, "_CONFIG_REGISTRY")
        if not isinstance(registry, dict):
            raise TargetChanged("_CONFIG_REGISTRY is not a dict")
        if "kimi_k2" in registry:
            raise TargetChanged("_CONFIG_REGISTRY already maps kimi_k2")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from transformers import DeepseekV3Config

        registry = module._CONFIG_REGISTRY
        dict.__setitem__(registry, "kimi_k2", DeepseekV3Config)
        changes.on_undo(lambda: registry.pop("kimi_k2", None))


@register
class Eagle3MlaDraftHead(Patch):
    """vLLM <0.18 has no EAGLE-3 draft with MLA attention (``Eagle3DeepseekV2ForCausalLM``, the
    format of TorchSpec's Kimi-K2.5 MLA head): "Model architectures [...] are not supported"."""

    id = "eagle3-mla-draft-head"
    proof = Proof("fails", f"{HEADS_TEST}::test_mla_head_fails_without_the_patch",
                  r"Model architectures \['Eagle3DeepseekV2ForCausalLM'\] are not supported", using="kimi-k25")
    summary = ("vLLM's model registry serves Eagle3DeepseekV2ForCausalLM / V3 heads (MLA attention, DeepSeek "
               "projections) with spec-compat's draft class")
    upstream = "vLLM <0.18 model_executor/models/registry.py: no Eagle3DeepseekV2ForCausalLM (S3)"
    fixes = ("S3",)
    target = "vllm.model_executor.models.registry:ModelRegistry"
    requires = {"vllm": VLLM_S3}
    side = "server"
    depends_on = ("kimi-k2-draft-config",)

    def check(self, module: ModuleType) -> None:
        reg = guard.attr(module, "ModelRegistry")
        guard.has_attrs(reg, "ModelRegistry", "register_model", "models")
        present = [a for a in MLA_ARCHS if a in reg.models]
        if present:
            raise TargetChanged(f"vLLM's model registry already serves {', '.join(present)}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        reg = module.ModelRegistry
        for arch in MLA_ARCHS:
            reg.register_model(arch, MLA_CLASS)
        changes.on_undo(lambda: [reg.models.pop(a, None) for a in MLA_ARCHS])


def _target_facts(spec: Any) -> tuple[int, int, int]:
    text = spec.target_model_config.hf_text_config
    return int(text.hidden_size), int(spec.target_model_config.get_vocab_size()), int(text.num_hidden_layers)


@register
class Eagle3AuxIdsConvention(Patch):
    """vLLM 0.15/0.16 ``v1/worker/gpu_model_runner.py`` ``_get_eagle3_aux_layers_from_config``
    reads only a top-level ``eagle_aux_hidden_state_layer_ids``: the ids SGLang / TorchSpec heads
    name in ``eagle_config`` (outputs of layers) are ignored and the target's defaults served --
    silently other layers than the head was trained on."""

    id = "eagle3-aux-ids-convention"
    proof = Proof("wrong-values", f"{HEADS_TEST}::test_output_convention_head_needs_the_patch",
                  r"^served the layers \(2, 4, 5\)$", using="llama")
    summary = ("an EAGLE-3 head's aux layer ids are served in vLLM's convention (input of layer i): ids named in "
               "eagle_config (SGLang / TorchSpec: output of layer i) + 1; SPEC_COMPAT_AUX_IDS overrides; logged")
    upstream = "vLLM 0.15/0.16 v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config (S3)"
    fixes = ("S3",)
    target = "vllm.config.speculative:SpeculativeConfig"
    requires = {"vllm": VLLM_S3}
    side = "server"
    reads = (switches.AUX_IDS_VAR,)

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "SpeculativeConfig")
        guard.has_attrs(cls, "SpeculativeConfig", "__post_init__")
        if "__post_init__" not in vars(cls):
            raise TargetChanged("SpeculativeConfig.__post_init__ is inherited, not its own")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def __post_init__(wrapped: Any, spec: Any, args: tuple, kwargs: dict) -> Any:
            out = wrapped(*args, **kwargs)
            if _eagle3(spec):
                _apply_convention(spec, switches.value(switches.AUX_IDS_VAR))
            return out

        changes.wrap(module.SpeculativeConfig, "__post_init__", __post_init__)


def _eagle3(spec: Any) -> bool:
    return getattr(spec, "method", None) == "eagle3" and getattr(spec, "draft_model_config", None) is not None


def _apply_convention(spec: Any, override: str) -> None:
    from ...shims.draft_heads import CONVENTIONS, KEY, VAR, served_ids

    cfg = spec.draft_model_config.hf_config
    ids, convention, where = served_ids(cfg, override)
    draft = spec.draft_model_config.model
    if ids is None:
        log.info("spec_compat[eagle3-aux-ids-convention]: draft %s names no aux layer ids; serving the target's "
                 "default layers (vLLM's and SGLang's defaults are the same layers)", draft)
        return
    named = list((vars(cfg).get(KEY) if where == "top-level" else cfg.eagle_config[KEY]))
    log.info("spec_compat[eagle3-aux-ids-convention]: draft %s names aux layer ids %s in %s; assumed convention "
             "'%s' (%s); serving the inputs of target layers %s. Override with %s=input or %s=output.",
             draft, named, where, convention, CONVENTIONS[convention], list(ids), VAR, VAR)
    setattr(cfg, KEY, list(ids))


#: targets whose aux states the S1 collector gathers (its own distinct defaults, eagle3_deepseek.py)
S1_TARGETS = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration")


def _default_ids(spec: Any, layers: int) -> tuple[int, ...] | None:
    """The layers served to a draft that names none: the S1 collector's defaults on DeepSeek / Kimi
    targets (distinct), vLLM's ``(2, N//2, N-3)`` on its own models."""
    from ...shims.draft_heads import vllm_default_ids

    archs = list(getattr(spec.target_model_config, "architectures", None) or [])
    if any(a in S1_TARGETS for a in archs):
        return None  # distinct by construction (aux_states.default_aux_layers)
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
