"""One fix, one unit: what README's "Layout" promises, checked on the source.

* every unit (``spec_compat/patches/<group>/<unit>.py``, or ``<unit>/__init__.py`` of a folder unit)
  declares exactly one patch, and is named after it: the id with ``-`` read as ``_``, so a patch
  id says where its declaration and behaviour are;
* ``spec_compat/shims`` holds only what several fixes share: no shim module is reached by exactly one
  unit and nothing else in the package (its code belongs in that unit), and no file name is in both
  ``patches/`` and ``shims/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from spec_compat import REGISTRY
from spec_compat.patches import MODULES as UNITS

PACKAGE = Path(__file__).resolve().parents[2] / "spec_compat"


def _unit_of(module: str) -> str:
    """The unit a module belongs to (a folder unit's behaviour modules belong to the folder)."""
    parts = module.split(".")
    return ".".join(parts[:4]) if parts[:2] == ["spec_compat", "patches"] and len(parts) > 4 else module


def test_every_unit_declares_one_patch_named_after_it():
    declared: dict[str, list[str]] = {unit: [] for unit in UNITS}
    for patch in REGISTRY.patches():
        declared.setdefault(_unit_of(type(patch).__module__), []).append(patch.id)
    wrong = {unit: ids for unit, ids in declared.items()
             if len(ids) != 1 or unit.rsplit(".", 1)[-1] != ids[0].replace("-", "_")}
    assert not wrong, ("each unit declares one patch and is named after its id ('-' read as '_'); "
                       f"these do not: {wrong}")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _importers() -> dict[str, set[str]]:
    """Package module -> the package modules importing it (``from X import y`` counts for ``X.y``
    where that is a module, else for ``X``)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    found: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else (node.module or "")
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for name in names:
                if name in found and name != module:
                    found[name].add(module)
    return found


IMPORTERS = _importers()
SHIMS = sorted(m for m in IMPORTERS if m.startswith("spec_compat.shims."))


def _reached_by(shim: str) -> set[str]:
    """The units and the other non-shim modules that reach ``shim``, directly or through other shims."""
    seen, todo, out = {shim}, [shim], set()
    while todo:
        for importer in IMPORTERS[todo.pop()]:
            if importer.startswith("spec_compat.shims"):
                if importer not in seen:
                    seen.add(importer)
                    todo.append(importer)
            else:
                out.add(_unit_of(importer))
    return out


@pytest.mark.parametrize("shim", SHIMS)
def test_a_shim_is_shared(shim):
    users = _reached_by(shim)
    assert not (len(users) == 1 and users <= set(UNITS)), (
        f"{shim} serves one fix only ({users.pop()}): its code belongs in that unit")


def test_no_file_name_in_both_trees():
    names = lambda tree: {p.name for p in (PACKAGE / tree).rglob("*.py") if p.name != "__init__.py"}  # noqa: E731
    both = names("patches") & names("shims")
    assert not both, f"in both spec_compat/patches and spec_compat/shims: {sorted(both)}"
