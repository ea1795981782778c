"""Fixtures for the registry unit tests: fake target modules, fake patches on a
fresh :class:`Registry`, simulated installed versions.  Nothing here imports
vllm, torch, transformers or speculators, and the global REGISTRY is never
applied or reverted."""

from __future__ import annotations

import importlib
import itertools
import os
import sys
import textwrap
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from spec_compat import REGISTRY
from spec_compat.core import bindings
from spec_compat.core import versions as _versions
from spec_compat.core.registry import Changes, Patch, Registry, Status

_counter = itertools.count()
_REAL_DIST_VERSION = _versions._dist_version


def unique(prefix: str) -> str:
    return f"_sc_{prefix}_{os.getpid()}_{next(_counter)}"


@pytest.fixture(autouse=True)
def _clean_switches_and_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("SPEC_COMPAT_DISABLE", "SPEC_COMPAT_STRICT"):
        monkeypatch.delenv(var, raising=False)
    assert _versions._dist_version is _REAL_DIST_VERSION, "a test leaked its fake version reader"
    _versions.clear_cache()
    global_records = REGISTRY.records()
    yield
    _versions.clear_cache()
    # a record that was pending may have applied meanwhile: a test imported its target (transformers 5
    # imports tokenization_gpt2 with its configuration classes), and the registry's import hook applied
    # it, as it would in any process; every other change is a test's
    after = REGISTRY.records()
    before = {r.id: r for r in global_records}
    changed = [r for r in after if r != before.get(r.id)
               and not (r.id in before and before[r.id].status is Status.PENDING)]
    assert [r.id for r in after] == list(before) and not changed, f"a test changed the global REGISTRY: {changed}"
    leftover = [k for k in bindings._ADAPTERS if k[0].startswith("_sc_")]
    for k in leftover:
        bindings._ADAPTERS.pop(k)
    assert not leftover, f"bindings left adapted after the test: {leftover}"


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def fake_module() -> Iterator[Callable[..., types.ModuleType]]:
    """``fake_module(**attrs)``: a new module inserted into sys.modules (removed after)."""
    names: list[str] = []

    def make(**attrs: Any) -> types.ModuleType:
        name = unique("fake")
        mod = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(mod, k, v)
        sys.modules[name] = mod
        names.append(name)
        return mod

    yield make
    for n in names:
        sys.modules.pop(n, None)


@pytest.fixture
def module_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """``module_file(source)``: writes an importable (not imported) module, returns its name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def make(source: str) -> str:
        name = unique("src")
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        names.append(name)
        assert name not in sys.modules
        return name

    yield make
    for n in names:
        sys.modules.pop(n, None)


@pytest.fixture
def versions(monkeypatch: pytest.MonkeyPatch) -> Callable[[Mapping[str, str]], None]:
    """``versions({"vllm": "0.16.0", ...})``: the installed distributions, as
    ``spec_compat.core.versions`` will read them (everything else is absent).  The
    function-scoped monkeypatch restores the real reader (LIFO with any other
    patch of it in the test); the autouse fixture clears the cache."""
    installed: dict[str, str] = {}
    monkeypatch.setattr(_versions, "_dist_version", lambda dist: installed.get(dist))

    def set_versions(mapping: Mapping[str, str]) -> None:
        installed.clear()
        installed.update(mapping)
        _versions.clear_cache()

    return set_versions


@pytest.fixture
def set_attr_install() -> Callable[[str, Any], Callable[[types.ModuleType, Changes], None]]:
    """``set_attr_install(attr, value)``: an install function setting ``module.attr``
    through the undo log (a fixture, not an import: tests/engine has a conftest too)."""

    def make(attr: str, value: Any) -> Callable[[types.ModuleType, Changes], None]:
        def install(module: types.ModuleType, changes: Changes) -> None:
            changes.setattr(module, attr, value)

        return install

    return make


@pytest.fixture
def make_patch(registry: Registry) -> Callable[..., type[Patch]]:
    """``make_patch(target, install=..., check=..., requires=..., pid=..., after=...)``: a Patch
    subclass registered on the test's fresh registry; ``cls.calls`` lists the
    modules ``install`` was called with."""

    def make(target: str, *, pid: str | None = None,
             install: Callable[[types.ModuleType, Changes], None] | None = None,
             check: Callable[[types.ModuleType], None] | None = None,
             requires: Mapping[str, str] | None = None,
             summary: str = "fake patch summary",
             after: tuple[str, ...] = (),
             reg: Registry | None = None) -> type[Patch]:
        calls: list[types.ModuleType] = []

        def _install(self: Patch, module: types.ModuleType, changes: Changes) -> None:
            calls.append(module)
            if install is not None:
                install(module, changes)

        def _check(self: Patch, module: types.ModuleType) -> None:
            if check is not None:
                check(module)

        cls = type("FakePatch", (Patch,), {
            "__doc__": "A fake patch for the unit tests.",
            "id": pid or f"fake-{next(_counter)}",
            "summary": summary,
            "upstream": "fake 1.0 fake.py: fake symptom",
            "target": target,
            "requires": dict(requires or {}),
            "check": _check,
            "install": _install,
            "calls": calls,
            "after": tuple(after),
        })
        (reg if reg is not None else registry).register(cls)
        return cls

    return make
