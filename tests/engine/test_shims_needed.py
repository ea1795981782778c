"""Each shim is what fixes its failure: with only that shim disabled
(SPEC_COMPAT_DISABLE), stock extraction fails in this environment.

Each case runs ``spec-compat selftest`` in a fresh process (the default,
spawned-worker mode: worker-side shims arrive through the vLLM plugin) on the
workload that exposes the failure."""

from __future__ import annotations

import pytest

import spec_compat
from spec_compat import REGISTRY

pytestmark = pytest.mark.engine

#: patch id -> the selftest workload that exposes its failure
EXPOSED_BY = {
    "scheduler-config-init-vars": "short",
    "async-scheduling-off": "short",  # the synchronous-loop check
    "kv-cache-memory-from-platform": "short",
    "kv-cache-config-signature": "short",
    "scheduler-block-size": "short",
    "keep-unfinished-prefill": "chunked-8x2000",
    "prefix-caching-off": "batch-43-shared-prefixes",
    "collective-rpc-single-reply": "short",
    "two-phase-step": "consecutive-calls",
    "worker-forward-embed-input-ids": "short",
    "capture-per-request": "short",
    "rows-by-request-id": "short",
}
#: patches whose failure only exists on some platforms
PLATFORM_ONLY = {"kv-cache-memory-from-platform": "needs a machine without CUDA"}


def _needed_here() -> list[str]:
    spec_compat.apply()
    return [p.id for p in REGISTRY.patches() if p.side != "platform" and p.needed()[0]]


def test_every_needed_patch_has_a_proof_case():
    missing = [pid for pid in _needed_here() if pid not in EXPOSED_BY]
    assert not missing, f"patches without a disabled-shim test: {missing}"


def test_all_shims_on_passes(llama_dir, selftest):
    proc = selftest(llama_dir, "short,chunked-8x2000,batch-43-shared-prefixes,consecutive-calls")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "selftest: OK" in proc.stdout


@pytest.mark.parametrize("pid", sorted(EXPOSED_BY))
def test_fails_with_only_this_shim_disabled(llama_dir, selftest, pid):
    if pid not in _needed_here():
        pytest.skip(f"{pid} is not needed in this environment")
    if pid in PLATFORM_ONLY:
        import torch

        if torch.cuda.is_available():
            pytest.skip(PLATFORM_ONLY[pid])
    proc = selftest(llama_dir, EXPOSED_BY[pid], disable=pid)
    print(proc.stdout)
    assert proc.returncode != 0, f"selftest passed with {pid} disabled:\n{proc.stdout}"
    assert "FAIL" in proc.stdout


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
