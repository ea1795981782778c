"""README.md is the front door; the details live in docs/*.md.  The patch table in
docs/patches.md is the registry's (regenerate with `spec-compat patches --markdown`), the
README names the test command CI runs, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spec_compat.cli.report import patch_table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PATCHES_DOC = ROOT / "docs" / "patches.md"
MAX_README_LINES = 220
#: a markdown link or image target: ](target) or ](target "title")
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_patch_table_matches_registry():
    text = PATCHES_DOC.read_text()
    start = text.index("<!-- patch-table:start")
    start = text.index("\n", start) + 1
    end = text.index("<!-- patch-table:end")
    assert text[start:end].strip() == patch_table().strip(), (
        "docs/patches.md's patch table is out of date: run tools/regenerate (it writes `spec-compat patches --markdown`)"
    )


def test_readme_names_the_test_command_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "matrix/test" in ci
    assert "matrix/test" in README.read_text()


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move details to docs/")


def _relative_links(path: Path) -> list[str]:
    targets = LINK.findall(path.read_text())
    return [t for t in targets if not re.match(r"^(?:https?:|mailto:|#)", t)]


def test_link_pattern():
    assert LINK.findall('[a](docs/x.md) [`b`](../y.py "t") ![c](z.png#s) [d](https://e/f)') == [
        "docs/x.md", "../y.py", "z.png#s", "https://e/f"]


@pytest.mark.parametrize("path", [README, *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    links = _relative_links(path)
    broken = [t for t in links if not (path.parent / t.split("#", 1)[0]).exists()]
    assert not broken, f"{path.relative_to(ROOT)}: links to missing files: {broken}"
