"""Drift: every registered patch against a mutated copy of its real target.

For each patch of ``REGISTRY.patches()`` and each mutation kind, the patch's own class
(its guard and install, re-pointed at the mutated target, with no version constraint so
that the guard is asked in every environment) is applied:

* ``attr-renamed``      a copy of the real target module with the target attribute renamed;
* ``signature-changed`` the same copy with the target attribute replaced by an object of
                        the same kind with other parameters and none of the original's
                        members or source (class, function, module; a plain value such as
                        ``transformers:__version__`` has no signature: not applicable);
* ``module-missing``    the target module no longer exists where its package is installed
                        (moved): resolved the way ``spec-compat report`` resolves it.

Each case asserts: ``target-changed`` (``signature-changed`` also accepts ``failed`` for
a guard that raised something else, or a guard's own ``not-needed``, with its reason); the
mutated module and object are identical before and after (attributes by identity) and the
real target modules are upstream's own objects throughout; in a registry holding every
other registered patch on its real target, each other patch ends exactly as without the
drift (checked once per patch: with ``attr-renamed``, or ``module-missing`` where the target
is not here);
strict mode raises ``PatchError`` naming the patch id.  ``test_every_patch_covered``
checks that the cases that ran cover every registered id.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from faults_support import PATCHES, RealTargets, copy_module, records_of, state_diff, target_state, unique

from spec_compat import REGISTRY
from spec_compat.core.registry import Patch, PatchError, Registry, Status

KINDS = ("attr-renamed", "signature-changed", "module-missing")
#: (patch id, kind) -> status, for the ones that ran (summary: SPEC_COMPAT_FAULTS_SUMMARY=file.json)
OUTCOMES: dict[tuple[str, str], str] = {}
REASONS: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def baseline(real_targets: RealTargets) -> dict[str, tuple[str, str]]:
    """Every registered patch on its real target, in a fresh registry: what each one ends as."""
    reg = Registry()
    for p in PATCHES:
        reg.register(type(p))
    reg.apply(environ={})
    recs = records_of(reg)
    reg.revert()
    assert state_diff(real_targets.stock, target_state(real_targets.modules)) == []
    return recs


def test_fresh_registry_decides_like_the_global_one(real_targets, baseline):
    """The fault cases run fresh registries: they decide each patch as the global one did."""
    decided = {pid: rec[0] for pid, rec in real_targets.global_before.items()
               if rec[0] not in ("disabled", "pending")}  # a switch or an import earlier in the session
    assert decided and {pid: baseline[pid][0] for pid in decided} == decided


DRIFTED_SOURCE = '''
class {name}:
    """Drifted stand-in: other parameters, none of the original's members."""

    def __init__(self, renamed_only):
        self.renamed_only = renamed_only


def {name}_function(renamed_only):
    """Drifted stand-in: other parameters, none of the original's body."""
    raise AssertionError("a drifted stand-in was called")
