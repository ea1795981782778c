"""shims.swap.swapped: one attribute swapped for one call (a module global or one instance's own)."""

from __future__ import annotations

import types

import pytest

from spec_compat.shims.swap import swapped


def _module() -> types.ModuleType:
    mod = types.ModuleType("m")
    exec("torch = 'real'\ndef seen():\n    return torch\n", mod.__dict__)
    return mod


def test_module_global_as_its_functions_see_it_then_restored():
    mod = _module()
    with swapped(mod, "torch", "view") as value:
        assert value == "view" and mod.seen() == "view"
    assert mod.seen() == "real"


def test_restored_when_the_call_raises():
    mod = _module()
    with pytest.raises(RuntimeError), swapped(mod, "torch", "view"):
        raise RuntimeError("boom")
    assert mod.torch == "real"


def test_instance_attribute_in_front_of_the_class_then_gone():
    class Layer:
        def to_empty(self):
            return "class"

    layer, other = Layer(), Layer()
    with swapped(layer, "to_empty", lambda: "instance"):
        assert layer.to_empty() == "instance" and other.to_empty() == "class"
    assert "to_empty" not in vars(layer) and layer.to_empty() == "class"


def test_a_replacement_made_meanwhile_is_left_alone():
    mod = _module()
    with swapped(mod, "torch", "view"):
        mod.torch = "someone else's"
    assert mod.torch == "someone else's"


def test_nested_swaps_unwind_in_order():
    mod = _module()
    with swapped(mod, "torch", "outer"):
        with swapped(mod, "torch", "inner"):
            assert mod.seen() == "inner"
        assert mod.seen() == "outer"
    assert mod.seen() == "real"
