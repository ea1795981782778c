"""Every registered patch declares how its need is proven (``Patch.proof``), and the
declaration is checked against the test it names, without running it:

* the test exists in the named file, is parametrized with ``proof_cases("<its name>")`` (so the
  patch's case is a collected item) and takes the ``prove`` fixture;
* a symptom proof's test asserts the symptom and its absence, an optimisation's test compares
  output with and without;
* a benchmark proof's (``measured``, ``optimization``) figures are re-derived from its recorded
  JSON: both sides of each declared ratio present, finite and positive, their ratio the stated one;
  a planted wrong figure fails;
* which proofs have a recorded pass (``spec_compat/cli/proof_status.py``, from the records
  ``matrix/record --render`` ships): ``report`` and docs/patches.md mark unproven hardware proofs;
* (what a recorded pass depends on: tests/unit/test_proof_keys.py).
"""

from __future__ import annotations

import ast
import copy
import json
import math
from pathlib import Path

import pytest

from spec_compat import REGISTRY
from spec_compat import patches  # noqa: F401  (registers every patch)
from spec_compat.core.proof import (BENCHMARK_KINDS, MEASURED, SYMPTOM_KINDS, Claim, Proof, ProofDeclarationError,
                                    parse_path)
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


def _resolve(data, path: str, steps=None):
    """The value at a claim's path (KeyError naming the step that is missing or ambiguous);
    ``steps``: only these of its parsed steps."""
    node = data
    for key, fields in parse_path(path) if steps is None else steps:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            raise KeyError(f"{path}: no {key!r}")
        if fields:
            hits = [e for e in node if isinstance(e, dict) and all(k in e and str(e[k]) == v for k, v in fields)] \
                if isinstance(node, list) else []
            if len(hits) != 1:
                raise KeyError(f"{path}: {len(hits)} elements of {key!r} have {dict(fields)}")
            node = hits[0]
    return node


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _side(data, path: str, paired: bool) -> list[float] | float:
    """One side of a ratio: a finite positive number, or (repeats) a non-empty list of them."""
    got = _resolve(data, path)
    values = got if isinstance(got, list) else [got]
    assert values and (paired <= isinstance(got, list)), f"{path}: {got!r} is not {'a list' if paired else 'a value'}"
    for v in values:
        assert isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0, \
            f"{path}: {v!r} is not a finite positive measurement"
    return got


def derive(claim: Claim, data) -> float:
    """A claim's ratio, re-derived from both sides in ``data`` (see :class:`Claim`)."""
    a = _side(data, claim.numerator, claim.paired)
    b = _side(data, claim.denominator, claim.paired)
    if claim.paired:
        assert len(a) == len(b), f"{claim.what}: {len(a)} vs {len(b)} repeats are not pairs"
        return _median([x / y for x, y in zip(a, b)])
    return (_median(a) if isinstance(a, list) else a) / (_median(b) if isinstance(b, list) else b)


def check_claims(pid: str, proof: Proof, read=lambda rel: json.loads((ROOT / rel).read_text())) -> list[str]:
    """Each declared figure re-derived from its JSON; the lines (``figure = a / b``) it found."""
    assert proof.claims, f"{pid}: a {proof.kind} proof states no figure"
    lines = []
    for claim in proof.claims:
        rel = proof.benchmark_of(claim)
        assert (ROOT / rel).is_file(), f"{pid}: {rel} is not recorded"
        try:
            figure = derive(claim, read(rel))
        except KeyError as exc:
            raise AssertionError(f"{pid}: {claim.what}: {rel} lacks {exc}") from None
        assert claim.holds(figure), (f"{pid}: {claim.what}: {rel} gives {claim.numerator} / {claim.denominator} = "
                                     f"{figure:.5g}, the patch states {claim.stated()}")
        lines.append(f"{claim.what}: {figure:.5g} ({claim.stated()})")
    return lines


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
        check_claims(pid, proof)


