"""What the matrix tested, as ``report`` uses it, and the generated files' freshness."""

from __future__ import annotations

import json
from pathlib import Path

import sys

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
