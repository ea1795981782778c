"""T1: speculators 0.3.x/0.4.x on transformers >= 5.4 (training-only environments:
vLLM 0.15/0.16 pin transformers < 5).

transformers 5.4 made ``PreTrainedConfig`` a strict dataclass; speculators'
``SpeculatorModelConfig`` is a pydantic model *and* a ``PretrainedConfig``, so
``import speculators`` fails (``PydanticUndefinedAnnotation: torch``), then building
an ``Eagle3SpeculatorConfig`` and saving it fail.  transformers 5.24 also removed
``transformers.modeling_attn_mask_utils``, which ``import speculators`` imports.
speculators fixed the first three in 0.5.0 (``config.py``, ``utils/pydantic_utils.py``)
and no longer imports the removed module at package import there.

``import speculators`` runs its schema rebuild inside ``speculators/__init__.py``:
a hook on ``speculators`` itself would come too late.  These patches act earlier:
on ``transformers.configuration_utils`` and ``transformers`` when they are imported,
and on ``speculators.config`` once it has run, before ``speculators/__init__.py``
reaches ``reload_and_populate_configs()`` and imports the model subclasses.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import sys
from types import ModuleType
from typing import Any

from ...core.proof import Proof, T1_STEPS
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims import hf_config
from .. import _guards as guard

SPEC_T1 = ">=0.3,<0.5"
TF_CONFIG = "transformers.configuration_utils"
SPEC_CONFIG = "speculators.config"
SMC = "SpeculatorModelConfig"

#: names a transformers annotation may use under TYPE_CHECKING that this patch may
#: bind in the annotating module: name -> module imported for it
PROVIDED = {"torch": "torch"}


def _pretrained_config(module: ModuleType) -> type:
    """transformers' config base as ``speculators.config`` bound it (``PretrainedConfig``)."""
    base = module.__dict__.get("PretrainedConfig")
    if not isinstance(base, type):
        raise TargetChanged(f"{module.__name__} has no PretrainedConfig class bound")
    if not dataclasses.is_dataclass(base):
        raise TargetChanged(f"{base.__module__}.{base.__qualname__} is not a dataclass (transformers < 5.4 shape)")
    return base


@register
class PretrainedConfigAnnotations(Patch):
    """transformers >= 5.4 configuration_utils.py: ``PreTrainedConfig.dtype: str | torch.dtype | None``
    with ``torch`` imported only under TYPE_CHECKING; pydantic evaluates it for speculators'
    SpeculatorModelConfig -> ``import speculators`` raises ``PydanticUndefinedAnnotation: torch``."""

    id = "pretrained-config-annotations"
    proof = Proof("fails", T1_STEPS, r"PydanticUndefinedAnnotation: name 'torch' is not defined", using="import")
    fixes = ("T1",)
    summary = ("the names PreTrainedConfig's field annotations use (torch) are bound in "
               "transformers.configuration_utils, so pydantic can evaluate them for speculators' configs")
    upstream = ("transformers 5.4 configuration_utils.py: dataclass PreTrainedConfig annotates dtype with "
                "torch.dtype under TYPE_CHECKING -> import speculators: PydanticUndefinedAnnotation: torch")
    target = f"{TF_CONFIG}:PreTrainedConfig"
    requires = {"speculators": SPEC_T1, "transformers": ">=5.4"}

    def _missing(self, module: ModuleType) -> dict[str, set[str]]:
        base = guard.attr(module, "PreTrainedConfig")
        if not dataclasses.is_dataclass(base):
            raise TargetChanged("PreTrainedConfig is not a dataclass (transformers < 5.4 shape)")
        missing = hf_config.unresolved_annotation_names(base.__mro__[:-1])
        if not missing:
            raise TargetChanged("every annotation of PreTrainedConfig and its bases resolves already")
        unknown = sorted({n for names in missing.values() for n in names} - set(PROVIDED))
        if unknown:
            raise TargetChanged(f"PreTrainedConfig's annotations name {', '.join(unknown)}, "
                                f"which this shim does not provide (only {', '.join(PROVIDED)})")
        return missing

    def check(self, module: ModuleType) -> None:
        self._missing(module)

    def install(self, module: ModuleType, changes: Changes) -> None:
        for module_name, names in sorted(self._missing(module).items()):
            annotating = sys.modules[module_name]
            for name in sorted(names):
                changes.setattr(annotating, name, importlib.import_module(PROVIDED[name]))