@pytest.mark.parametrize("pid", proof_cases("test_measured_proofs_name_a_recorded_benchmark"))
def test_measured_proofs_name_a_recorded_benchmark(prove, pid):
    """A claim measured only (nothing fails without the patch here): its JSON is recorded and
    holds the figures the patch's docs state (see the patch's docstring): each declared ratio
    re-derived from both sides, present, finite and positive, is the stated one."""
    run = prove(pid)
    assert run.proof.test == MEASURED and run.proof.kind == "measured"
    data = json.loads((ROOT / run.proof.benchmark).read_text())
    assert isinstance(data, (dict, list)) and data
    assert check_claims(pid, run.proof)


@pytest.mark.parametrize("bad", [
    dict(kind="crashes", test="tests/x.py::test_y", symptom="E"),
    dict(kind="fails", test="tests/x.py:test_y", symptom="E"),
    dict(kind="fails", test="tests/x.py::test_y"),
    dict(kind="optimization", test="tests/x.py::test_y", benchmark="RESULTS.md"),
    dict(kind="fails", test="tests/x.py::test_y", symptom="(unclosed"),
    # a benchmark proof states figures; other kinds have none to state
    dict(kind="measured", test="tests/x.py::test_y", benchmark="benchmarks/results/x.json"),
    dict(kind="fails", test="tests/x.py::test_y", symptom="E", claims=(Claim("r", "a", "b", value="2"),)),
    dict(kind="measured", test="tests/x.py::test_y", benchmark="benchmarks/results/x.json", claims=("a/b = 2",)),
])
def test_malformed_declarations_are_refused(bad):
    with pytest.raises(ProofDeclarationError):
        Proof(**bad)


@pytest.mark.parametrize("bad", [
    dict(what="", numerator="a", denominator="b", value="2"),
    dict(what="r", numerator="a", denominator="a", value="2"),          # one value, not both sides
    dict(what="r", numerator="a..b", denominator="c", value="2"),
    dict(what="r", numerator="a[mode]", denominator="c", value="2"),    # a selector is field=value
    dict(what="r", numerator="", denominator="c", value="2"),
    dict(what="r", numerator="a", denominator="b"),                     # no figure stated
    dict(what="r", numerator="a", denominator="b", value=2.07),         # the figure as written: a string
    dict(what="r", numerator="a", denominator="b", value="~2"),
    dict(what="r", numerator="a", denominator="b", value="0"),
    dict(what="r", numerator="a", denominator="b", at_least=0),
    dict(what="r", numerator="a", denominator="b", at_least=float("nan")),
    dict(what="r", numerator="a", denominator="b", at_least=True),
    dict(what="r", numerator="a", denominator="b", at_least=2, at_most=1),
    dict(what="r", numerator="a", denominator="b", value="2", paired="yes"),
    dict(what="r", numerator="a", denominator="b", value="2", benchmark="RESULTS.md"),
])
def test_malformed_claims_are_refused(bad):
    with pytest.raises(ProofDeclarationError):
        Claim(**bad)


def test_claim_paths_and_figures():
    assert parse_path("results[mode=a,seq_len=2048].step_ms") == (
        ("results", (("mode", "a"), ("seq_len", "2048"))), ("step_ms", ()))
    assert parse_path("median_seconds.compiled (patch off)") == (("median_seconds", ()), ("compiled (patch off)", ()))
    data = {"results": [{"mode": "a", "seq_len": 2048, "ms": [30.0, 10.0, 20.0]},
                        {"mode": "b", "seq_len": 2048, "ms": [2.0, 1.0, 3.0, 4.0]}], "n": {"x": 5}}
    two = Claim("a/b", "results[mode=a,seq_len=2048].ms", "results[mode=b].ms", value="8.0")
    assert derive(two, data) == 20.0 / 2.5 and two.holds(8.0) and two.holds(8.04) and not two.holds(8.06)
    assert derive(Claim("i", "results.0.ms", "n.x", at_least=1), data) == 4.0
    assert Claim("r", "a", "b", at_least=0.84, at_most=0.89).stated() == "in [0.84, 0.89]"
    pairs = {"a": [3.0, 10.0, 4.0], "b": [1.0, 2.0, 2.0]}
    assert derive(Claim("p", "a", "b", value="3", paired=True), pairs) == 3.0  # median of 3, 5, 2
    with pytest.raises(KeyError, match="2 elements"):
        derive(Claim("r", "results[seq_len=2048].ms", "n.x", value="1"), data)
    for bad in ({"a": 0, "b": 1}, {"a": float("inf"), "b": 1}, {"a": True, "b": 1}, {"a": "2", "b": 1},
                {"a": [], "b": 1}):
        with pytest.raises(AssertionError, match="a: "):
            derive(Claim("r", "a", "b", value="1"), bad)
    with pytest.raises(AssertionError, match="not pairs"):
        derive(Claim("p", "a", "b", value="1", paired=True), {"a": [1.0, 2.0], "b": [1.0]})


