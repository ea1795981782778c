"""Each shim is what fixes its failure: with only that shim disabled
(SPEC_COMPAT_DISABLE), stock extraction fails in this environment.

Each case runs ``spec-compat selftest`` in a fresh process (the default,
spawned-worker mode: worker-side shims arrive through the vLLM plugin) on the
workload that exposes the failure."""

from __future__ import annotations

import pytest

from spec_compat import REGISTRY
from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)

pytestmark = pytest.mark.engine

#: patches whose failure only shows on some platforms: id -> (platform where it shows, why)
PLATFORM_ONLY = {
    "kv-cache-memory-from-platform": ("cpu", "needs a machine without CUDA"),
    "kimi-k25-device-without-cuda": ("cpu", "needs a machine without CUDA"),
}
#: every selftest workload, and the fixtures the proofs below use
ALL_CHECKS = "short,many-blocks,chunked-8x2000,batch-43-shared-prefixes,consecutive-calls"


def _platform() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _needed_here(disabled=()) -> list[str]:
    """Ids whose version ranges hold here (and that no enabled patch supersedes)."""
    off = set(disabled)
    active = [p for p in REGISTRY.patches() if p.side != "platform" and p.needed()[0]]
    superseded = {s for p in active if p.id not in off for s in p.supersedes}
    return [p.id for p in active if p.id not in superseded]


@pytest.fixture(scope="module")
def patched_selftest(fixture_dir, selftest):
    """``patched_selftest(fixture, disable="")``: the selftest with every workload and the
    registry on (apart from ``disable``), run once per fixture and switch in this module."""
    done: dict[tuple[str, str], object] = {}

    def get(fixture: str, disable: str = ""):
        if (fixture, disable) not in done:
            done[fixture, disable] = selftest(fixture_dir(fixture), _patched_checks(fixture, disable),
                                              disable=disable or None)
        return done[fixture, disable]

    return get


def _patched_checks(fixture: str, disable: str) -> str:
    """The workloads of the patched run: every one on the Llama fixture with the full registry
    (test_all_shims_on_passes), else those the proofs sharing that run name."""
    if (fixture, disable) == ("llama", ""):
        return ALL_CHECKS
    checks = []
    for pid in proof_cases("test_fails_with_only_this_shim_disabled"):
        proof = REGISTRY.get(pid).proof
        model, names = proof.using.split()
        if model == fixture and ",".join(proof.also_off) == disable:
            checks += [n for n in names.split(",") if n not in checks]
    return ",".join(checks)


def test_all_shims_on_passes(patched_selftest):
    proc = patched_selftest("llama")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "selftest: OK" in proc.stdout


def _patched_runs() -> list[tuple[str, str]]:
    """The (fixture, switched-off ids) of the proofs' patched runs, less the one
    test_all_shims_on_passes runs (Llama, full registry)."""
    runs = []
    for pid in proof_cases("test_fails_with_only_this_shim_disabled"):
        proof = REGISTRY.get(pid).proof
        run = (proof.using.split()[0], ",".join(proof.also_off))
        if run != ("llama", "") and run not in runs:
            runs.append(run)
    return sorted(runs)


@pytest.mark.parametrize("fixture,disable", _patched_runs(), ids=lambda v: v or "full-registry")
def test_patched_selftest_passes(patched_selftest, fixture, disable):
    """The patched half of the proofs below, an ordinary test: CI runs it on every change (the stock
    halves re-run only when their inputs change).  Every value check of the selftest passes on the
    workloads those proofs use, where one of them is needed here."""
    pids = [pid for pid in proof_cases("test_fails_with_only_this_shim_disabled")
            if (REGISTRY.get(pid).proof.using.split()[0], ",".join(REGISTRY.get(pid).proof.also_off)) == (fixture, disable)
            and pid in _needed_here(disabled=REGISTRY.get(pid).proof.also_off)]
    if not pids:
        pytest.skip(f"no proof on {fixture} with {disable or 'nothing'} off is needed in this environment")
    proc = patched_selftest(fixture, disable)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "selftest: OK" in proc.stdout and "FAIL" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("pid", proof_cases("test_fails_with_only_this_shim_disabled"))
