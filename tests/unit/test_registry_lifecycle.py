"""Idempotent apply, revert, re-apply, and the undo log (Changes)."""

from __future__ import annotations

import importlib
import logging

import pytest

from spec_compat.core.registry import Changes, Registry, Status



class Base:
    def inherited(self) -> str:
        return "base"


class Thing(Base):
    def value(self) -> str:
        return "original"


def test_apply_twice_installs_once(registry, fake_module, make_patch, set_attr_install):
    mod = fake_module(Thing=Thing)
    p = make_patch(f"{mod.__name__}:Thing", install=set_attr_install("Thing", "patched"))
    first = registry.apply(environ={})
    second = registry.apply(environ={})
    assert len(p.calls) == 1
    assert first == second
    assert mod.Thing == "patched"


def test_revert_restores_originals_by_identity(registry, fake_module, make_patch):
    class Thing(Base):  # local: the test patches the class itself
        def value(self) -> str:
            return "original"

        @staticmethod
        def make() -> str:
            return "static original"

    value, make = Thing.__dict__["value"], Thing.__dict__["make"]
    mod = fake_module(Thing=Thing, helper=len)

    def install(module, changes: Changes):
        changes.setattr(module, "helper", lambda x: 0)
        changes.setattr(module, "brand_new", 1)                       # did not exist
        changes.setattr(Thing, "value", lambda self: "patched")       # own attribute
        changes.setattr(Thing, "inherited", lambda self: "patched")   # shadows Base's
        changes.setattr(Thing, "make", staticmethod(lambda: "static patched"))

    p = make_patch(f"{mod.__name__}:Thing", install=install)
    registry.apply(environ={})
    assert registry.status(p.id) is Status.APPLIED
    t = Thing()
    assert (t.value(), t.inherited(), Thing.make(), mod.helper("abc")) == \
        ("patched", "patched", "static patched", 0)

    registry.revert()

    assert mod.helper is len
    assert not hasattr(mod, "brand_new")
    assert Thing.__dict__["value"] is value
    assert "inherited" not in Thing.__dict__ and Thing.inherited is Base.inherited
    assert Thing.__dict__["make"] is make
    assert (t.value(), t.inherited(), Thing.make()) == ("original", "base", "static original")
    assert registry.records() == [] and registry.status(p.id) is None


def test_apply_revert_apply(registry, fake_module, make_patch, set_attr_install):
    mod = fake_module(Thing=Thing)
    p = make_patch(f"{mod.__name__}:Thing", install=set_attr_install("Thing", "patched"))
    for round_ in (1, 2, 3):
        registry.apply(environ={})
        assert registry.status(p.id) is Status.APPLIED
        assert mod.Thing == "patched"
        assert len(p.calls) == round_
        registry.revert()
        assert mod.Thing is Thing
        assert registry.status(p.id) is None


def test_revert_of_nothing_is_harmless(registry):
    registry.revert()
    registry.revert()
    assert registry.records() == []


def test_revert_ignores_hook_registered_before_revert(registry, make_patch, module_file, set_attr_install):
    name = module_file("""
        def greet():
            return "hello"
    """)
    p = make_patch(f"{name}:greet", install=set_attr_install("greet", lambda: "patched"))
    (rec,) = registry.apply(environ={})
    assert rec.status is Status.PENDING

    registry.revert()
    mod = importlib.import_module(name)

    assert p.calls == []
    assert mod.greet() == "hello"
    assert registry.status(p.id) is None

    # a later apply finds the module imported and installs right away
    registry.apply(environ={})
    assert registry.status(p.id) is Status.APPLIED and mod.greet() == "patched"
    assert len(p.calls) == 1


def test_reapply_after_revert_while_still_pending_installs_once(registry, make_patch, module_file, set_attr_install):
    name = module_file("X = 1\n")
    p = make_patch(f"{name}:X", install=set_attr_install("X", 2))
    registry.apply(environ={})
    registry.revert()
    registry.apply(environ={})       # a new hook; the old one is stale
    assert registry.status(p.id) is Status.PENDING
    mod = importlib.import_module(name)
    assert registry.status(p.id) is Status.APPLIED
    assert len(p.calls) == 1 and mod.X == 2
    registry.revert()
    assert mod.X == 1


def test_registries_are_independent(fake_module, make_patch):
    mod = fake_module(Thing=Thing)
    r1, r2 = Registry(), Registry()
    p1 = make_patch(f"{mod.__name__}:Thing", pid="same-id", reg=r1)
    p2 = make_patch(f"{mod.__name__}:Thing", pid="same-id", reg=r2)
    r1.apply(environ={})
    assert r1.status("same-id") is Status.APPLIED and r2.status("same-id") is None
    assert len(p1.calls) == 1 and p2.calls == []


def test_revert_keeps_going_when_one_undo_fails(registry, fake_module, make_patch, set_attr_install):
    mod = fake_module(Thing=Thing, Other=Thing)
    first = make_patch(f"{mod.__name__}:Thing", install=set_attr_install("Thing", "p1"))

    def bad_undo_install(module, changes: Changes):
        changes.setattr(module, "Other", "p2")
        changes.on_undo(lambda: (_ for _ in ()).throw(OSError("cannot undo")))

    second = make_patch(f"{mod.__name__}:Other", install=bad_undo_install)
    registry.apply(environ={})
    assert registry.status(first.id) is registry.status(second.id) is Status.APPLIED

    with pytest.raises(OSError, match="cannot undo"):
        registry.revert()

    assert mod.Thing is Thing and mod.Other is Thing   # both restored
    assert registry.records() == []
    registry.apply(environ={})                          # and it can be applied again
    assert mod.Thing == "p1"


# -- Changes -----------------------------------------------------------------

def test_changes_undo_in_reverse_order():
    order = []
    ns = type("NS", (), {})()
    c = Changes("t")
    c.setattr(ns, "a", 1)
    c.on_undo(lambda: order.append("hook"))
    c.setattr(ns, "a", 2)
    c.on_undo(lambda: order.append(("a", ns.a)))
    c.undo()
    assert order == [("a", 2), "hook"]
    assert not hasattr(ns, "a")
    c.undo()  # empty: nothing left to undo


def test_changes_leaves_a_foreign_replacement_alone(caplog):
    caplog.set_level(logging.WARNING, logger="spec_compat")
    ns = type("NS", (), {"a": "orig"})
    c = Changes("t")
    c.setattr(ns, "a", "ours")
    ns.a = "theirs"
    c.undo()
    assert ns.a == "theirs"
    assert any("replaced by someone else" in r.getMessage() for r in caplog.records)


def test_changes_undo_continues_after_a_failing_step():
    ns = type("NS", (), {})()
    c = Changes("t")
    c.setattr(ns, "a", 1)
    c.on_undo(lambda: 1 / 0)
    c.setattr(ns, "b", 2)
    with pytest.raises(ZeroDivisionError):
        c.undo()
    assert not hasattr(ns, "a") and not hasattr(ns, "b")
