"""Changes.wrap: wrapt function wrappers installed through the undo log; Patch.depends_on."""

from __future__ import annotations

import pickle
import types

import pytest

from spec_compat.core.changes import Changes
from spec_compat.core.registry import Patch, Registry


def plain(x, y=1):
    """doc of plain"""
    return x + y


class Target:
    def method(self, x):
        return ("method", self.tag, x)

    @classmethod
    def cm(cls, x):
        return ("cm", cls.__name__, x)

    @staticmethod
    def sm(x):
        return ("sm", x)

    tag = "t"


def test_wrap_function_in_a_module_then_undo():
    mod = types.ModuleType("m")
    mod.plain = plain
    seen = []

    def wrapper(wrapped, instance, args, kwargs):
        seen.append((instance, args, kwargs))
        return wrapped(*args, **kwargs) * 10

    ch = Changes("p")
    ch.wrap(mod, "plain", wrapper)
    assert mod.plain(2, y=3) == 50 and seen == [(None, (2,), {"y": 3})]
    assert mod.plain.__doc__ == "doc of plain" and mod.plain.__name__ == "plain"
    ch.undo()
    assert mod.plain is plain


@pytest.mark.parametrize("name, call, instance_kind", [
    ("method", lambda: Target().method(5), Target),
    ("method", lambda: Target.method(Target(), 5), Target),  # called through the class
    ("cm", lambda: Target.cm(5), type),
    ("sm", lambda: Target.sm(5), type(None)),
])
def test_wrap_methods_see_the_instance(name, call, instance_kind):
    before = Target.__dict__[name]
    expected = call()
    got = []

    def wrapper(wrapped, instance, args, kwargs):
        got.append(instance)
        assert args == (5,) and kwargs == {}
        return wrapped(*args, **kwargs)

    ch = Changes("p")
    ch.wrap(Target, name, wrapper)
    assert call() == expected
    assert len(got) == 1 and isinstance(got[0], instance_kind)
    ch.undo()
    assert Target.__dict__[name] is before


def test_undo_leaves_a_later_replacement_alone(caplog):
    mod = types.ModuleType("m")
    mod.plain = plain
    ch = Changes("p")
    ch.wrap(mod, "plain", lambda w, i, a, k: w(*a, **k))
    mod.plain = len
    ch.undo()
    assert mod.plain is len and "replaced by someone else" in caplog.text


def test_a_wrapped_function_does_not_pickle():
    """wrapt's limit, pinned so that it is known: a FunctionWrapper refuses pickling.  A target
    that vLLM pickles to its workers (a function sent by reference) keeps ``Changes.setattr``
    with a plain function (docs/design/wrapt.md)."""
    mod = types.ModuleType("m")
    mod.plain = plain
    ch = Changes("p")
    ch.wrap(mod, "plain", lambda w, i, a, k: w(*a, **k))
    with pytest.raises(NotImplementedError, match="__reduce"):
        pickle.dumps(mod.plain)
    ch.undo()
    assert pickle.loads(pickle.dumps(mod.plain)) is plain


class _Reader(Patch):
    id = "reader"
    summary = upstream = "x"
    target = "json:dumps"
    depends_on = ("other",)


class _Other(Patch):
    id = "other"
    summary = upstream = "x"
    target = "json:loads"


class _Undeclared(Patch):
    id = "undeclared"
    summary = upstream = "x"
    target = "json:dumps"


def test_depends_on_reads_the_registry_not_the_environment():
    reg = Registry()
    for cls in (_Reader, _Other, _Undeclared):
        reg.register(cls)
    reader = reg.get("reader")
    reg.apply({"SPEC_COMPAT_DISABLE": ""})
    assert reader.uses("other") is True
    reg.revert()
    reg.apply({"SPEC_COMPAT_DISABLE": "other"})
    assert reader.uses("other") is False
    with pytest.raises(ValueError, match="without declaring it in depends_on"):
        reg.get("undeclared").uses("other")
    reg.revert()


def test_depends_on_names_declared_patches_and_an_absent_one_is_off():
    """In the global registry every depends_on id is a declared patch; a registry that does not
    hold the dependency (a test's registry with one patch) answers 'off'."""
    from spec_compat import REGISTRY

    ids = {p.id for p in REGISTRY.patches()}
    for p in REGISTRY.patches():
        assert set(p.depends_on) <= ids, (p.id, p.depends_on)
    reg = Registry()
    reg.register(_Reader)
    reg.apply({})
    assert reg.get("reader").uses("other") is False
    reg.revert()
