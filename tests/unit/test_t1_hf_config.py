"""T1 shims with stand-ins for transformers' dataclass PreTrainedConfig and
pydantic's BaseModel (nothing heavy is imported): annotation names, the kept
``__init__``, the two-way ``validate`` and the stand-in module finder."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import typing
from typing import Annotated, Literal, Optional, Union

import pytest

from spec_compat.patches.training import attn_mask_utils_module, pretrained_config_annotations
from spec_compat.patches.training.attn_mask_utils_module import AttnMaskUtilsModule, StandInFinder
from spec_compat.patches.training.pretrained_config_annotations import PretrainedConfigAnnotations
from spec_compat.patches.training.speculator_config_own_init import SpeculatorConfigOwnInit
from spec_compat.patches.training.speculator_config_validate import SpeculatorConfigValidate
from spec_compat.core.registry import Changes, TargetChanged
from spec_compat.shims import hf_config

# -- annotations --------------------------------------------------------------------


def test_annotation_names_of_a_string():
    assert hf_config.annotation_names("str | torch.dtype | None") == {"str", "torch"}  # None is a constant
    assert hf_config.annotation_names('Literal["regression", "x"] | None') == {"Literal"}
    assert hf_config.annotation_names("not valid (") == set()


def test_forward_strings_finds_nested_references_but_not_literal_values():
    assert list(hf_config.forward_strings("str | torch.dtype")) == ["str | torch.dtype"]
    assert list(hf_config.forward_strings(Union[str, "torch.dtype"] | None)) == ["torch.dtype"]  # noqa: F821 (5.4 shape)
    assert list(hf_config.forward_strings(Optional[list["Foo"]])) == ["Foo"]  # noqa: F821
    assert list(hf_config.forward_strings(Literal["regression", "single_label"] | None)) == []
    assert list(hf_config.forward_strings(Annotated[int, "metadata"])) == []
    assert list(hf_config.forward_strings(int)) == []


CONFIG_MODULE = """
from __future__ import annotations
import dataclasses
from typing import TYPE_CHECKING, ClassVar, Literal

if TYPE_CHECKING:
    import torch

@dataclasses.dataclass
class PreTrainedConfig:
    model_type: ClassVar[str] = ""
    dtype: str | torch.dtype | None = None
    problem_type: Literal["regression", "single_label_classification"] | None = None
"""


def test_unresolved_annotation_names(module_file):
    mod = importlib.import_module(module_file(CONFIG_MODULE))
    assert hf_config.unresolved_annotation_names([mod.PreTrainedConfig]) == {mod.__name__: {"torch"}}
    mod.torch = object()
    assert hf_config.unresolved_annotation_names([mod.PreTrainedConfig]) == {}


@pytest.fixture
def fake_torch(fake_module, monkeypatch):
    """A stand-in for ``torch`` that the annotations patch imports instead."""
    torch = fake_module(dtype=type("dtype", (), {}))
    monkeypatch.setitem(pretrained_config_annotations.PROVIDED, "torch", torch.__name__)
    return torch


def test_annotations_patch_binds_the_name_and_undoes(module_file, fake_torch):
    mod = importlib.import_module(module_file(CONFIG_MODULE))
    patch = PretrainedConfigAnnotations()
    patch.check(mod)
    with pytest.raises(NameError):
        typing.get_type_hints(mod.PreTrainedConfig)
    changes = Changes(patch.id)
    patch.install(mod, changes)
    assert mod.torch is fake_torch
    assert typing.get_type_hints(mod.PreTrainedConfig)["dtype"] == str | fake_torch.dtype | None
    changes.undo()
    assert "torch" not in vars(mod)


def test_annotations_patch_guards(module_file, fake_torch):
    patch = PretrainedConfigAnnotations()
    not_dc = importlib.import_module(module_file(CONFIG_MODULE.replace("@dataclasses.dataclass\n", "")))
    with pytest.raises(TargetChanged, match="not a dataclass"):
        patch.check(not_dc)
    other = importlib.import_module(module_file(CONFIG_MODULE.replace("torch.dtype", "torch.dtype | np.dtype")))
    with pytest.raises(TargetChanged, match="name np, which this shim does not provide"):
        patch.check(other)
    resolved = importlib.import_module(module_file(CONFIG_MODULE))
    resolved.torch = fake_torch
    with pytest.raises(TargetChanged, match="resolves already"):
        patch.check(resolved)


# -- __init__ and validate -------------------------------------------------------------

# PretrainedConfig as transformers >= 5.4 shapes it (a dataclass whose __init_subclass__
# generates an __init__ for subclasses without one, and an instance validate()), and a
# pydantic-like base whose validate is a classmethod; SpeculatorModelConfig as speculators
# 0.3.0 declares it (both bases, pydantic first, its own __init__).
SPECULATORS_CONFIG = """
import dataclasses

