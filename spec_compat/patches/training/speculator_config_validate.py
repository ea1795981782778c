"""T1 (see :mod:`._transformers5`): ``config.validate()`` on speculators' configs is transformers'
again."""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

from ...core.proof import Proof, T1_STEPS
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims import hf_config
from .. import _guards as guard
from ._transformers5 import SMC, SPEC_CONFIG, SPEC_T1, pretrained_config


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
        base = pretrained_config(module)
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
