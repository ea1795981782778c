"""Fixtures of the fault suite (issue #8).  No vLLM engine is started anywhere in this
suite.  Tests that need the real target modules import them (vllm / speculators /
transformers / torch modules); where one does not import here the test says so and skips.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from faults_helpers import Background
from faults_support import FakeMetadata, RealTargets, full_run_command, import_targets, records_of, target_state

from spec_compat import REGISTRY
from spec_compat.core import bindings
from spec_compat.core import versions as _versions

_REAL_METADATA = _versions._metadata()  # loaded now: tests swap it for fakes
HERE = Path(__file__).resolve().parent

# site-packages is watched during the suite: this process writes no bytecode caches from here on
sys.dont_write_bytecode = True

#: the tests that read the watched full run (tests/faults/test_security.py)
FULL_RUN_USERS = {"test_full_run_writes_nothing_into_site_packages", "test_report_never_includes_environment_secrets"}
_full_run_wanted = False


def pytest_collection_modifyitems(config, items):
    global _full_run_wanted
    _full_run_wanted = any(getattr(item, "originalname", item.name) in FULL_RUN_USERS
                           and Path(str(item.fspath)).resolve().is_relative_to(HERE) for item in items)


@pytest.fixture(scope="session", autouse=True)
def full_run_in_background(tmp_path_factory) -> Iterator[Background | None]:
    """The full non-engine run of test_security.py, started with the suite's first test and
    running beside the in-process tests (it takes as long as they do)."""
    if not _full_run_wanted:
        yield None
        return
    handle = full_run_command(tmp_path_factory.mktemp("full-run"))
    yield handle
    handle.cancel()


@pytest.fixture(autouse=True)
def _clean_switches_and_versions(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("SPEC_COMPAT_DISABLE", "SPEC_COMPAT_STRICT"):
        monkeypatch.delenv(var, raising=False)
    assert _versions.metadata is _REAL_METADATA, "a test leaked its fake metadata provider"
    _versions.clear_cache()
    yield
    _versions.clear_cache()
    leftover = [k for k in bindings._ADAPTERS if k[0].startswith("_sc_faults_")]
    for k in leftover:
        bindings._ADAPTERS.pop(k)
    assert not leftover, f"bindings left adapted after the test: {leftover}"


@pytest.fixture
def fake_metadata(monkeypatch: pytest.MonkeyPatch) -> Callable[[Mapping[str, str | None]], FakeMetadata]:
    def install(dists: Mapping[str, str | None]) -> FakeMetadata:
        fake = FakeMetadata(dists)
        monkeypatch.setattr(_versions, "metadata", fake)
        _versions.clear_cache()
        return fake

    return install


@pytest.fixture(scope="module")
def real_targets() -> Iterator[RealTargets]:
    """Every importable target module imported (the global registry patches them on
    import, as in any process), then the global registry reverted for the module's
    tests, so that they work on upstream's own objects; re-applied afterwards."""
    modules, failed = import_targets()
    before = records_of(REGISTRY)
    REGISTRY.revert()
    try:
        yield RealTargets(modules, failed, before, target_state(modules))
    finally:
        REGISTRY.apply()
