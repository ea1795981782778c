"""T1 (see :mod:`._transformers5`): speculators' config subclasses keep the pydantic ``__init__``
they inherit."""

from __future__ import annotations

import inspect
import sys
from types import ModuleType

from ...core.proof import Proof, T1_STEPS
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims import hf_config
from .. import _guards as guard
from ._transformers5 import SMC, SPEC_CONFIG, SPEC_T1, pretrained_config


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
        base = pretrained_config(module)
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
        injector = inspect.getfile(sys.modules[pretrained_config(module).__module__])
        changes.setattr(cls, "__init_subclass__", hf_config.keep_inherited_init(cls))
        # subclasses built before this patch (speculators imported before spec_compat)
        stack = list(cls.__subclasses__())
        while stack:
            sub = stack.pop()
            stack.extend(sub.__subclasses__())
            if hf_config.injected_init(sub, injector):
                changes.delattr(sub, "__init__")
