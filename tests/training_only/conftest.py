"""Tests of a training-only cell (no vLLM): stock speculators under transformers 5.x.

Tests marked ``t1`` need what catalog entry T1 is about: speculators 0.3.x/0.4.x
with transformers >= 5.4 (and torch).  The others need torch only.  Where that is
missing they are skipped, unless SPEC_COMPAT_REQUIRE_TRAINING=1 (set by
matrix/run for a cell without vLLM), where that is an error.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# No process-wide TORCHDYNAMO_DISABLE here: this conftest is loaded in every cell's session, and it
# would un-compile speculators' draft for the engine tests too (draft-eager-without-cuda keeps CPU
# runs uncompiled anyway).

import spec_compat  # noqa: E402,F401  (before speculators, as users do)
from spec_compat.core.versions import in_range, installed_version  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
T1_RANGES = {"speculators": ">=0.3,<0.5", "transformers": ">=5.4"}


def why_not(needs_t1: bool) -> str | None:
    missing = [m for m in ("torch", "transformers", "speculators") if importlib.util.find_spec(m) is None]
    if missing:
        return f"needs a training cell ({', '.join(missing)} not installed)"
    if needs_t1:
        for dist, spec in T1_RANGES.items():
            version = installed_version(dist)
            if not in_range(version, spec):
                return f"T1 needs {dist}{spec} (installed: {version})"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "t1: needs speculators 0.3.x/0.4.x under transformers >= 5.4 (catalog T1)")


def pytest_collection_modifyitems(config, items):
    require = os.environ.get("SPEC_COMPAT_REQUIRE_TRAINING") == "1"
    for item in items:
        if not Path(str(item.fspath)).resolve().is_relative_to(HERE):
            continue
        reason = why_not(item.get_closest_marker("t1") is not None)
        if reason is None:
            continue
        if require:
            raise pytest.UsageError(f"training-only tests required but: {reason}")
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    """A tiny random-weight Llama verifier, built by the CLI as a user would."""
    out = tmp_path_factory.mktemp("fixtures") / "llama"
    subprocess.run([sys.executable, "-m", "spec_compat", "fixture", "llama", str(out)],
                   check=True, stdout=subprocess.DEVNULL, cwd=str(ROOT))
    return out
