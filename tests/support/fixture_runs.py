"""A module-scoped run fixture's memo: a server test's expensive run (prepare, serve, generate, train)
happens once per target fixture, however many tests read its results.

The server tests (``fp8_run`` in tests/server/test_hs_connectors.py, ``mooncake_run`` in
test_mooncake.py, ``pipeline`` in test_speculators_pipeline.py) each return ``once_per_fixture(...)``
from their module-scoped fixture; a test calls the result with a fixture name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

#: ``run(name, model, trust, tmp)``: the run's results for fixture ``name`` (a dict of paths, logs, results)
Run = Callable[[str, Path, bool, Path], dict]


def once_per_fixture(fixture_model: Callable[[str], Path], tmp_path_factory: Any, prefix: str,
                     run: Run) -> Callable[[str], dict]:
    """``get(name)``: ``run(name, model, trust, tmp)`` the first time (``model``: the built fixture,
    ``trust``: whether it needs ``--trust-remote-code`` (the Kimi fixtures), ``tmp``: a fresh
    ``<prefix>-<name>`` directory), its result again after that.  A run that raises is not kept:
    the next test asking for it runs it again (and fails with its own error)."""
    done: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in done:
            model = fixture_model(name)
            trust = name.startswith("kimi")
            done[name] = run(name, model, trust, tmp_path_factory.mktemp(f"{prefix}-{name}"))
        return done[name]

    return get