class BaseModel:
    def __init__(self, **data):
        self.__dict__.update(data)
        self.built_by = "pydantic"

    @classmethod
    def validate(cls, value):
        return ("pydantic", cls.__name__, value)

@dataclasses.dataclass
class PretrainedConfig:
    dtype: str = "float32"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = "__init__" in cls.__dict__
        dataclasses.dataclass(cls)
        if not own:
            def __init__(self, **kwargs):
                self.built_by = "generated"
            cls.__init__ = __init__

    def validate(self):
        return ("transformers", type(self).__name__)

class SpeculatorModelConfig(BaseModel, PretrainedConfig):
    def __init__(self, **kwargs):
        BaseModel.__init__(self, **kwargs)
"""


@pytest.fixture
def spec_config(module_file):
    return importlib.import_module(module_file(SPECULATORS_CONFIG))


def test_stand_in_reproduces_the_failure_shape(spec_config):
    class Eagle3(spec_config.SpeculatorModelConfig):
        pass

    assert Eagle3().built_by == "generated"  # the pydantic __init__ was replaced
    with pytest.raises(TypeError, match="value"):
        Eagle3().validate()  # pydantic's classmethod, first in the MRO


def test_own_init_kept_for_new_and_existing_subclasses(spec_config):
    smc = spec_config.SpeculatorModelConfig

    class Before(smc):
        pass

    patch = SpeculatorConfigOwnInit()
    patch.check(spec_config)
    changes = Changes(patch.id)
    patch.install(spec_config, changes)

    class Eagle3(smc):
        pass

    class Custom(smc):
        def __init__(self, **kwargs):
            smc.__init__(self, **kwargs)
            self.built_by = "custom"

    class UnderCustom(Custom):
        pass

    assert Eagle3(x=1).built_by == "pydantic" and Eagle3(x=1).x == 1
    assert Custom().built_by == "custom"
    assert UnderCustom().built_by == "custom"  # the nearest inherited __init__, not the base's
    assert Before().built_by == "pydantic"  # repaired at install
    assert hf_config.injected_init(Eagle3, spec_config.__file__) is False

    changes.undo()
    assert "__init_subclass__" not in vars(smc)
    assert Before().built_by == "generated"  # put back as it was

    class After(smc):
        pass

    assert After().built_by == "generated"


def test_own_init_guards(module_file):
    patch = SpeculatorConfigOwnInit()
    fixed = importlib.import_module(module_file(SPECULATORS_CONFIG + """
def _keep(cls, **kw):
    super(SpeculatorModelConfig, cls).__init_subclass__(**kw)
