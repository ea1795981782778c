"""The package's layers, read from its source with ``ast`` (nothing is imported):

* ``spec_compat/shims`` is the bottom layer: its modules import neither the core, nor the patches,
  nor the CLI, and never read the environment (the patches hand them the values parsed in
  ``spec_compat/core/switches.py``, the one place every switch is parsed);
* ``spec_compat/core`` names no patch, shim or CLI module (the patches declare; the core decides);
* the modules' imports form no cycle: module-level imports (``TYPE_CHECKING`` blocks included: a
  type checker follows them) must not, and the cycles that only function-level imports close are
  listed by name, so that a new one is a conscious choice.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "spec_compat"
NAME = PACKAGE.name

#: cycles closed only through imports inside functions (lazy on purpose: the registry loads the
#: patches on first use, ``import spec_compat`` stays cheap); each entry is the cycle's modules, sorted
KNOWN_LAZY_CYCLES: set[tuple[str, ...]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES: dict[str, ast.Module] = {m: ast.parse(p.read_text(encoding="utf-8"), str(p)) for m, p in MODULES.items()}


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The absolute name ``from ... import`` refers to in ``module``."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported module of the package, line, whether at module level) for every import in ``module``;
    ``from X import name`` counts as importing ``X.name`` where that is a module of the package."""
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, top) for a in child.names if a.name.split(".")[0] == NAME)
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(module, child)
                if base.split(".")[0] == NAME:
                    for a in child.names:
                        sub = f"{base}.{a.name}"
                        out.append((sub if sub in MODULES else base, child.lineno, top))
            visit(child, inner)

    visit(TREES[module], True)
    return out


def _under(name: str, layer: str) -> bool:
    prefix = f"{NAME}.{layer}"
    return name == prefix or name.startswith(prefix + ".")


def _environment_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """``os.environ`` (``os.environ.get`` too), ``os.getenv``, ``from os import environ`` / ``getenv``
    (a parameter named ``environ`` holding a mapping is no read)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb", "putenv"):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [(node.lineno, f"from os import {a.name}") for a in node.names
                      if a.name in ("environ", "getenv", "environb")]
    return sorted(found)


def test_the_package_is_found():
    assert {f"{NAME}.core.registry", f"{NAME}.shims.draft_heads", f"{NAME}.plugin"} <= set(MODULES)


@pytest.mark.parametrize("module", [m for m in MODULES if _under(m, "shims")])
def test_shims_import_no_core_patches_or_cli(module):
    bad = [f"line {line}: {name}" for name, line, _ in _imports(module)
           if any(_under(name, layer) for layer in ("core", "patches", "cli"))
           or name == NAME]  # the package itself is the core's front
    assert not bad, (f"{MODULES[module]} imports {'; '.join(bad)}: a shim is handed what it needs by the patch "
                     "(or cli) that calls it")


@pytest.mark.parametrize("module", [m for m in MODULES if _under(m, "shims")])
def test_shims_read_no_environment(module):
    reads = _environment_reads(TREES[module])
    assert not reads, (f"{MODULES[module]} reads the environment ({'; '.join(f'line {n}: {w}' for n, w in reads)}): "
                       "parse the switch in spec_compat/core/switches.py, document it in docs/switches.md and "
                       "pass the value from the patch")


@pytest.mark.parametrize("module", [m for m in MODULES if _under(m, "core")])
def test_core_imports_no_patches_shims_or_cli(module):
    bad = [f"line {line}: {name}" for name, line, _ in _imports(module)
           if any(_under(name, layer) for layer in ("patches", "shims", "cli"))]
    assert not bad, f"{MODULES[module]} imports {'; '.join(bad)}: the core names no patch, shim or command"


def _graph(module_level_only: bool) -> dict[str, set[str]]:
    return {m: {name for name, _, top in _imports(m) if name in MODULES and name != m
                and (top or not module_level_only)} for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each listed
    in one cycle's order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(_one_cycle(graph, set(component)))
    return components


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A path start -> ... -> start inside ``component`` (for the message)."""
    start = min(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for child in sorted(graph[node] & component):
            if child == start:
                return paths[node] + [start]
            if child not in paths:
                paths[child] = paths[node] + [child]
                todo.append(child)
    return sorted(component)  # pragma: no cover - a component always holds a cycle


def test_module_level_imports_form_no_cycle():
    cycles = _cycles(_graph(module_level_only=True))
    assert not cycles, "module-level import cycle(s): " + "; ".join(" -> ".join(c) for c in cycles)


def test_function_level_imports_close_only_the_known_cycles():
    found = {tuple(sorted(set(c))) for c in _cycles(_graph(module_level_only=False))}
    new = found - KNOWN_LAZY_CYCLES
    assert not new, ("import cycle(s) closed by imports inside functions: "
                     + "; ".join(" -> ".join(c) for c in _cycles(_graph(False)) if tuple(sorted(set(c))) in new)
                     + " (move the shared part down a layer, or list it in KNOWN_LAZY_CYCLES saying why)")
    assert not KNOWN_LAZY_CYCLES - found, f"no longer cycles, drop them: {sorted(KNOWN_LAZY_CYCLES - found)}"


def test_the_checks_see_what_they_look_for():
    """The detectors themselves: a shim importing the core, reading the environment, and a cycle."""
    tree = ast.parse("import os\nx = os.environ.get('A')\ny = os.getenv('B')\nfrom os import environ\n")
    assert [n for n, _ in _environment_reads(tree)] == [2, 3, 4]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert any(_under(name, "core") for name, _, _ in _imports(f"{NAME}.core.registry"))
