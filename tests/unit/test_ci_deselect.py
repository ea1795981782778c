"""Every node CI leaves out of a cell (``Cell.ci_deselect`` in matrix/cells.py) names a test file,
function and parameter id that exist: pytest ignores a ``--deselect`` that matches nothing, so a
typo would silently put the test back into CI (or a renamed test would leave the reason wrong)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

ROOT = Path(__file__).resolve().parents[2]


def _cells():
    from matrix_cells import load_cells

    return load_cells()


CASES = [(name, node, why) for name, cell in _cells().items() for node, why in cell.ci_deselect]


def _function_names(source: str) -> set[str]:
    return {n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_there_are_deselections_to_check():
    assert len(CASES) >= 5


@pytest.mark.parametrize("cell, node, why", CASES, ids=[f"{c}:{n}" for c, n, _ in CASES])
def test_deselected_node_exists(cell, node, why):
    assert why.strip(), f"{cell}: {node} has no reason"
    path, _, rest = node.partition("::")
    assert (ROOT / path).exists(), f"{cell}: {path} does not exist"
    if not rest:
        return
    m = re.fullmatch(r"(\w+)(?:\[([^\]]+)\]?)?", rest)  # "name[param-prefix" selects by prefix
    assert m, f"{cell}: cannot read {rest!r}"
    source = (ROOT / path).read_text()
    assert m.group(1) in _function_names(source), f"{cell}: {path} has no {m.group(1)}"
    if m.group(2):
        # a parameter id: each part appears as a literal where the function is parametrized
        for part in m.group(2).split("-"):
            if part and not part.isdigit():
                assert part in source, f"{cell}: no parameter {part!r} for {m.group(1)} in {path}"


CI_TESTS = [(name, path) for name, cell in _cells().items() for path in cell.ci_tests]


@pytest.mark.parametrize("cell, path", CI_TESTS, ids=[f"{c}:{p}" for c, p in CI_TESTS])
def test_ci_test_paths_exist_in_ci_cells(cell, path):
    """A path CI runs a cell with (``Cell.ci_tests``) exists, and only a CI cell names any: a missing path
    would make pytest run nothing there (exit 4), a typo in a non-CI cell would go unnoticed."""
    assert (ROOT / path).exists(), f"{cell}: {path} does not exist"
    assert _cells()[cell].in_ci, f"{cell} names ci_tests but is not in CI"
