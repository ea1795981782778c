"""README's picture of the package matches the tree: every package directory of ``spec_compat`` is
named in "How it works", every project path the README names exists, and "Adding a patch" names no
list a new patch would have to be added to by hand (the walkthrough itself:
tests/unit/test_add_a_patch.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 3)
    return README[start:end if end > 0 else None]


def test_every_package_directory_is_in_the_wing_list():
    """A top-level package by its path (`spec_compat/x/`), a nested one by its name (`y/`)."""
    how = _section("How it works")
    missing = []
    for init in sorted((ROOT / "spec_compat").rglob("__init__.py")):
        parts = init.parent.relative_to(ROOT).parts
        if len(parts) == 1:
            continue
        name = f"`{'/'.join(parts)}/`" if len(parts) == 2 else f"`{parts[-1]}/`"
        if name not in how:
            missing.append("/".join(parts))
    assert not missing, f"README 'How it works' does not name: {missing}"


def test_every_path_the_readme_names_exists():
    paths = set(re.findall(r"`((?:spec_compat|tests|tools|matrix|docs|benchmarks)/[^`\s]*)`", README))
    missing = []
    for p in sorted(paths):
        pattern = re.sub(r"<[^>]+>", "*", p.rstrip("/"))
        if not list(ROOT.glob(pattern)):
            missing.append(p)
    assert not missing, f"README names paths that do not exist: {missing}"


def test_adding_a_patch_names_no_hand_kept_list():
    adding = _section("Adding a patch")
    for gone in ("EXTRACTION_MODULES", "SERVER_MODULES", "HARNESS", "import order is the registration order"):
        assert gone not in adding, gone
    # what it does name is real: the manifest drives report, `after` is a Patch attribute
    from spec_compat.core.registry import Patch

    assert "`after`" in adding and hasattr(Patch, "after")
