"""Each T1 patch is what fixes its step: the stock steps of scripts/train.py
(t1_steps.py) pass with the registry, and fail with the T1 error of that step when
only that patch is switched off (SPEC_COMPAT_DISABLE), in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spec_compat.core.versions import in_range, installed_version
from proof_runs import find_symptom, proof_cases  # tests/support (on sys.path: tests/conftest.py)

pytestmark = pytest.mark.t1

STEPS = Path(__file__).resolve().parent / "t1_steps.py"
TF_524 = in_range(installed_version("transformers"), ">=5.24")

#: the T1 patches: each one's step (``Proof.using``) and error (``Proof.symptom``) are declared
#: with the patch (its unit in spec_compat/patches/training/)
T1 = proof_cases("test_step_fails_without_the_patch")


def run_steps(verifier: Path, out: Path, disable: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_COMPAT_")}
    env["TORCHDYNAMO_DISABLE"] = "1"
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    return subprocess.run([sys.executable, str(STEPS), str(verifier), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)


def verdict(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("T1-")]
    assert lines, f"no verdict (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return lines[-1]


@pytest.fixture(scope="module")
def patched_steps(llama_dir, tmp_path_factory):
    """The stock steps with every patch on, run once for this module."""
    return run_steps(llama_dir, tmp_path_factory.mktemp("t1-on"), None)


def test_stock_steps_pass_with_the_registry(patched_steps):
    proc = patched_steps
    assert verdict(proc) == "T1-OK", proc.stderr[-4000:]
    assert proc.returncode == 0


@pytest.mark.parametrize("pid", proof_cases("test_step_fails_without_the_patch"))
def test_step_fails_without_the_patch(pid, llama_dir, tmp_path, patched_steps, prove):
    if pid == "attn-mask-utils-module" and not TF_524:
        pytest.skip("transformers < 5.24 still ships modeling_attn_mask_utils")
    proof = prove(pid)
    step = proof.proof.using
    off = run_steps(llama_dir, tmp_path, proof.disable)
    assert off.returncode == 1
    line = proof.assert_symptom(verdict(off), report=True)
    assert line.startswith(f"T1-FAIL {step} "), (line, off.stderr[-4000:])
    assert not proof.proof.also_off  # the patched run is the shared one
    on = patched_steps
    assert verdict(on) == "T1-OK", on.stderr[-4000:]
    proof.assert_absent(verdict(on), report=True)


def test_stock_speculators_fails_at_import(llama_dir, tmp_path):
    """Every T1 patch off = stock speculators: the first T1 error, at import."""
    from spec_compat import REGISTRY

    proc = run_steps(llama_dir, tmp_path, ",".join(T1))
    first = REGISTRY.get("attn-mask-utils-module" if TF_524 else "pretrained-config-annotations").proof
    assert verdict(proc).startswith("T1-FAIL import "), verdict(proc)
    assert find_symptom(first, verdict(proc), report=True), (verdict(proc), first.symptom)
