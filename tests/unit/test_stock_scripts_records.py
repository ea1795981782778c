"""The recorded runs of speculators' stock scripts (``matrix/stock-scripts``) are complete.

CI has no GitHub access, so ``tests/engine/test_stock_scripts.py`` runs by hand; each run is
recorded in ``matrix/results/stock-scripts/CELL.json``.  A record names the speculators tag of
its cell, that tag's commit and the git blob hash of every script it exported, and every test's
outcome; a record of a failed run says so (``exit_status``), it is never dropped.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDS = sorted((ROOT / "matrix" / "results" / "stock-scripts").glob("*.json"))
sys.path.insert(0, str(ROOT / "matrix"))
from cells import CELLS  # noqa: E402

HEX40 = re.compile(r"[0-9a-f]{40}")


def test_at_least_one_cell_has_a_recorded_run():
    assert RECORDS, "no matrix/results/stock-scripts/*.json: run matrix/stock-scripts CELL SPECULATORS_GIT_DIR"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_record_names_the_scripts_it_ran(path: Path):
    rec = json.loads(path.read_text())
    cell = CELLS[rec["cell"]]
    assert path.stem == cell.name
    assert rec["speculators_tag"] == f"v{cell.speculators}"
    assert HEX40.fullmatch(rec["speculators_commit"])
    for script in ("scripts/build_vocab_mapping.py", "scripts/train.py"):
        assert HEX40.fullmatch(rec["scripts"][script]), script
    tests = rec["tests"]
    assert tests and all(t["outcome"] in {"passed", "failed", "error", "skipped"} for t in tests.values())
    ran = {name for name, t in tests.items() if t["outcome"] != "skipped"}
    assert ran, "every test was skipped: the scripts were not found"
    if rec["exit_status"] == 0:
        assert all(tests[name]["outcome"] == "passed" for name in ran)
    else:
        assert any(tests[name]["outcome"] in {"failed", "error"} for name in ran)
