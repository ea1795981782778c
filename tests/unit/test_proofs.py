"""Every registered patch declares how its need is proven (``Patch.proof``), and the
declaration is checked against the test it names, without running it:

* the test exists in the named file, is parametrized with ``proof_cases("<its name>")`` (so the
  patch's case is a collected item) and takes the ``prove`` fixture;
* a symptom proof's test asserts the symptom and its absence, an optimisation's test compares
  output with and without, a measured claim names a recorded benchmark JSON;
* a proof's key changes whenever one of its inputs changes (patch source, proof test source,
  the versions of the cell), so an unchanged proof is re-run exactly when it must be.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from spec_compat import REGISTRY
from spec_compat import patches  # noqa: F401  (registers every patch)
from spec_compat.core.proof import (BENCHMARK_KINDS, MEASURED, SYMPTOM_KINDS, Proof, ProofDeclarationError, ProofRun,
                               proof_cases, proof_key)

ROOT = Path(__file__).resolve().parents[2]
ALL = sorted(p.id for p in REGISTRY.patches())


def _function(proof: Proof) -> ast.FunctionDef:
    path = ROOT / proof.test_file
    assert path.is_file(), f"proof test file {proof.test_file} does not exist"
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == proof.test_function:
            return node
    raise AssertionError(f"{proof.test}: no module-level function {proof.test_function}")


def _calls(fn: ast.FunctionDef) -> set[str]:
    return {n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}


@pytest.mark.parametrize("pid", ALL)
def test_every_patch_declares_a_checked_proof(pid):
    proof = REGISTRY.get(pid).proof
    assert isinstance(proof, Proof), f"{pid} declares no proof (Patch.proof)"
    assert "TODO" not in proof.symptom and "TODO" not in proof.benchmark, proof
    fn = _function(proof)
    # parametrized with the declared cases of its own name
    params = [d for d in fn.decorator_list if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("parametrize")]
    assert any(ast.unparse(d) == f"pytest.mark.parametrize('pid', proof_cases({proof.test_function!r}))"
               for d in params), f"{proof.test}: not parametrized with proof_cases({proof.test_function!r})"
    assert pid in proof_cases(proof.test_function)
    assert {"prove", "pid"} <= {a.arg for a in fn.args.args}, f"{proof.test}: takes no prove / pid"
    calls = _calls(fn)
    if proof.kind in SYMPTOM_KINDS:
        assert {"assert_symptom", "assert_absent"} <= calls, f"{proof.test}: does not assert the symptom both ways"
        assert "disable" in {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}
    if proof.kind == "optimization":
        assert "assert_identical" in calls, f"{proof.test}: does not compare output with and without {pid}"
    if proof.kind in BENCHMARK_KINDS:
        path = ROOT / proof.benchmark
        assert path.is_file(), f"{pid}: {proof.benchmark} is not recorded"
        assert json.loads(path.read_text()), f"{pid}: {proof.benchmark} is empty"


@pytest.mark.parametrize("pid", proof_cases("test_measured_proofs_name_a_recorded_benchmark"))
def test_measured_proofs_name_a_recorded_benchmark(prove, pid):
    """A claim measured only (nothing fails without the patch here): its JSON is recorded and
    holds the figures the patch's docs state (see the patch's docstring)."""
    run = prove(pid)
    assert run.proof.test == MEASURED and run.proof.kind == "measured"
    data = json.loads((ROOT / run.proof.benchmark).read_text())
    assert isinstance(data, (dict, list)) and data


@pytest.mark.parametrize("bad", [
    dict(kind="crashes", test="tests/x.py::test_y", symptom="E"),
    dict(kind="fails", test="tests/x.py:test_y", symptom="E"),
    dict(kind="fails", test="tests/x.py::test_y"),
    dict(kind="optimization", test="tests/x.py::test_y", benchmark="RESULTS.md"),
    dict(kind="fails", test="tests/x.py::test_y", symptom="(unclosed"),
])
def test_malformed_declarations_are_refused(bad):
    with pytest.raises(ProofDeclarationError):
        Proof(**bad)


def test_proof_run_lists_what_the_test_did_not_do():
    proof = Proof("fails", "tests/x.py::test_y", r"TypeError: .*block_size", also_off=("other",))
    run = ProofRun("p", proof)
    assert len(run.problems()) == 3  # never disabled, no symptom, no absence check
    assert run.disable == "p,other" and run.baseline == "other"
    with pytest.raises(AssertionError, match="does not show the declared symptom"):
        run.assert_symptom("RuntimeError: something unrelated")
    assert run.assert_symptom("x\nFAIL short: TypeError: got no block_size\n") == "FAIL short: TypeError: got no block_size"
    with pytest.raises(AssertionError, match="shows the symptom too"):
        run.assert_absent("TypeError: no block_size")
    run.assert_absent("selftest: OK")
    assert run.problems() == []
    wrong = ProofRun("p", proof)
    wrong.disabled.append("p")  # the superseding patch left on
    wrong.symptom_seen, wrong.absent_checked = "x", True
    assert wrong.problems() == ["disabled ['p'], declared 'p,other'"]


def _tree(tmp_path: Path) -> tuple[Path, Proof, Path]:
    root = tmp_path / "repo"
    (root / "spec_compat" / "patches").mkdir(parents=True)
    (root / "spec_compat" / "shims").mkdir()
    (root / "spec_compat" / "cli").mkdir()
    (root / "tests" / "engine").mkdir(parents=True)
    (root / "spec_compat" / "__init__.py").write_text("")
    (root / "spec_compat" / "patches" / "__init__.py").write_text("from . import mine, other\n")
    (root / "spec_compat" / "patches" / "mine.py").write_text("from ..shims import helper\nX = 1\n")
    (root / "spec_compat" / "patches" / "other.py").write_text("Y = 1\n")
    (root / "spec_compat" / "shims" / "__init__.py").write_text("")
    (root / "spec_compat" / "shims" / "helper.py").write_text("Z = 1\n")
    (root / "spec_compat" / "cli" / "selftest.py").write_text("S = 1\n")
    (root / "tests" / "conftest.py").write_text("C = 1\n")
    (root / "tests" / "engine" / "test_x.py").write_text("def test_y(): pass\n")
    proof = Proof("fails", "tests/engine/test_x.py::test_y", "E")
    return root, proof, root / "spec_compat" / "patches" / "mine.py"


VERSIONS = {"speculators": "0.3.0", "vllm": "0.16.0", "transformers": "4.57.6", "torch": "2.10.0"}


@pytest.mark.parametrize("change", [
    "patch source", "shim the patch imports", "proof test", "conftest above the test", "harness module",
    "speculators version", "vllm version", "transformers version", "torch version", "symptom declared"])
def test_changing_any_input_changes_the_key(tmp_path, change):
    """An unchanged key means the recorded pass stands (CI skips the proof); each input alone
    must change it, so that CI re-runs the proof."""
    root, proof, patch_file = _tree(tmp_path)
    key, files = proof_key("mine", proof, patch_file, root, VERSIONS)
    assert "spec_compat/patches/other.py" not in files  # another patch's source is not an input
    assert proof_key("mine", proof, patch_file, root, dict(VERSIONS))[0] == key  # deterministic
    versions = dict(VERSIONS)
    edits = {
        "patch source": root / "spec_compat/patches/mine.py",
        "shim the patch imports": root / "spec_compat/shims/helper.py",
        "proof test": root / "tests/engine/test_x.py",
        "conftest above the test": root / "tests/conftest.py",
        "harness module": root / "spec_compat/cli/selftest.py",
    }
    if change in edits:
        edits[change].write_text(edits[change].read_text() + "CHANGED = 1\n")
    elif change.endswith(" version"):
        versions[change.split()[0]] += ".post1"
    else:
        proof = Proof("fails", proof.test, "E2")
    assert proof_key("mine", proof, patch_file, root, versions)[0] != key, change


def test_another_patch_changing_keeps_the_key(tmp_path):
    """Even when the harness borrows a helper from that other patch's module."""
    root, proof, patch_file = _tree(tmp_path)
    (root / "spec_compat" / "cli" / "selftest.py").write_text("from ..patches.other import Y\nS = 1\n")
    key, files = proof_key("mine", proof, patch_file, root, VERSIONS)
    assert "spec_compat/cli/selftest.py" in files and "spec_compat/patches/other.py" not in files
    (root / "spec_compat/patches/other.py").write_text("Y = 2\n")
    assert proof_key("mine", proof, patch_file, root, VERSIONS)[0] == key