def _benchmark_proofs() -> list[str]:
    return sorted(p.id for p in REGISTRY.patches() if p.proof is not None and p.proof.kind in BENCHMARK_KINDS)


@pytest.mark.parametrize("pid", _benchmark_proofs())
def test_a_planted_wrong_figure_fails(pid):
    """Each benchmark proof's check catches a JSON whose measurement differs from the stated
    figure (one side of each claim scaled in a copy of the JSON), and a declaration that claims
    more than was measured."""
    proof = REGISTRY.get(pid).proof
    assert check_claims(pid, proof)
    for claim in proof.claims:
        def alone(c: Claim) -> Proof:  # the proof with this one claim, so no other claim fails first
            return Proof(proof.kind, proof.test, benchmark=proof.benchmark, claims=(c,))

        rel = proof.benchmark_of(claim)
        planted = copy.deepcopy(json.loads((ROOT / rel).read_text()))
        steps = parse_path(claim.numerator)
        parent, (key, fields) = _resolve(planted, claim.numerator, steps[:-1]), steps[-1]
        assert not fields, f"{pid}: the last step of {claim.numerator} selects; plant it by hand"
        # one side changed, so the ratio leaves what is stated: half again a stated value, else past a bound
        figure = derive(claim, json.loads((ROOT / rel).read_text()))
        factor = (1.5 if claim.value else 0.9 * claim.at_least / figure if claim.at_least is not None
                  else 1.1 * claim.at_most / figure)
        side = parent[key]
        parent[key] = [x * factor for x in side] if isinstance(side, list) else side * factor

        def read(r, _rel=rel, _planted=planted):
            return _planted if r == _rel else json.loads((ROOT / r).read_text())

        assert check_claims(pid, alone(claim))
        with pytest.raises(AssertionError, match="the patch states"):
            check_claims(pid, alone(claim), read)
        # the true JSON, a declaration claiming half again the measured figure
        overclaimed = Claim(claim.what, claim.numerator, claim.denominator, value=f"{figure * 1.5:.2f}",
                            paired=claim.paired, benchmark=claim.benchmark)
        with pytest.raises(AssertionError, match="the patch states"):
            check_claims(pid, alone(overclaimed))


def test_proof_run_lists_what_the_test_did_not_do():
    proof = Proof("fails", "tests/x.py::test_y", r"TypeError: .*block_size", also_off=("other",))
    run = ProofRun("p", proof)
    assert len(run.problems()) == 3  # never disabled, no symptom, no absence check
    assert run.disable == "p,other" and run.baseline == "other"
    with pytest.raises(AssertionError, match="does not show the declared symptom"):
        run.assert_symptom("RuntimeError: something unrelated")
    assert run.assert_symptom("x\nFAIL short: TypeError: got no block_size\n", report=True) == \
        "FAIL short: TypeError: got no block_size"
    with pytest.raises(AssertionError, match="shows the symptom too"):
        run.assert_absent("TypeError: no block_size")
    run.assert_absent("selftest: OK")
    assert run.problems() == []
    wrong = ProofRun("p", proof)
    wrong.disabled.append("p")  # the superseding patch left on
    wrong.symptom_seen, wrong.absent_checked = "x", True
    assert wrong.problems() == ["disabled ['p'], declared 'p,other'"]


# -- which proofs have a recorded pass (shipped in spec_compat/data/tested_cells.json) ---------

