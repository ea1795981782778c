"""Every test directory: ``tests/support`` on ``sys.path`` (test modules import its helpers by bare
name) and the proof-of-need bookkeeping, the plugin ``tests/support/proof_hooks.py``."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
pytest.register_assert_rewrite("proof_hooks")

pytest_plugins = ["proof_hooks"]
import proof_hooks  # noqa: E402,F401 - imported too: proof keys follow imports, so the plugin is an input of every proof
