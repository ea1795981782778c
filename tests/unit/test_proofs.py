"""Every registered patch declares how its need is proven (``Patch.proof``), and the
declaration is checked against the test it names, without running it:

* the test exists in the named file, is parametrized with ``proof_cases("<its name>")`` (so the
  patch's case is a collected item) and takes the ``prove`` fixture;
* a symptom proof's test asserts the symptom and its absence, an optimisation's test compares
  output with and without, a measured claim names a recorded benchmark JSON;
* (what a recorded pass depends on: tests/unit/test_proof_keys.py).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from spec_compat import REGISTRY
from spec_compat import patches  # noqa: F401  (registers every patch)
from spec_compat.core.proof import BENCHMARK_KINDS, MEASURED, SYMPTOM_KINDS, Proof, ProofDeclarationError
from proof_runs import ProofRun, proof_cases  # tests/support

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
