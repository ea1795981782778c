"""A full engine run (driver + spawned worker with the vLLM plugin, the whole registry applied)
writes nothing into site-packages: every file's size and mtime are compared before and after
(tests/faults/faults_helpers.py; the non-engine variant is tests/faults/test_security.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from faults_helpers import child_env, watch_site_packages  # noqa: E402

pytestmark = pytest.mark.engine


def test_engine_run_writes_nothing_into_site_packages(llama_dir):
    env = child_env({"PYTHONDONTWRITEBYTECODE": "1", "SPEC_COMPAT_LOG": "DEBUG"})
    cmd = [sys.executable, "-m", "spec_compat", "selftest", "--model", str(llama_dir),
           "--checks", "short,chunked-8x2000"]
    watched = watch_site_packages([cmd], env=env, timeout=900)
    (proc,) = watched.procs
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "PASS chunked-8x2000" in proc.stdout, proc.stdout
    assert watched.changes.files > 1000, watched.roots  # the snapshot saw the environment
    assert not watched.changes, watched.changes.summary()
