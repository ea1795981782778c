"""Proof-of-need bookkeeping for every test directory (see :mod:`spec_compat.core.proof`).

* ``prove(pid)`` (fixture): the :class:`~spec_compat.core.proof.ProofRun` of the patch a proof test
  proves; after the test passed, it must have disabled exactly the declared ids and asserted
  the declared symptom (and its absence with the patch on), else the test errors.
* Collection: a proof item (marked ``proof``: ``-m proof`` runs the proofs alone) (a test named by some patch's ``proof.test``, parametrized with that
  patch's ``pid``) gets its key (:func:`spec_compat.core.proof.proof_key`) as a junit property, which
  ``matrix/record`` stores with the pass.  With ``SPEC_COMPAT_PROOFS=changed`` (``matrix/test``,
  CI) a proof item whose key equals the one recorded at its last pass in this cell is skipped,
  naming that pass; ``matrix/run`` alone runs every proof.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROOF_RECORDS = ROOT / "matrix" / "results" / "proofs"


def _patch_of(item: pytest.Item):
    """The registered patch whose proof this item is, or None."""
    callspec = getattr(item, "callspec", None)
    pid = callspec.params.get("pid") if callspec is not None else None
    if not isinstance(pid, str):
        return None
    from spec_compat import REGISTRY
    from spec_compat import patches  # noqa: F401

    try:
        patch = REGISTRY.get(pid)
    except KeyError:
        return None
    proof = patch.proof
    if proof is None or proof.test_function != item.originalname:
        return None
    if Path(str(item.fspath)).resolve() != (ROOT / proof.test_file).resolve():
        return None
    return patch


def _versions() -> dict[str, str | None]:
    from spec_compat.core.versions import installed_version

    from spec_compat.core.proof import KEY_DISTRIBUTIONS

    return {d: installed_version(d) for d in KEY_DISTRIBUTIONS}


def _recorded(cell: str) -> dict[str, dict]:
    path = PROOF_RECORDS / f"{cell}.json"
    return json.loads(path.read_text()).get("proofs", {}) if path.is_file() else {}


def pytest_collection_modifyitems(config, items):
    import sys

    from spec_compat.core.proof import proof_key

    mode = os.environ.get("SPEC_COMPAT_PROOFS", "all")
    if mode not in ("all", "changed"):
        raise pytest.UsageError(f"SPEC_COMPAT_PROOFS={mode!r}: expected 'all' or 'changed'")
    cell = os.environ.get("SPEC_COMPAT_CELL", "")
    recorded = _recorded(cell) if mode == "changed" and cell else {}
    versions = None
    for item in items:
        patch = _patch_of(item)
        if patch is None:
            continue
        versions = versions or _versions()
        patch_file = Path(sys.modules[type(patch).__module__].__file__).resolve()
        key, _files = proof_key(patch.id, patch.proof, patch_file, ROOT, versions)
        item.add_marker(pytest.mark.proof)
        item.user_properties.append(("proof_key", key))
        item.user_properties.append(("proof_pid", patch.id))
        last = recorded.get(item.nodeid)
        if last and last.get("key") == key:
            item.add_marker(pytest.mark.skip(
                reason=f"proof of {patch.id}: passed in {cell} at {last.get('commit', '?')} "
                       f"({last.get('date', '?')}) with the same inputs (key {key[:12]})"))


@pytest.fixture
def prove(request):
    """``prove(pid)`` -> the ProofRun of the patch this proof test proves (checked after the test)."""
    from spec_compat import REGISTRY
    from spec_compat import patches  # noqa: F401
    from spec_compat.core.proof import ProofRun

    runs: list[ProofRun] = []

    def get(pid: str) -> ProofRun:
        proof = REGISTRY.get(pid).proof
        assert proof is not None, f"{pid} declares no proof"
        assert proof.test_function == request.node.originalname, (
            f"{pid}'s proof is {proof.test}, not {request.node.nodeid}")
        run = ProofRun(pid, proof)
        runs.append(run)
        return run

    yield get
    rep = getattr(request.node, "_proof_call_report", None)
    if rep is None or not rep.passed:
        return  # failed or skipped: nothing to check
    problems = [f"{r.pid}: {p}" for r in runs for p in r.problems()]
    if _patch_of(request.node) is not None and not runs:
        problems.append("a proof test that never called prove(pid)")
    if problems:
        pytest.fail("proof incomplete: " + "; ".join(problems), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call":
        item._proof_call_report = outcome.get_result()
