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

The T1 units (``pretrained_config_annotations``, ``speculator_config_own_init``,
``speculator_config_validate``, ``attn_mask_utils_module``) share what is here: the speculators
releases, speculators' config module and class, and transformers' config base as that module bound it.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

from ...core.registry import TargetChanged

SPEC_T1 = ">=0.3,<0.5"
SPEC_CONFIG = "speculators.config"
SMC = "SpeculatorModelConfig"


def pretrained_config(module: ModuleType) -> type:
    """transformers' config base as ``speculators.config`` bound it (``PretrainedConfig``)."""
    base = module.__dict__.get("PretrainedConfig")
    if not isinstance(base, type):
        raise TargetChanged(f"{module.__name__} has no PretrainedConfig class bound")
    if not dataclasses.is_dataclass(base):
        raise TargetChanged(f"{base.__module__}.{base.__qualname__} is not a dataclass (transformers < 5.4 shape)")
    return base
