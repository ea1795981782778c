"""What the matrix tested, as ``report`` uses it, and the generated files' freshness."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import sys

import pytest

from spec_compat.cli import tested_cells as tested
from spec_compat.cli.tested_cells import TESTED_CELLS, load_cells

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from matrix_cells import load_records  # noqa: E402

check_outcomes, condense, render_results_md = (getattr(load_records(), n) for n in
                                               ("check_outcomes", "condense", "render_results_md"))

ROOT = Path(__file__).resolve().parents[2]
V16 = {"speculators": "0.3.0", "vllm": "0.16.0", "transformers": "4.57.6", "torch": "2.10.0"}
CELLS = [
    {"cell": "spec0.3.0-vllm0.16.0", "versions": V16, "last_green": "2026-11-30 18:00 UTC", "green": True,
     "patches": {"cpu-rejection-sampler": "applied", "capture-per-request": "applied"}},
    {"cell": "spec0.4.0.1-vllm0.16.0", "versions": dict(V16, speculators="0.4.0.1"),
     "last_green": "2026-11-29 10:00 UTC", "green": True, "patches": {"cpu-rejection-sampler": "applied"}},
    {"cell": "spec0.3.0-vllm0.11.0", "versions": dict(V16, vllm="0.11.0", torch="2.8.0"), "last_green": None,
     "green": False, "patches": {}},
]


def test_exact_cell_is_tested_with_its_last_green():
    st = tested.tested_status(V16, [], CELLS)
    assert st["tested"] and st["cell"] == "spec0.3.0-vllm0.16.0"
    assert st["last_green"] == "2026-11-30 18:00 UTC"
    assert "tested cell spec0.3.0-vllm0.16.0" in st["message"]


def test_exact_cell_names_patches_its_recorded_run_did_not_apply():
    records = [{"id": "cpu-rejection-sampler", "status": "applied"},
               {"id": "generator-input-checks", "status": "applied"},
               {"id": "scheduler-block-size", "status": "not-needed"}]
    st = tested.tested_status(V16, records, CELLS)
    assert st["tested"] and st["unrecorded"] == ["generator-input-checks"]
    assert "1 applied patches were not in that run (added since): generator-input-checks" in st["message"]
    assert tested.tested_status(V16, records[:1], CELLS)["unrecorded"] == []


def test_untested_names_nearest_green_cell_and_extrapolated_patches():
    here = dict(V16, vllm="0.16.1")
    records = [{"id": "cpu-rejection-sampler", "status": "applied"},
               {"id": "capture-per-request", "status": "applied"},
               {"id": "scheduler-block-size", "status": "not-needed"}]
    st = tested.tested_status(here, records, CELLS)
    assert not st["tested"] and st["nearest"] == "spec0.3.0-vllm0.16.0"
    # cpu-rejection-sampler's range names vllm: no green cell ran it at 0.16.1;
    # capture-per-request's range names speculators only: 0.3.0 was covered
    assert st["extrapolated"] == ["cpu-rejection-sampler"]
    assert "untested combination" in st["message"] and "cpu-rejection-sampler" in st["message"]


def test_recorded_but_never_green_is_not_tested():
    st = tested.tested_status(CELLS[2]["versions"], [], CELLS)
    assert not st["tested"] and st["cell"] == "spec0.3.0-vllm0.11.0"
    assert "has not passed" in st["message"]


def test_no_recorded_results(tmp_path):
    assert load_cells(tmp_path / "missing.json") == []
    (tmp_path / "bad.json").write_text("{")
    assert load_cells(tmp_path / "bad.json") == []
    st = tested.tested_status(V16, [], [])
    assert not st["tested"] and "no recorded" in st["message"]


GREEN = "56490f198f18a945b5dd699417b58d4c899c7a72"
HEAD = "0123456789abcdef0123456789abcdef01234567"
WITH_COMMIT = [dict(CELLS[0], last_green_commit=GREEN, commit=GREEN), *CELLS[1:]]


def build(**facts):
    return dict(tested.NO_BUILD, **facts)


@pytest.mark.parametrize("facts, text", [
    (build(installed_commit=HEAD, commits_since=3, package_changed_since=True, package_modified=False),
     " at commit 56490f198f18 (installed build 0123456789ab: 3 commits later, package files changed since)"),
    (build(installed_commit=HEAD, commits_since=1, package_changed_since=False, package_modified=False),
     " at commit 56490f198f18 (installed build 0123456789ab: 1 commit later, package files unchanged since)"),
    (build(installed_commit=GREEN, commits_since=0, package_changed_since=False, package_modified=False),
     " at commit 56490f198f18 (the installed build's commit)"),
    (build(installed_commit=HEAD, commits_since=2, package_changed_since=False, package_modified=True),
     " at commit 56490f198f18 (installed build 0123456789ab: 2 commits later, package files unchanged since; "
     "package files modified in the work tree)"),
    (build(installed_commit=HEAD, package_modified=False),
     " at commit 56490f198f18 (installed build 0123456789ab does not contain that commit)"),
    (build(installed_commit_note="not a git checkout"),
     " at commit 56490f198f18 (installed build's commit unknown: not a git checkout)"),
    (build(installed_commit_note="git not found"),
     " at commit 56490f198f18 (installed build's commit unknown: git not found)"),
], ids=["later-changed", "one-later-unchanged", "same", "modified", "not-contained", "wheel", "no-git"])
def test_commit_text(facts, text):
    assert tested.commit_text(GREEN, facts) == text


def test_tested_cell_names_its_last_green_commit_and_the_distance():
    facts = build(installed_commit=HEAD, commits_since=3, package_changed_since=False, package_modified=False)
    st = tested.tested_status(V16, [], WITH_COMMIT, build=facts)
    assert st["message"] == ("tested cell spec0.3.0-vllm0.16.0, last green 2026-11-30 18:00 UTC at commit "
                             "56490f198f18 (installed build 0123456789ab: 3 commits later, package files "
                             "unchanged since)")
    assert {k: st[k] for k in ("last_green_commit", "installed_commit", "installed_commit_note", "commits_since",
                               "package_changed_since", "package_modified")} == {
        "last_green_commit": GREEN, "installed_commit": HEAD, "installed_commit_note": None, "commits_since": 3,
        "package_changed_since": False, "package_modified": False}


def test_record_without_a_commit_says_so():
    st = tested.tested_status(V16, [], CELLS, build=build(installed_commit=HEAD, package_modified=False))
    assert st["message"] == ("tested cell spec0.3.0-vllm0.16.0, last green 2026-11-30 18:00 UTC, "
                             "commit not recorded (recorded before records named commits)")
    assert st["last_green_commit"] is None and st["installed_commit"] == HEAD and st["commits_since"] is None


def test_untested_combination_names_the_nearest_cells_commit():
    facts = build(installed_commit=HEAD, commits_since=12, package_changed_since=True, package_modified=False)
    st = tested.tested_status(dict(V16, vllm="0.16.1"), [], WITH_COMMIT, build=facts)
    assert st["message"] == ("untested combination (speculators 0.3.0, vllm 0.16.1, transformers 4.57.6, torch "
                             "2.10.0); nearest tested cell spec0.3.0-vllm0.16.0, last green 2026-11-30 18:00 UTC "
                             "at commit 56490f198f18 (installed build 0123456789ab: 12 commits later, package "
                             "files changed since)")
    assert st["last_green_commit"] == GREEN and st["commits_since"] == 12


def test_every_status_has_the_same_keys():
    facts = build(installed_commit_note="not a git checkout")
    keys = {"tested", "cell", "last_green", "nearest", "extrapolated", "message", "last_green_commit",
            "installed_commit", "installed_commit_note", "commits_since", "package_changed_since", "package_modified"}
    for st in (tested.tested_status(V16, [], WITH_COMMIT, build=facts),
               tested.tested_status(dict(V16, vllm="0.16.1"), [], WITH_COMMIT, build=facts),
               tested.tested_status(CELLS[2]["versions"], [], WITH_COMMIT, build=facts),
               tested.tested_status(V16, [], [], build=facts)):
        assert keys <= set(st), keys - set(st)


def test_report_asks_git_for_the_matching_cells_last_green_commit(monkeypatch):
    asked = []
    monkeypatch.setattr(tested, "installed_build", lambda since: asked.append(since) or build(
        installed_commit=HEAD, commits_since=0, package_changed_since=False, package_modified=False))
    tested.tested_status(V16, [], WITH_COMMIT)
    tested.tested_status(CELLS[0]["versions"], [], CELLS)
    assert asked == [GREEN, None]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs this git checkout")
def test_installed_build_in_this_checkout():
    """The package lies in this checkout: its commit is HEAD, and HEAD is 0 commits from itself."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    facts = tested.installed_build(head)
    assert facts["installed_commit"] == head and facts["installed_commit_note"] is None
    assert facts["commits_since"] == 0 and facts["package_changed_since"] is False
    assert isinstance(facts["package_modified"], bool)
    parent = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if parent:  # HEAD's first parent: one commit back, or more when HEAD merges a branch
        between = subprocess.run(["git", "rev-list", "--count", f"{parent}..HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip()
        assert tested.installed_build(parent)["commits_since"] == int(between) >= 1
    assert tested.installed_build("0" * 40)["commits_since"] is None  # not in this checkout


def test_installed_build_outside_a_checkout(tmp_path):
    """A copy of the package outside any checkout (as a wheel installs it): commit unknown."""
    (tmp_path / "__init__.py").write_text("")
    assert tested.installed_build(GREEN, tmp_path) == build(installed_commit_note="not a git checkout")


def test_installed_build_without_git(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert tested.installed_build(GREEN) == build(installed_commit_note="git not found")


def test_check_outcomes():
    tests = {
        "tests/unit/test_a.py::test_x": "passed",
        "tests/engine/test_extraction.py::test_states[llama-short]": "passed",
        "tests/engine/test_extraction.py::test_states[kimi-k25-short]": "failed",
        "tests/engine/test_training.py::test_t": "skipped",
    }
    got = check_outcomes(tests)
    assert got["import + report"] == "pass"
    assert got["Llama extraction exact"] == "pass"
    assert got["Kimi-K2.5 extraction exact"] == "FAIL"
    assert got["training runs"] == "skipped"
    assert got["serving (lossless, acceptance)"] == "-"


def test_generated_files_match_recorded_results():
    """matrix/RESULTS.md and the shipped tested_cells.json are generated from
    matrix/results/*.json (``matrix/record --render``), never edited."""
    results = [json.loads(p.read_text()) for p in sorted((ROOT / "matrix" / "results").glob("*.json"))]
    assert results, "no recorded matrix results"
    assert (ROOT / "matrix" / "RESULTS.md").read_text() == render_results_md(results), \
        "matrix/RESULTS.md is out of date: run matrix/record --render"
    assert json.loads(TESTED_CELLS.read_text()) == condense(results), \
        "spec_compat/data/tested_cells.json is out of date: run matrix/record --render"