'''


def drifted(orig: Any, tmp_path: Path, monkeypatch) -> Any:
    """An object of the same kind as ``orig`` with other parameters and none of its members,
    defined in a real source file (guards that read source read the drifted one)."""
    if isinstance(orig, types.ModuleType):
        return types.ModuleType(orig.__name__, "drifted stand-in: none of the module's attributes")
    name = getattr(orig, "__name__", "") if str(getattr(orig, "__name__", "")).isidentifier() else "Drifted"
    src = unique("src")
    (tmp_path / f"{src}.py").write_text(DRIFTED_SOURCE.format(name=name))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    mod = importlib.import_module(src)
    monkeypatch.delitem(sys.modules, src)
    if isinstance(orig, type):
        return getattr(mod, name)
    fn = getattr(mod, f"{name}_function")
    fn.__name__ = fn.__qualname__ = name
    return fn


def has_signature(obj: Any) -> bool:
    return isinstance(obj, (type, types.ModuleType)) or callable(obj)


def members(obj: Any) -> dict[str, Any]:
    if isinstance(obj, types.FunctionType):
        return {"__code__": obj.__code__, "__defaults__": obj.__defaults__,
                "__kwdefaults__": obj.__kwdefaults__, **obj.__dict__}
    return dict(vars(obj)) if hasattr(obj, "__dict__") else {}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def moved_module_name(target_module: str, tmp_path: Path, monkeypatch) -> str:
    """A module name where the target module used to be, inside its real package when that
    imports here, else inside a temporary package (the package exists, the module does not)."""
    parent, _, leaf = target_module.rpartition(".")
    try:
        importlib.import_module(parent or target_module)
        return f"{parent}.{leaf}_sc_moved" if parent else f"{target_module}._sc_moved"
    except Exception:
        pkg = unique("pkg")
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        monkeypatch.syspath_prepend(str(tmp_path))
        importlib.invalidate_caches()
        return f"{pkg}.{leaf}_sc_moved"


def drift_class(cls: type[Patch], target: str) -> type[Patch]:
    return type(cls.__name__, (cls,), {"target": target, "requires": {}, "__doc__": cls.__doc__,
                                        "__module__": cls.__module__})


def _cases():
    # no xfail here: a guard that lets drift through is a defect to fix in its patch
    for p in PATCHES:
        for kind in KINDS:
            yield pytest.param(p.id, kind, id=f"{p.id}-{kind}")


@pytest.mark.parametrize("pid, kind", list(_cases()))
def test_drift(pid, kind, real_targets, baseline, tmp_path, monkeypatch):
    patch = REGISTRY.get(pid)
    cls = type(patch)
    attr = patch.target_attr
    assert attr, f"{pid}: target {patch.target} names no attribute"
    mutated: types.ModuleType | None = None
    mutant: Any = None
    if kind == "module-missing":
        name = moved_module_name(patch.target_module, tmp_path, monkeypatch)
    else:
        real = real_targets.module(patch.target_module)
        if not hasattr(real, attr):
            pytest.skip(f"{patch.target_module} has no {attr} in this environment (its versions differ)")
        name = unique("drift")
        mutated = copy_module(real, name)
        orig = mutated.__dict__.pop(attr) if attr in mutated.__dict__ else getattr(real, attr)  # lazy: transformers
        if kind == "signature-changed" and not has_signature(orig):
            pytest.skip(f"{patch.target} is a {type(orig).__name__} value: it has no signature to change")
        if kind == "attr-renamed":
            mutated.__dict__[f"{attr}_renamed"] = orig
        else:
            mutant = drifted(orig, tmp_path, monkeypatch)
            mutated.__dict__[attr] = mutant
        sys.modules[name] = mutated
    target = f"{name}:{attr}"
    drift = drift_class(cls, target)
    module_before = dict(vars(mutated)) if mutated is not None else None
    mutant_before = members(mutant)
    try:
        # 1. alone: the status and its reason
        alone = Registry()
        alone.register(drift)
        try:
            alone.apply(environ={})
            if kind == "module-missing":
                assert alone.status(pid) is Status.PENDING
                alone.resolve_pending([name], environ={})
                assert name not in sys.modules
            (rec,) = alone.records()
        finally:
            alone.revert()
        OUTCOMES[(pid, kind)] = rec.status.value
        REASONS[(pid, kind)] = rec.reason
        assert rec.reason, rec
        if kind == "signature-changed":
            assert rec.status in (Status.TARGET_CHANGED, Status.FAILED, Status.NOT_NEEDED), rec
            if rec.status is Status.FAILED:
                assert rec.reason.startswith("guard raised "), rec  # never a half-done install
            if rec.status is Status.NOT_NEEDED:
                assert "outside" not in rec.reason and "not installed" not in rec.reason, rec
        else:
            assert rec.status is Status.TARGET_CHANGED, rec
            expected = f"has no attribute {attr!r}" if kind == "attr-renamed" else "does not exist"
            assert expected in rec.reason, rec

        # 2. the target untouched: the mutated module and object, and the real modules
        if mutated is not None:
            assert same(module_before, dict(vars(mutated))), "the mutated target module was changed"
            assert same(mutant_before, members(mutant)), "the drifted object was changed"
        assert state_diff(real_targets.stock, target_state(real_targets.modules)) == []

        # 3. strict mode raises, naming the patch
        if rec.status is not Status.NOT_NEEDED:
            strict = Registry()
            strict.register(drift)
            try:
                with pytest.raises(PatchError) as exc:
                    strict.apply(environ={"SPEC_COMPAT_STRICT": "1"})
                    strict.resolve_pending([name], environ={"SPEC_COMPAT_STRICT": "1"})
            finally:
                strict.revert()
            assert pid in str(exc.value) and rec.status.value in str(exc.value)

        # 4. every other patch, on its real target, ends as it does without the drift: once per
        #    patch (attr-renamed, or module-missing where the target is not here)
        if kind != ("attr-renamed" if hasattr(real_targets.modules.get(patch.target_module), attr)
                    else "module-missing"):
            return
        full = Registry()
        for p in PATCHES:
            full.register(drift if p.id == pid else type(p))
        try:
            full.apply(environ={})
            got = records_of(full)
        finally:
            full.revert()
        others = {q for q in baseline if q != pid and q not in cls.supersedes}
        assert {q: got.get(q) for q in others} == {q: baseline[q] for q in others}
        assert state_diff(real_targets.stock, target_state(real_targets.modules)) == []
    finally:
        if mutated is not None:
            sys.modules.pop(name, None)


def test_every_patch_covered(real_targets):
    """Every registered patch ran the module-missing case, and both in-module cases
    wherever its real target module imports (a new patch cannot skip the drift suite)."""
    registered = {p.id for p in REGISTRY.patches()}
    assert {p.id for p in PATCHES} == registered, "patches registered after collection"
    ran = {kind: {pid for (pid, k) in OUTCOMES if k == kind} for kind in KINDS}
    present = {p.id: getattr(real_targets.modules[p.target_module], p.target_attr) for p in PATCHES
               if p.target_module in real_targets.modules
               and hasattr(real_targets.modules[p.target_module], p.target_attr)}
    importable = set(present)
    assert ran["module-missing"] == registered, sorted(registered - ran["module-missing"])
    assert ran["attr-renamed"] == importable, sorted(importable - ran["attr-renamed"])
    with_signature = {pid for pid, obj in present.items() if has_signature(obj)}
    assert ran["signature-changed"] == with_signature, sorted(with_signature - ran["signature-changed"])
    out = os.environ.get("SPEC_COMPAT_FAULTS_SUMMARY")
    if out:
        by_kind = {k: {} for k in KINDS}
        for (pid, k), status in sorted(OUTCOMES.items()):
            by_kind[k][status] = by_kind[k].get(status, 0) + 1
        data = {"registered": len(registered), "importable": len(importable),
                "not_importable": sorted(set(real_targets.failed)), "outcomes": by_kind,
                "signature_changed_not_target_changed": sorted(
                    f"{pid}: {s}" for (pid, k), s in OUTCOMES.items()
                    if k == "signature-changed" and s != "target-changed"),
                "guard_attribute_error": sorted(pid for (pid, k), r in REASONS.items()
                                                if r.startswith("guard raised AttributeError"))}
        Path(out).write_text(json.dumps(data, indent=2))


# -- the registry rules these cases rely on (fakes) ---------------------------

class _Fake(Patch):
    """A fake patch for the registry rules."""

    id = "faults-fake"
    summary = upstream = "fake"


def _fake(target: str, check=None) -> Registry:
    reg = Registry()
    reg.register(type("P", (_Fake,), {"__doc__": "fake", "target": target,
                                      "check": (lambda self, m: check(m)) if check else (lambda self, m: None),
                                      "install": lambda self, m, changes: changes.setattr(m, "X", "patched")}))
    return reg


@pytest.mark.parametrize("error, status", [(AttributeError("type object 'X' has no attribute 'method'"),
                                            Status.TARGET_CHANGED),
                                           (KeyError("guard bug"), Status.FAILED)])
def test_guard_attribute_error_is_target_changed(error, status):
    mod = types.ModuleType(unique("rule"))
    mod.X = "stock"
    sys.modules[mod.__name__] = mod

    def check(module):
        raise error

    try:
        reg = _fake(f"{mod.__name__}:X", check)
        (rec,) = reg.apply(environ={})
        assert rec.status is status and rec.reason == f"guard raised {type(error).__name__}: {error}"
        assert mod.X == "stock"
        with pytest.raises(PatchError, match=f"faults-fake is {status.value}"):
            _fake(f"{mod.__name__}:X", check).apply(environ={"SPEC_COMPAT_STRICT": "1"})
    finally:
        sys.modules.pop(mod.__name__, None)


def test_module_gone_only_when_its_package_imports(tmp_path, monkeypatch):
    pkg = unique("pkg")
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "needs_dep.py").write_text(f"import {pkg}_absent_dependency\n")
    (tmp_path / f"{pkg}_flat.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    cases = {
        f"{pkg}.moved": Status.TARGET_CHANGED,              # the package is there, the module is not
        f"{pkg}.sub.moved": Status.TARGET_CHANGED,          # a subpackage of it is gone
        f"{pkg}.needs_dep": Status.PENDING,                 # exists, but a dependency is missing
        f"{pkg}_not_installed.mod": Status.PENDING,         # the distribution is not installed
        f"{pkg}_flat.mod": Status.PENDING,                  # a module where a package is expected
    }
    for name, status in cases.items():
        reg = _fake(f"{name}:X")
        reg.apply(environ={})
        reg.resolve_pending([name], environ={})
        (rec,) = reg.records()
        assert rec.status is status, (name, rec)
        assert ("does not exist" in rec.reason) is (status is Status.TARGET_CHANGED), rec
        assert ("failed to import" in rec.reason) is (status is Status.PENDING), rec
        reg.revert()
        for m in [m for m in sys.modules if m.startswith(pkg)]:
            monkeypatch.delitem(sys.modules, m)
