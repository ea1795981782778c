"""T1: speculators' pydantic config classes on transformers >= 5.4, where
``PreTrainedConfig`` became a (strict) dataclass.

speculators 0.3.x declares ``SpeculatorModelConfig(PydanticClassRegistryMixin,
PretrainedConfig)``: one class that is both a pydantic model and a transformers
config.  Three things of the dataclass ``PreTrainedConfig`` meet pydantic there:

* its field annotations (``dtype: str | torch.dtype | None``) name modules that
  ``transformers.configuration_utils`` imports only under ``TYPE_CHECKING``;
  pydantic evaluates every annotation of every base and cannot resolve them;
* its ``__init_subclass__`` turns every subclass into a dataclass and gives one
  without an ``__init__`` of its own a generated one, which replaces the
  pydantic ``__init__`` the subclass inherited;
* its ``validate()`` (run by ``save_pretrained``) is shadowed by pydantic's
  deprecated ``BaseModel.validate(value)`` classmethod, which comes first in the MRO.

The helpers here are pure Python (no torch / transformers / pydantic import);
the T1 units of :mod:`spec_compat.patches.training` (``pretrained_config_annotations``,
``speculator_config_own_init``, ``speculator_config_validate``) apply them.
"""

from __future__ import annotations

import ast
import builtins
import sys
import typing
from collections.abc import Iterable, Iterator
from typing import Any


def annotation_names(annotation: str) -> set[str]:
    """Top-level names an annotation string refers to (``"str | torch.dtype"`` -> {str, torch})."""
    try:
        tree = ast.parse(annotation, mode="eval")
    except SyntaxError:
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def forward_strings(annotation: Any, _depth: int = 0) -> Iterator[str]:
    """The unevaluated parts of an annotation: the whole string under
    ``from __future__ import annotations`` (transformers >= 5.5), or the forward
    references nested in an evaluated one (``Union[str, "torch.dtype"] | None``, 5.4)."""
    if isinstance(annotation, str):
        yield annotation
    elif isinstance(annotation, typing.ForwardRef):
        yield annotation.__forward_arg__
    elif _depth < 20:
        origin = typing.get_origin(annotation)
        if origin is typing.Literal:
            return  # its strings are values, not references
        args = typing.get_args(annotation)
        for arg in args[:1] if origin is typing.Annotated else args:
            yield from forward_strings(arg, _depth + 1)


def unresolved_annotation_names(classes: Iterable[type]) -> dict[str, set[str]]:
    """For each module defining one of ``classes``: the names its unevaluated
    annotations use that neither the module's globals nor builtins define (what
    pydantic cannot evaluate when it collects the fields of a subclass)."""
    missing: dict[str, set[str]] = {}
    for cls in classes:
        annotations = cls.__dict__.get("__annotations__") or {}
        module = sys.modules.get(cls.__module__)
        namespace = vars(module) if module is not None else {}
        for annotation in annotations.values():
            for name in {n for text in forward_strings(annotation) for n in annotation_names(text)}:
                if name not in namespace and not hasattr(builtins, name):
                    missing.setdefault(cls.__module__, set()).add(name)
    return missing


def code_file(fn: Any) -> str | None:
    code = getattr(fn, "__code__", None)
    return getattr(code, "co_filename", None)


def injected_init(cls: type, injector_file: str) -> bool:
    """Whether ``cls`` carries an ``__init__`` whose code lives in ``injector_file``
    (transformers' configuration_utils.py): one generated for it, not its own."""
    init = cls.__dict__.get("__init__")
    return init is not None and code_file(init) == injector_file


def keep_inherited_init(owner: type) -> classmethod:
    """An ``__init_subclass__`` for ``owner``: runs the bases' ``__init_subclass__``
    as before, then drops an ``__init__`` that they put on a subclass which did not
    define one, so the subclass keeps the ``__init__`` it inherits (``owner``'s or an
    intermediate class's).  A subclass's own ``__init__`` is never touched."""

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        own = "__init__" in cls.__dict__
        super(owner, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
        if not own and "__init__" in cls.__dict__:
            delattr(cls, "__init__")

    __init_subclass__.__qualname__ = f"{owner.__qualname__}.__init_subclass__"
    __init_subclass__.__spec_compat__ = True  # type: ignore[attr-defined]
    return classmethod(__init_subclass__)


class InstanceOrClassMethod:
    """A descriptor giving one name two meanings, as the MRO of a class with two
    bases that both define it should have: called on an instance it is
    ``for_instance`` (a plain function, e.g. transformers' ``PreTrainedConfig.validate``),
    looked up on the class it is ``for_class`` (a classmethod, e.g. pydantic's
    ``BaseModel.validate``)."""

    __spec_compat__ = True

    def __init__(self, for_instance: Any, for_class: Any) -> None:
        self.for_instance = for_instance
        self.for_class = for_class

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self.for_class.__get__(None, owner)
        return self.for_instance.__get__(obj, owner)

    def __repr__(self) -> str:
        return f"<spec_compat: instance -> {self.for_instance!r}, class -> {self.for_class!r}>"


def declares_remote_config(path: Any) -> bool:
    """Whether ``path/config.json`` names its own ``AutoConfig`` class (``auto_map``): a config
    that only loads with ``trust_remote_code`` (Kimi-K2.5's)."""
    import json
    from pathlib import Path

    try:
        data = json.loads((Path(str(path)) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False
    return isinstance(data.get("auto_map"), dict) and "AutoConfig" in data["auto_map"]
