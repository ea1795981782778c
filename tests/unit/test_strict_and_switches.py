"""SPEC_COMPAT_STRICT, SPEC_COMPAT_DISABLE and registration checks."""

from __future__ import annotations

import importlib

import pytest

from spec_compat.core import switches
from spec_compat.core.registry import Changes, PatchError, Patch, Registry, Status, TargetChanged
from spec_compat.core.switches import SwitchError


class Thing:
    pass


def changed(module):
    raise TargetChanged("Thing lost its frobnicate()")


def half_way(module, changes: Changes):
    changes.setattr(module, "Thing", "replaced")
    raise ValueError("exploded half-way")


# -- strict ------------------------------------------------------------------

@pytest.mark.parametrize("value", ["1", "true", "TRUE", " yes ", "on"])
def test_strict_target_changed_raises(value, registry, fake_module, make_patch):
    mod = fake_module(Thing=Thing)
    p = make_patch(f"{mod.__name__}:Thing", check=changed)

    with pytest.raises(PatchError) as exc:
        registry.apply(environ={"SPEC_COMPAT_STRICT": value})

    msg = str(exc.value)
    assert p.id in msg and "target-changed" in msg and "Thing lost its frobnicate()" in msg
    assert registry.status(p.id) is Status.TARGET_CHANGED
    assert mod.Thing is Thing and p.calls == []


def test_strict_missing_attribute_raises(registry, fake_module, make_patch):
    mod = fake_module()
    p = make_patch(f"{mod.__name__}:Gone")
    with pytest.raises(PatchError, match=f"{p.id} is target-changed: .*has no attribute 'Gone'"):
        registry.apply(environ={"SPEC_COMPAT_STRICT": "1"})


def test_strict_failed_raises_after_rollback(registry, fake_module, make_patch, monkeypatch):
    monkeypatch.setenv("SPEC_COMPAT_STRICT", "1")
    mod = fake_module(Thing=Thing)
    p = make_patch(f"{mod.__name__}:Thing", install=half_way)

    with pytest.raises(PatchError) as exc:
        registry.apply()

    msg = str(exc.value)
    assert p.id in msg and "failed" in msg and "ValueError: exploded half-way" in msg
    assert registry.status(p.id) is Status.FAILED
    assert mod.Thing is Thing


def test_strict_does_not_raise_for_applied_not_needed_disabled(registry, fake_module, make_patch, versions):
    versions({"vllm": "0.10.0"})
    mod = fake_module(Thing=Thing)
    a = make_patch(f"{mod.__name__}:Thing")
    b = make_patch(f"{mod.__name__}:Thing", requires={"vllm": ">=0.12"})
    c = make_patch(f"{mod.__name__}:Thing", check=changed)
    registry.apply(environ={"SPEC_COMPAT_STRICT": "1", "SPEC_COMPAT_DISABLE": c.id})
    assert [registry.status(x.id) for x in (a, b, c)] == [Status.APPLIED, Status.NOT_NEEDED, Status.DISABLED]


@pytest.mark.parametrize("value", ["", "0", "false", "No", "off"])
def test_not_strict_records_without_raising(value, registry, fake_module, make_patch):
    mod = fake_module(Thing=Thing)
    p = make_patch(f"{mod.__name__}:Thing", check=changed)
    q = make_patch(f"{mod.__name__}:Thing", install=half_way)
    registry.apply(environ={"SPEC_COMPAT_STRICT": value})
    assert registry.status(p.id) is Status.TARGET_CHANGED
    assert registry.status(q.id) is Status.FAILED


def test_strict_pending_patch_raises_at_import(registry, make_patch, module_file):
    """Strict mode reaches patches resolved by the post-import hook: the import fails."""
    name = module_file("X = 1\n")
    p = make_patch(f"{name}:Y")
    registry.apply(environ={"SPEC_COMPAT_STRICT": "1"})
    assert registry.status(p.id) is Status.PENDING
    with pytest.raises(PatchError, match=p.id):
        importlib.import_module(name)
    assert registry.status(p.id) is Status.TARGET_CHANGED


@pytest.mark.parametrize("value", ["maybe", "2", "enabled", "1,0"])
def test_malformed_strict_raises_switch_error(value, registry, fake_module, make_patch):
    mod = fake_module(Thing=Thing)
    p = make_patch(f"{mod.__name__}:Thing")
    with pytest.raises(SwitchError, match="SPEC_COMPAT_STRICT"):
        switches.strict({"SPEC_COMPAT_STRICT": value})
    with pytest.raises(SwitchError, match="SPEC_COMPAT_STRICT") as exc:
        registry.apply(environ={"SPEC_COMPAT_STRICT": value})
    assert repr(value) in str(exc.value)
    assert isinstance(exc.value, ValueError)
    assert registry.records() == [] and p.calls == []   # nothing decided


def test_malformed_strict_from_os_environ(registry, monkeypatch):
    monkeypatch.setenv("SPEC_COMPAT_STRICT", "sometimes")
    with pytest.raises(SwitchError, match="SPEC_COMPAT_STRICT"):
        registry.apply()


# -- SPEC_COMPAT_DISABLE -----------------------------------------------------

