"""Proof-of-need bookkeeping for every test directory (see :mod:`spec_compat.core.proof`): a pytest
plugin, registered by ``pytest_plugins`` in ``tests/conftest.py``.

* ``prove(pid)`` (fixture): the :class:`~spec_compat.core.proof.ProofRun` of the patch a proof test
  proves; after the test passed, it must have disabled exactly the declared ids and asserted
  the declared symptom (and its absence with the patch on), else the test errors.
* A proof item (a test named by some patch's ``proof.test``, parametrized with that patch's
  ``pid``; marked ``proof``: ``-m proof`` runs the proofs alone) runs traced: every process it starts
  notes the project files it imports and its environment's versions (``tests/support/proof_keys.py``);
  after the test, its inputs and key are junit properties, which ``matrix/record`` stores with the
  pass.  With ``SPEC_COMPAT_PROOFS=changed`` (``matrix/test``, CI) a proof item whose recorded
  inputs give today the key recorded at its last pass in this cell is skipped, naming that pass;
  ``matrix/run`` alone runs every proof.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def _recorded(cell: str) -> dict[str, dict]:
    path = PROOF_RECORDS / f"{cell}.json"
    return json.loads(path.read_text()).get("proofs", {}) if path.is_file() else {}


def pytest_collection_modifyitems(config, items):
    import proof_keys

    mode = os.environ.get("SPEC_COMPAT_PROOFS", "all")
    if mode not in ("all", "changed"):
        raise pytest.UsageError(f"SPEC_COMPAT_PROOFS={mode!r}: expected 'all' or 'changed'")
    cell = os.environ.get("SPEC_COMPAT_CELL", "")
    recorded = _recorded(cell) if mode == "changed" and cell else {}
    envs = proof_keys.CurrentEnvs()
    for item in items:
        patch = _patch_of(item)
        if patch is None:
            continue
        item.add_marker(pytest.mark.proof)
        item.user_properties.append(("proof_pid", patch.id))
        last = recorded.get(item.nodeid)
        if not last or "inputs" not in last:
            continue
        key = proof_keys.current_key(patch.id, repr(patch.proof), last["inputs"], envs)
        if key == last.get("key"):
            item.add_marker(pytest.mark.skip(
                reason=f"proof of {patch.id}: passed in {cell} at {last.get('commit', '?')} "
                       f"({last.get('date', '?')}) with the same inputs ({len(last['inputs'].get('files', ()))} "
                       f"files, key {key[:12]})"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """A proof item runs traced from its setup to its teardown (processes its fixtures start too)."""
    patch = _patch_of(item) if item.get_closest_marker("proof") else None
    if patch is not None:
        import importlib.util
        import tempfile

        import proof_keys

        trace_dir = Path(tempfile.mkdtemp(prefix="proof-trace-"))
        saved = {k: os.environ.get(k) for k in ("PROOF_TRACE_DIR", "PROOF_TRACE_ROOT", "PROOF_TRACE_DISTS", "PYTHONPATH")}
        spec = importlib.util.spec_from_file_location("_proof_trace_site", proof_keys.TRACE_SITE / "sitecustomize.py")
        site = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(site)
        stop = site.install(str(trace_dir), str(ROOT), list(proof_keys.KEY_DISTRIBUTIONS))  # this process
        os.environ.update(proof_keys.trace_env(trace_dir))  # and every process it starts
        item._proof_trace = (patch, trace_dir, saved, stop)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield
    state = getattr(item, "_proof_trace", None)
    if state is None:
        return
    import shutil

    import proof_keys
    from spec_compat import REGISTRY

    patch, trace_dir, saved, stop = state
    if stop is not None:
        stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    keep = proof_keys.patch_modules(patch, REGISTRY)
    test_file = ROOT / patch.proof.test_file
    conftests = [d / "conftest.py" for d in test_file.parents if ROOT in d.parents or d == ROOT]
    files = proof_keys.static_closure([test_file, *conftests, *(ROOT / k for k in keep)], keep_patches=keep)
    traced, envs = proof_keys.traced_inputs(trace_dir, keep)
    client = os.environ.get("SPEC_COMPAT_CLIENT_PYTHON")
    client_prefix = str(Path(client).resolve().parents[1]) if client else None
    versions = proof_keys.label_envs(envs, os.path.realpath(sys.prefix), client_prefix)
    versions.setdefault("main", proof_keys.env_versions(None))
    inputs = {"files": sorted(files | traced), "versions": versions}
    key = proof_keys.digest(patch.id, repr(patch.proof), inputs["files"], versions)
    item.user_properties.append(("proof_key", key))
    item.user_properties.append(("proof_inputs", json.dumps(inputs, sort_keys=True)))
    shutil.rmtree(trace_dir, ignore_errors=True)


@pytest.fixture
def prove(request):
    """``prove(pid)`` -> the ProofRun of the patch this proof test proves (checked after the test)."""
    from spec_compat import REGISTRY
    from spec_compat import patches  # noqa: F401
    from proof_runs import ProofRun

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