@register
class SpeculatorConfigOwnInit(Patch):
    """transformers >= 5.4 ``PreTrainedConfig.__init_subclass__`` gives every config subclass
    without an ``__init__`` a generated one: speculators 0.3.x's Eagle3SpeculatorConfig(...) (config.py)
    then bypasses pydantic -> ``AttributeError: ... no attribute '__pydantic_fields_set__'``."""

    id = "speculator-config-own-init"
    proof = Proof("fails", T1_STEPS, r"AttributeError: 'Eagle3SpeculatorConfig' object has no attribute '__pydantic_fields_set__'", using="build-config")
    fixes = ("T1",)
    summary = ("subclasses of SpeculatorModelConfig (Eagle3SpeculatorConfig, ...) keep the pydantic __init__ "
               "they inherit instead of the one transformers' __init_subclass__ generates for them")
    upstream = ("transformers 5.4 configuration_utils.py PreTrainedConfig.__init_subclass__: dataclass __init__ "
                "on subclasses -> Eagle3SpeculatorConfig(...): AttributeError __pydantic_fields_set__")
    target = f"{SPEC_CONFIG}:{SMC}"
    requires = {"speculators": SPEC_T1, "transformers": ">=5.4"}

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, SMC)
        base = _pretrained_config(module)
        if base not in cls.__mro__:
            raise TargetChanged(f"{SMC} is no longer a subclass of {base.__qualname__}")
        if "__init_subclass__" not in base.__dict__:
            raise TargetChanged(f"{base.__qualname__} defines no __init_subclass__: nothing replaces __init__")
        if "__init__" not in cls.__dict__:
            raise TargetChanged(f"{SMC} has no __init__ of its own to keep")
        if "__init_subclass__" in cls.__dict__:
            raise TargetChanged(f"{SMC} defines __init_subclass__ itself (speculators >= 0.5 restores __init__)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        cls = getattr(module, SMC)
        injector = inspect.getfile(sys.modules[_pretrained_config(module).__module__])
        changes.setattr(cls, "__init_subclass__", hf_config.keep_inherited_init(cls))
        # subclasses built before this patch (speculators imported before spec_compat)
        stack = list(cls.__subclasses__())
        while stack:
            sub = stack.pop()
            stack.extend(sub.__subclasses__())
            if hf_config.injected_init(sub, injector):
                _drop_attr(changes, sub, "__init__")


def _drop_attr(changes: Changes, cls: type, name: str) -> None:
    old = cls.__dict__[name]
    delattr(cls, name)

    def restore() -> None:
        if name not in cls.__dict__:
            setattr(cls, name, old)

    changes.on_undo(restore)


@register
class SpeculatorConfigValidate(Patch):
    """transformers >= 5.4 ``save_pretrained`` (configuration_utils.py) calls ``self.validate()``,
    which on speculators 0.3.x's configs resolves to pydantic's ``BaseModel.validate(value)`` first
    in the MRO -> ``config.save_pretrained(dir)``: TypeError missing argument 'value'."""

    id = "speculator-config-validate"
    proof = Proof("fails", T1_STEPS, r"TypeError: BaseModel.validate\(\) missing 1 required positional argument: 'value'", using="save")
    fixes = ("T1",)
    summary = ("config.validate() on a speculators config runs transformers' config validators (as "
               "save_pretrained expects); SpeculatorModelConfig.validate(value) on the class stays pydantic's")
    upstream = ("transformers 5.4 configuration_utils.py save_pretrained -> self.validate() = pydantic "
                "BaseModel.validate -> TypeError: missing 1 required positional argument: 'value'")
    target = f"{SPEC_CONFIG}:{SMC}"
    requires = {"speculators": SPEC_T1, "transformers": ">=5.4"}

    def _pair(self, module: ModuleType) -> tuple[Any, Any]:
        cls = guard.attr(module, SMC)
        base = _pretrained_config(module)
        if "validate" in cls.__dict__:
            raise TargetChanged(f"{SMC} defines validate itself (speculators >= 0.5)")
        for_instance = base.__dict__.get("validate")
        if not inspect.isfunction(for_instance):
            raise TargetChanged(f"{base.__qualname__} defines no validate() method")
        owner = next((k for k in cls.__mro__ if "validate" in k.__dict__), None)
        if owner is None or owner is base:
            raise TargetChanged(f"{SMC}.validate already resolves to {base.__qualname__}.validate")
        for_class = owner.__dict__["validate"]
        if not isinstance(for_class, classmethod):
            raise TargetChanged(f"{owner.__qualname__}.validate, first in {SMC}'s MRO, is not a classmethod")
        return for_instance, for_class

    def check(self, module: ModuleType) -> None:
        self._pair(module)

    def install(self, module: ModuleType, changes: Changes) -> None:
        for_instance, for_class = self._pair(module)
        changes.setattr(getattr(module, SMC), "validate", hf_config.InstanceOrClassMethod(for_instance, for_class))


ATTN_MASK_UTILS = "transformers.modeling_attn_mask_utils"


def _populate_attn_mask_utils(module: ModuleType) -> None:
    from ...shims.attn_mask import prepare_4d_causal_attention_mask

    module.__doc__ = ("spec-compat stand-in for the module transformers 5.24 removed: only "
                      "_prepare_4d_causal_attention_mask, which speculators < 0.5 imports")
    module._prepare_4d_causal_attention_mask = prepare_4d_causal_attention_mask  # type: ignore[attr-defined]


@register
class AttnMaskUtilsModule(Patch):
    """transformers 5.24 removed ``modeling_attn_mask_utils``; speculators 0.3.x/0.4.x
    ``models/eagle.py:24`` imports ``_prepare_4d_causal_attention_mask`` from it and
    ``import speculators`` auto-imports that module -> ModuleNotFoundError."""

    id = "attn-mask-utils-module"
    proof = Proof("fails", T1_STEPS, r"ModuleNotFoundError: No module named 'transformers.modeling_attn_mask_utils'", using="import")
    fixes = ("T1",)
    summary = ("transformers.modeling_attn_mask_utils importable again (only when transformers lacks it), "
               "with a _prepare_4d_causal_attention_mask of the same mask contract")
    upstream = ("transformers 5.24 removed modeling_attn_mask_utils; speculators models/eagle.py:24 imports it "
                "-> import speculators: ModuleNotFoundError")
    target = "transformers:__version__"  # the package: the stand-in is served from then on
    requires = {"speculators": SPEC_T1, "transformers": ">=5.24"}

    def check(self, module: ModuleType) -> None:
        try:
            spec = importlib.util.find_spec(ATTN_MASK_UTILS)
        except (ImportError, ValueError) as exc:
            raise TargetChanged(f"cannot look up {ATTN_MASK_UTILS}: {exc}") from None
        if spec is not None:
            raise TargetChanged(f"transformers ships {ATTN_MASK_UTILS} ({spec.origin})")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.attn_mask import StandInFinder

        finder = StandInFinder(ATTN_MASK_UTILS, _populate_attn_mask_utils)
        sys.meta_path.append(finder)
        changes.on_undo(finder.remove)