SpeculatorModelConfig.__init_subclass__ = classmethod(_keep)
"""))
    with pytest.raises(TargetChanged, match="defines __init_subclass__ itself"):
        patch.check(fixed)
    no_init = importlib.import_module(module_file(SPECULATORS_CONFIG + "\ndel SpeculatorModelConfig.__init__\n"))
    with pytest.raises(TargetChanged, match="no __init__ of its own"):
        patch.check(no_init)
    old_tf = importlib.import_module(module_file(
        SPECULATORS_CONFIG.replace("@dataclasses.dataclass\nclass PretrainedConfig", "class PretrainedConfig")))
    with pytest.raises(TargetChanged, match="not a dataclass"):
        patch.check(old_tf)


def test_validate_dispatches_on_instance_or_class(spec_config):
    smc = spec_config.SpeculatorModelConfig
    patch = SpeculatorConfigValidate()
    patch.check(spec_config)
    changes = Changes(patch.id)
    patch.install(spec_config, changes)

    class Eagle3(smc):
        def __init__(self, **kwargs):
            smc.__init__(self, **kwargs)

    assert Eagle3().validate() == ("transformers", "Eagle3")
    assert smc().validate() == ("transformers", "SpeculatorModelConfig")
    assert Eagle3.validate({"a": 1}) == ("pydantic", "Eagle3", {"a": 1})
    assert smc.validate(3) == ("pydantic", "SpeculatorModelConfig", 3)
    changes.undo()
    assert "validate" not in vars(smc)
    with pytest.raises(TypeError):
        Eagle3().validate()


def test_validate_guards(module_file):
    patch = SpeculatorConfigValidate()
    own = importlib.import_module(module_file(SPECULATORS_CONFIG + "\nSpeculatorModelConfig.validate = lambda self: None\n"))
    with pytest.raises(TargetChanged, match="defines validate itself"):
        patch.check(own)
    no_tf_validate = importlib.import_module(module_file(SPECULATORS_CONFIG + "\ndel PretrainedConfig.validate\n"))
    with pytest.raises(TargetChanged, match="defines no validate"):
        patch.check(no_tf_validate)
    first = importlib.import_module(module_file(SPECULATORS_CONFIG + "\ndel BaseModel.validate\n"))
    with pytest.raises(TargetChanged, match="already resolves to PretrainedConfig.validate"):
        patch.check(first)
    plain = importlib.import_module(module_file(SPECULATORS_CONFIG + "\nBaseModel.validate = lambda self, v: v\n"))
    with pytest.raises(TargetChanged, match="not a classmethod"):
        patch.check(plain)


# -- stand-in module ---------------------------------------------------------------------


def test_stand_in_finder_serves_only_a_missing_module(fake_module, module_file):
    parent = fake_module()
    parent.__path__ = []  # a package with nothing in it
    name = f"{parent.__name__}.removed"
    finder = StandInFinder(name, lambda m: setattr(m, "helper", 42))
    sys.meta_path.append(finder)
    try:
        mod = importlib.import_module(name)
        assert mod.helper == 42 and finder.served() is mod and parent.removed is mod
        assert importlib.util.find_spec(name).origin == "spec-compat stand-in"
    finally:
        finder.remove()
    assert finder not in sys.meta_path and name not in sys.modules and not hasattr(parent, "removed")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)

    real = module_file("x = 'real'\n")
    finder = StandInFinder(real, lambda m: setattr(m, "x", "stand-in"))
    sys.meta_path.append(finder)
    try:
        assert importlib.import_module(real).x == "real"  # a finder before it answers first
        assert finder.served() is None
    finally:
        finder.remove()
    assert sys.modules[real].x == "real"  # left alone


def test_attn_mask_patch_declines_when_transformers_ships_the_module(fake_module, monkeypatch):
    parent = fake_module()
    parent.__path__ = []
    present = fake_module()
    monkeypatch.setattr(attn_mask_utils_module, "ATTN_MASK_UTILS", present.__name__)
    present.__spec__ = importlib.machinery.ModuleSpec(present.__name__, None, origin="/somewhere/real.py")
    with pytest.raises(TargetChanged, match="transformers ships"):
        AttnMaskUtilsModule().check(parent)
    monkeypatch.setattr(attn_mask_utils_module, "ATTN_MASK_UTILS", f"{parent.__name__}.absent")
    AttnMaskUtilsModule().check(parent)
