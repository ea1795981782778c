"""The figures docs/testing.md and tests/faults/README.md quote (test counts, suite times, disk)
are generated from matrix/results/*.json by ``matrix/record --render``, between marker comments,
so they cannot drift from the records or be pinned to an old commit by hand."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from matrix_cells import load_records  # noqa: E402

_records = load_records()
read_block, render_fault_figures_md = _records.read_block, _records.render_fault_figures_md
render_figures_md, replace_block = _records.render_figures_md, _records.replace_block

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TESTING_DOC = ROOT / "docs" / "testing.md"
FAULTS_README = ROOT / "tests" / "faults" / "README.md"
#: the files README.md's former sections moved to (docs/testing.md holds the figures block)
DOCS = [ROOT / "docs" / f"{name}.md" for name in (
    "usage", "switches", "patches", "testing", "kimi-k25", "serving", "training", "transformers5", "cpu-engine")]


def _results() -> list[dict]:
    results = [json.loads(p.read_text()) for p in sorted((ROOT / "matrix" / "results").glob("*.json"))]
    assert results, "no recorded matrix results"
    return results


def _in_ci() -> list[str]:
    from matrix_cells import load_cells

    return [name for name, c in load_cells().items() if c.in_ci]


def _testing_figures(results: list[dict], in_ci: list[str]) -> str:
    """The block as matrix/record writes it into docs/testing.md: the repository-root link to
    matrix/RESULTS.md made relative to docs/."""
    return render_figures_md(results, in_ci).replace("](matrix/", "](../matrix/")


def test_testing_doc_figures_are_the_records():
    assert read_block(TESTING_DOC.read_text(), "figures") == _testing_figures(_results(), _in_ci()), \
        "docs/testing.md's figures block is out of date: run matrix/record --render"


def test_fault_readme_figures_are_the_records():
    assert read_block(FAULTS_README.read_text(), "fault-figures") == render_fault_figures_md(_results()), \
        "tests/faults/README.md's figures block is out of date: run matrix/record --render"


@pytest.mark.parametrize("path,block", [(README, None), (FAULTS_README, "fault-figures")]
                         + [(doc, "figures" if doc == TESTING_DOC else None) for doc in DOCS],
                         ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, Path) else str(v))
def test_no_hand_written_run_figures_outside_the_generated_block(path, block):
    """Counts of a test run ("281 passed", "7 xfailed") and CI timings belong in the generated
    block; anywhere else in the file they go stale with the next run."""
    text = path.read_text()
    outside = replace_block(text, block, "") if block else text
    found = re.findall(r"\b\d+ (?:passed|failed|skipped|xfailed)\b|Measured CI", outside)
    assert not found, f"{path.relative_to(ROOT)}: run figures outside the generated block: {found}"


def test_replace_block_rewrites_only_between_the_markers():
    text = "intro 1 passed\n<!-- x:start (old note) -->\nold\n<!-- x:end -->\ntail\n"
    new = replace_block(text, "x", "new body")
    assert new.startswith("intro 1 passed\n<!-- x:start (generated") and new.endswith("<!-- x:end -->\ntail\n")
    assert read_block(new, "x") == "new body\n"
    assert replace_block(new, "x", "new body") == new
    for broken in ("no markers\n", "<!-- x:end -->\n<!-- x:start -->\n", "<!-- x:start -->\n"):
        with pytest.raises(ValueError):
            replace_block(broken, "x", "b")


def test_figures_follow_the_records():
    """A changed record changes the block: counts, the fault suite's share, times and CI totals."""
    tests = {"tests/unit/test_a.py::t1": "passed", "tests/faults/test_b.py::t2": "passed",
             "tests/faults/test_b.py::t3": "skipped", "tests/engine/test_c.py::t4": "failed"}
    rec = {"cell": "c1", "date": "d", "suite_seconds": 100, "build_seconds": 5.0, "tests": tests,
           "disk": {"own_bytes": 3e6, "total_bytes": 2e9}}
    other = dict(rec, cell="c2", suite_seconds=7, build_seconds=1.0, tests={"tests/unit/test_a.py::t1": "passed"})
    md = render_figures_md([rec, other], in_ci=["c1"])
    assert "| `c1` | yes | d | 2 / 1 / 1 | 1 / 0 / 1 | 100 | 5.0 | 3 MB / 2.00 GB |" in md
    assert "| `c2` | no | d | 1 / 0 / 0 | - | 7 | 1.0 |" in md
    assert "The 1 CI cells' recorded suites together: 2 tests passed in 100 s" in md
    faults = render_fault_figures_md([rec, other])
    assert "| `test_b.py` | 1 / 0 / 1 |" in faults and "`c2`" not in faults
