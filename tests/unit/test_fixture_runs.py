"""``tests/support/fixture_runs.once_per_fixture``, the memo of the server tests' module-scoped runs
(``fp8_run``, ``mooncake_run``, ``pipeline``): one run per fixture name, a failed run not kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixture_runs import once_per_fixture  # tests/support (on sys.path: tests/conftest.py)


class _Factory:
    def __init__(self, root: Path) -> None:
        self.root, self.made = root, []

    def mktemp(self, name: str) -> Path:
        self.made.append(name)
        path = self.root / f"{name}{len(self.made)}"
        path.mkdir()
        return path


def test_each_fixture_runs_once_and_a_failure_is_not_kept(tmp_path):
    calls, built = [], []
    factory = _Factory(tmp_path)

    def fixture_model(name: str) -> Path:
        built.append(name)
        return tmp_path / f"model-{name}"

    def run(name: str, model: Path, trust: bool, tmp: Path) -> dict:
        calls.append((name, model.name, trust, tmp.name))
        if name == "broken" and len(calls) == 3:
            raise RuntimeError("the run failed")
        return {"name": name}

    get = once_per_fixture(fixture_model, factory, "fp8", run)
    first = get("llama")
    assert get("llama") is first and get("kimi-k25") == {"name": "kimi-k25"} and get("kimi-k25") is get("kimi-k25")
    assert calls == [("llama", "model-llama", False, "fp8-llama1"), ("kimi-k25", "model-kimi-k25", True, "fp8-kimi-k252")]
    with pytest.raises(RuntimeError):
        get("broken")
    assert get("broken") == {"name": "broken"}  # run again, not the failure kept
    assert built == ["llama", "kimi-k25", "broken", "broken"]
    assert factory.made == ["fp8-llama", "fp8-kimi-k25", "fp8-broken", "fp8-broken"]
