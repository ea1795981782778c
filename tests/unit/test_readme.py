"""README.md's patch table is the registry's (regenerate with `spec-compat patches --markdown`)."""

from __future__ import annotations

from pathlib import Path

from spec_compat.cli import patch_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_patch_table_matches_registry():
    text = README.read_text()
    start = text.index("<!-- patch-table:start")
    start = text.index("\n", start) + 1
    end = text.index("<!-- patch-table:end")
    assert text[start:end].strip() == patch_table().strip(), (
        "README patch table is out of date: paste the output of `spec-compat patches --markdown`"
    )


def test_readme_names_the_test_command_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "matrix/test" in ci
    assert "matrix/test" in README.read_text()