def test_comments_docstrings_and_the_patch_list_change_no_key(tmp_path):
    """A key changes with code only: a comment, a docstring, a blank line, the list of patch
    modules (patches/__init__.py) and the generated manifest are not inputs."""
    root, proof, patch_file = _tree(tmp_path)
    (root / "spec_compat" / "core").mkdir()
    (root / "spec_compat" / "core" / "manifest.py").write_text("PATCH_IDS = ('mine',)\n")
    (root / "spec_compat" / "patches" / "mine.py").write_text(
        "from ..shims import helper\nfrom ..core import manifest\nX = 1\n")
    key, files = proof_key("mine", proof, patch_file, root, VERSIONS)
    assert "spec_compat/core/manifest.py" not in files and "spec_compat/patches/__init__.py" not in files
    patch_file.write_text('"""A docstring."""\n# a comment\nfrom ..shims import helper\n\n'
                          "from ..core import manifest\nX = 1  # why\n")
    (root / "spec_compat" / "patches" / "__init__.py").write_text("from . import mine, other, third\n")
    (root / "spec_compat" / "core" / "manifest.py").write_text("PATCH_IDS = ('mine', 'third')\n")
    assert proof_key("mine", proof, patch_file, root, VERSIONS)[0] == key
    patch_file.write_text(patch_file.read_text().replace("X = 1", "X = 2"))
    assert proof_key("mine", proof, patch_file, root, VERSIONS)[0] != key