def test_proof_records_condense_to_the_cells_where_each_proof_passed():
    from matrix_cells import load_records  # tests/support

    records = load_records()
    got = records.condense_proofs([
        {"cell": "c2", "proofs": {"tests/a.py::test_x[p]": {"pid": "p"}, "tests/b.py::test_y[q]": {"pid": "q"}}},
        {"cell": "c1", "proofs": {"tests/a.py::test_x[p]": {"pid": "p"}, "tests/old.py::test_z[p]": {"pid": "p"}}},
        {"cell": "c3", "proofs": {}},
    ])
    assert got == {"p": {"tests/a.py::test_x": ["c1", "c2"], "tests/old.py::test_z": ["c1"]},
                   "q": {"tests/b.py::test_y": ["c2"]}}
    assert records.condense([], [])["proofs"] == {}
    # what ships is matrix/results/proofs/*.json condensed (matrix/record --render)
    from spec_compat.cli.proof_status import load_proof_records

    assert load_proof_records() == records.condense_proofs(records.load_proof_records()), \
        "spec_compat/data/tested_cells.json is out of date: run matrix/record --render"


def test_proof_status_counts_a_pass_of_the_declared_test_only(tmp_path):
    from spec_compat.cli.proof_status import load_proof_records, proof_status, proof_statuses, unproven

    hw = Proof("hardware", "tests/gpu/test_g.py::test_h", "E")
    assert proof_status(hw, {"tests/gpu/test_g.py::test_h": ["c2", "c1"]}) == {
        "kind": "hardware", "test": hw.test, "status": "recorded", "recorded_in": ["c1", "c2"]}
    # a pass recorded for the test the proof named before is not a pass of this one
    assert proof_status(hw, {"tests/gpu/test_old.py::test_h": ["c1"]})["status"] == "unproven"
    assert proof_status(hw, None) == {"kind": "hardware", "test": hw.test, "status": "unproven", "recorded_in": []}
    assert proof_status(None, None) is None
    statuses = {"a": proof_status(hw, None), "b": proof_status(Proof("fails", "tests/x.py::test_y", "E"), None),
                "c": proof_status(hw, {hw.test: ["c1"]}), "d": None}
    assert unproven(statuses) == ["a"] and unproven(statuses, kinds=("hardware", "fails")) == ["a", "b"]
    assert load_proof_records(tmp_path / "missing.json") == {}
    (tmp_path / "old.json").write_text(json.dumps({"cells": []}))  # shipped before proofs were
    assert load_proof_records(tmp_path / "old.json") == {}
    shipped = proof_statuses(REGISTRY.patches())
    assert set(shipped) == set(ALL) and all(s["status"] in ("recorded", "unproven") for s in shipped.values())


def test_unproven_hardware_proofs_are_marked_in_report_and_patch_table(monkeypatch):
    from spec_compat.cli import proof_status, report

    hardware = [pid for pid in ALL if REGISTRY.get(pid).proof.kind == "hardware"]
    assert hardware
    for recorded in ({}, {pid: {REGISTRY.get(pid).proof.test: ["cell"]} for pid in hardware}):
        monkeypatch.setattr(proof_status, "load_proof_records", lambda *a, _r=recorded: _r)
        table = {row.split("|")[1].strip(" `"): row for row in report.patch_table().splitlines()[2:]}
        assert set(table) == set(ALL)
        marked = {pid for pid, row in table.items() if "**unproven**" in row}
        assert marked == (set() if recorded else set(hardware))
        statuses = proof_status.proof_statuses(REGISTRY.patches())
        data = {"spec_compat": "0", "versions": {}, "providers": {}, "notes": [],
                "platform": {"python": "3", "machine": "x", "vllm_platform": "cpu", "cuda_available": False},
                "tested": {"tested": True, "message": "tested"},
                "patches": [{"id": pid, "status": "applied", "target": "t", "reason": "r", "proof": statuses[pid]}
                            for pid in ALL]}
        lines = [line for line in report.report_text(data).splitlines() if "unproven" in line]
        if recorded:
            assert lines == []
        else:
            assert lines == [f"  proofs        unproven (hardware proof, no recorded pass): {', '.join(hardware)}"]
