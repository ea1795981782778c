"""T1 (see :mod:`._transformers5`): the names ``PreTrainedConfig``'s field annotations use are
bound where pydantic looks them up."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from types import ModuleType

from ...core.proof import Proof, T1_STEPS
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims import hf_config
from .. import _guards as guard
from ._transformers5 import SPEC_T1

TF_CONFIG = "transformers.configuration_utils"

#: names a transformers annotation may use under TYPE_CHECKING that this patch may
#: bind in the annotating module: name -> module imported for it
PROVIDED = {"torch": "torch"}


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
