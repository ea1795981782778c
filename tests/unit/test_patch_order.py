"""Patches that wrap one attribute declare their order (``Patch.after``): the registry installs
them in that order whatever their registration order, and refuses a second patch on an
attribute another applied patch replaced when neither declares the order (the later one is
``failed``, rolled back: its target keeps the first patch's value)."""

from __future__ import annotations

import types

import pytest

from spec_compat import REGISTRY
from spec_compat import patches  # noqa: F401  (registers every patch)
from spec_compat.core.registry import Changes, Patch, Registry, Status


def _wrapping(pid: str, module: types.ModuleType, after: tuple[str, ...] = ()) -> type[Patch]:
    """A patch that wraps ``module.f``, appending its id to what ``f`` returns."""

    class P(Patch):
        id = pid
        summary = upstream = "test"
        target = f"{module.__name__}:f"

        def install(self, mod: types.ModuleType, changes: Changes) -> None:
            inner = mod.f
            changes.setattr(mod, "f", lambda: [*inner(), pid])

    P.after = after
    return P


def test_declared_order_wins_over_registration_order(registry: Registry, fake_module):
    mod = fake_module(f=lambda: [])
    registry.register(_wrapping("outer-wrap", mod, after=("inner-wrap",)))  # registered first
    registry.register(_wrapping("inner-wrap", mod))
    registry.apply(environ={})
    assert [p.id for p in registry.ordered()] == ["inner-wrap", "outer-wrap"]
    assert mod.f() == ["inner-wrap", "outer-wrap"]
    assert {r.status for r in registry.records()} == {Status.APPLIED}


def test_an_undeclared_stack_is_refused_and_rolled_back(registry: Registry, fake_module):
    mod = fake_module(f=lambda: [])
    registry.register(_wrapping("first-wrap", mod))
    registry.register(_wrapping("second-wrap", mod))
    registry.apply(environ={})
    assert registry.status("first-wrap") is Status.APPLIED
    rec = {r.id: r for r in registry.records()}["second-wrap"]
    assert rec.status is Status.FAILED
    assert "which patch first-wrap replaced first, without a declared order" in rec.reason
    assert "after = ('first-wrap',)" in rec.reason
    assert mod.f() == ["first-wrap"]  # the refused patch left nothing behind


def test_an_undeclared_stack_is_allowed_when_the_first_patch_is_off(registry: Registry, fake_module):
    mod = fake_module(f=lambda: [])
    registry.register(_wrapping("first-wrap", mod))
    registry.register(_wrapping("second-wrap", mod))
    registry.apply(environ={"SPEC_COMPAT_DISABLE": "first-wrap"})
    assert registry.status("second-wrap") is Status.APPLIED and mod.f() == ["second-wrap"]


def test_order_is_transitive_and_cycles_are_refused(registry: Registry, fake_module):
    mod = fake_module(f=lambda: [])
    registry.register(_wrapping("a-wrap", mod))
    registry.register(_wrapping("b-wrap", mod, after=("a-wrap",)))
    registry.register(_wrapping("c-wrap", mod, after=("b-wrap",)))
    registry.apply(environ={"SPEC_COMPAT_DISABLE": "b-wrap"})  # c wraps a directly: declared through b
    assert mod.f() == ["a-wrap", "c-wrap"]
    looped = Registry()
    looped.register(_wrapping("x-wrap", mod, after=("y-wrap",)))
    looped.register(_wrapping("y-wrap", mod, after=("x-wrap",)))
    with pytest.raises(ValueError, match="form a cycle"):
        looped.ordered()


def test_after_must_name_other_patches(registry: Registry, fake_module):
    mod = fake_module(f=lambda: [])
    with pytest.raises(ValueError, match="must name other patches"):
        registry.register(_wrapping("self-wrap", mod, after=("self-wrap",)))


def test_every_declared_after_names_a_registered_patch():
    ids = {p.id for p in REGISTRY.patches()}
    for p in REGISTRY.patches():
        assert set(p.after) <= ids, f"{p.id}: after = {p.after} names unknown ids"