@pytest.mark.parametrize("value", ["Bad_Id", "a,,b", "*,x", "fake-1,", "-x", "x--y", "x y"])
def test_malformed_disable_raises_switch_error(value, registry, fake_module, make_patch):
    mod = fake_module(Thing=Thing)
    p = make_patch(f"{mod.__name__}:Thing", pid="x")
    with pytest.raises(SwitchError, match="SPEC_COMPAT_DISABLE") as exc:
        registry.apply(environ={"SPEC_COMPAT_DISABLE": value})
    assert "malformed entry" in str(exc.value)
    assert registry.records() == [] and p.calls == []


def test_unknown_disable_id_raises_switch_error(registry, fake_module, make_patch, monkeypatch):
    mod = fake_module(Thing=Thing)
    make_patch(f"{mod.__name__}:Thing", pid="known-one")
    monkeypatch.setenv("SPEC_COMPAT_DISABLE", "known-one, no-such-patch")
    with pytest.raises(SwitchError) as exc:
        registry.apply()
    msg = str(exc.value)
    assert "SPEC_COMPAT_DISABLE" in msg and "no-such-patch" in msg and "known-one" in msg
    assert registry.records() == []


def test_disabled_ids_parsing():
    known = {"a-b", "c", "d-1"}
    assert switches.disabled_ids(known, {}) == frozenset()
    assert switches.disabled_ids(known, {"SPEC_COMPAT_DISABLE": "   "}) == frozenset()
    assert switches.disabled_ids(known, {"SPEC_COMPAT_DISABLE": " * "}) == frozenset(known)
    assert switches.disabled_ids(known, {"SPEC_COMPAT_DISABLE": "a-b, c"}) == {"a-b", "c"}


# -- registration ------------------------------------------------------------

def _cls(**attrs):
    base = {"id": "ok-id", "summary": "s", "upstream": "u", "target": "m:a"}
    base.update(attrs)
    return type("P", (Patch,), base)


@pytest.mark.parametrize("attrs, match", [
    ({"id": "Not_Kebab"}, "kebab-case"),
    ({"id": ""}, "kebab-case"),
    ({"summary": ""}, "missing summary"),
    ({"upstream": None}, "missing upstream"),
    ({"target": ""}, "missing target"),
    ({"requires": {"vllm": "banana"}}, "invalid version range"),
])
def test_register_rejects_malformed_patches(attrs, match):
    reg = Registry()
    with pytest.raises(ValueError, match=match):
        reg.register(_cls(**attrs))
    assert reg.patches() == []


def test_register_rejects_duplicate_id():
    reg = Registry()
    reg.register(_cls())
    with pytest.raises(ValueError, match="duplicate patch id 'ok-id'"):
        reg.register(_cls())
    assert len(reg.patches()) == 1 and reg.get("ok-id").target == "m:a"


# -- value switches: declared by the patches that read them ------------------

def test_every_value_switch_is_declared_by_a_patch():
    """Each value switch names a patch in its error (the patch's ``reads``), and no patch
    declares a variable that is not a value switch (``claim`` refuses it at registration)."""
    from spec_compat import REGISTRY

    declared = {var for patch in REGISTRY.patches() for var in patch.reads}
    assert declared == set(switches.SWITCHES)
    for var in switches.SWITCHES:
        assert switches.readers(var), var


def test_a_declared_switch_names_its_patch_and_an_unknown_one_is_refused(monkeypatch):
    monkeypatch.setattr(switches, "_READERS", {})
    reg = Registry()
    with pytest.raises(ValueError, match="reads = \\('SPEC_COMPAT_NO_SUCH'"):
        reg.register(_cls(reads=("SPEC_COMPAT_NO_SUCH",)))
    env = {switches.DRIVER_WAIT_VAR: "nap"}
    with pytest.raises(SwitchError, match="^SPEC_COMPAT_DRIVER_WAIT='nap': expected"):
        switches.value(switches.DRIVER_WAIT_VAR, env)  # declared by no patch: the variable alone
    reg.register(_cls(id="reads-wait", reads=(switches.DRIVER_WAIT_VAR,)))
    with pytest.raises(SwitchError, match=r"^spec_compat\[reads-wait\]: SPEC_COMPAT_DRIVER_WAIT='nap': expected"):
        switches.value(switches.DRIVER_WAIT_VAR, env)


def test_wanted_early_is_the_registrys_disable_and_range_decision():
    """What vLLM's platform plugin asks before the registry applies (spec_compat/plugin.py)."""
    on = _cls(requires={"vllm": ">=0.10"})
    versions = {"vllm": "0.11.0"}
    assert on().needed(versions)[0]
    assert not _cls(requires={"vllm": "<0.1"}).wanted_early({})  # the installed vLLM (or none) is outside
    assert not on.wanted_early({"SPEC_COMPAT_DISABLE": "ok-id"})
    assert not on.wanted_early({"SPEC_COMPAT_DISABLE": "*"})
    anything = _cls()  # no range: needed wherever it is
    assert anything.wanted_early({}) and anything.wanted_early({"SPEC_COMPAT_DISABLE": "other-id"})