def test_fails_with_only_this_shim_disabled(fixture_dir, selftest, patched_selftest, prove, pid):
    """The patch's declared symptom shows in stock extraction with only it switched off (and the
    patches its proof names in ``also_off``), and not in the patched run."""
    proof = prove(pid)
    if pid not in _needed_here(disabled=proof.proof.also_off):
        pytest.skip(f"{pid} is not needed in this environment")
    if pid in PLATFORM_ONLY and PLATFORM_ONLY[pid][0] != _platform():
        pytest.skip(PLATFORM_ONLY[pid][1])
    model, checks = proof.proof.using.split()
    from spec_compat.shims.handoff import live_segments

    segments_before = live_segments()
    off = selftest(fixture_dir(model), checks, disable=proof.disable)
    print(off.stdout)
    assert off.returncode != 0, f"selftest passed with {pid} disabled:\n{off.stdout}"
    if proof.proof.kind == "wrong-values":  # a value check: its verdict is the check's FAIL line
        proof.assert_symptom(_fail_lines(off.stdout), report=True)
    else:  # the exception the check died of: the traceback on stderr (a worker's, where the driver relays it)
        proof.assert_symptom(off.stdout + off.stderr)
    if pid == "rows-by-request-id":
        # without the driver half nobody reads a hand-off descriptor: the worker must not write one
        assert live_segments() - segments_before == set(), "capture segments left in /dev/shm"
    on = patched_selftest(model, proof.baseline)
    assert on.returncode == 0, on.stdout + on.stderr[-3000:]
    proof.assert_absent(on.stdout + on.stderr)


def _fail_lines(stdout: str) -> str:
    """The selftest's verdicts of the checks that failed (``FAIL <check>: <detail>``)."""
    return "\n".join(ln for ln in stdout.splitlines() if ln.startswith("FAIL "))


def test_f10_is_silent_without_both_halves(llama_dir, selftest):
    """Upstream's F10 is silent: without per-request attribution the chunked batch
    yields the right row counts but values of other sequences."""
    if "capture-per-request" not in _needed_here():
        pytest.skip("F10 patches not needed here")
    proc = selftest(llama_dir, "chunked-8x2000", disable="capture-per-request,rows-by-request-id")
    print(proc.stdout)
    line = next(ln for ln in proc.stdout.splitlines() if "chunked-8x2000" in ln)
    assert line.startswith("FAIL") and "max|diff|=" in line, line
    worst = float(line.split("max|diff|=")[1].split()[0].rstrip(","))
    assert worst > 1e-3, line


_ASYNC_PROBE = """
import spec_compat
from speculators.data_generation import vllm_hidden_states_generator as gen
cfg = gen.SchedulerConfig(max_num_seqs=32, max_model_len=2048, max_num_batched_tokens=8192)
print("ASYNC", cfg.async_scheduling)
"""


@pytest.mark.parametrize("pid", proof_cases("test_async_scheduling_off_reaches_the_config"))
def test_async_scheduling_off_reaches_the_config(prove, pid):
    """O3: the generator's SchedulerConfig says async_scheduling=False with the shim, and
    leaves it None (which VllmConfig resolves to True for the mp/uni executors on GPU
    platforms) with only that shim disabled.  (On the CPU platform vLLM turns async scheduling
    off by itself, so the selftest cannot show it.)"""
    import os
    import subprocess
    import sys

    proof = prove(pid)
    if pid not in _needed_here():
        pytest.skip(f"{pid} is not needed in this environment")
    out = {}
    for disable in (proof.baseline, proof.disable):
        env = dict(os.environ, SPEC_COMPAT_DISABLE=disable)
        proc = subprocess.run([sys.executable, "-c", _ASYNC_PROBE], capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[disable] = proc.stdout
    proof.assert_symptom(out[pid], report=True)  # the probe prints its verdict line among vLLM's log lines
    proof.assert_absent(out[""], report=True)
    assert "ASYNC False" in out[""], out
