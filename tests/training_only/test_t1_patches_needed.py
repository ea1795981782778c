"""Each T1 patch is what fixes its step: the stock steps of scripts/train.py
(t1_steps.py) pass with the registry, and fail with the T1 error of that step when
only that patch is switched off (SPEC_COMPAT_DISABLE), in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spec_compat._versions import in_range, installed_version

pytestmark = pytest.mark.t1

STEPS = Path(__file__).resolve().parent / "t1_steps.py"
TF_524 = in_range(installed_version("transformers"), ">=5.24")

# patch id -> (the step that fails without it, the error it fails with)
EXPECTED = {
    "pretrained-config-annotations": ("import", "PydanticUndefinedAnnotation: name 'torch' is not defined"),
    "speculator-config-own-init": (
        "build-config", "AttributeError: 'Eagle3SpeculatorConfig' object has no attribute '__pydantic_fields_set__'"),
    "speculator-config-validate": (
        "save", "TypeError: BaseModel.validate() missing 1 required positional argument: 'value'"),
    "attn-mask-utils-module": ("import", "ModuleNotFoundError: No module named 'transformers.modeling_attn_mask_utils'"),
}


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


def test_stock_steps_pass_with_the_registry(llama_dir, tmp_path):
    proc = run_steps(llama_dir, tmp_path, None)
    assert verdict(proc) == "T1-OK", proc.stderr[-4000:]
    assert proc.returncode == 0


@pytest.mark.parametrize("pid", sorted(EXPECTED))
def test_step_fails_without_the_patch(pid, llama_dir, tmp_path):
    if pid == "attn-mask-utils-module" and not TF_524:
        pytest.skip("transformers < 5.24 still ships modeling_attn_mask_utils")
    step, error = EXPECTED[pid]
    proc = run_steps(llama_dir, tmp_path, pid)
    assert proc.returncode == 1
    assert verdict(proc) == f"T1-FAIL {step} {error}", proc.stderr[-4000:]


def test_stock_speculators_fails_at_import(llama_dir, tmp_path):
    """Every T1 patch off = stock speculators: the first T1 error, at import."""
    proc = run_steps(llama_dir, tmp_path, ",".join(EXPECTED))
    first = "attn-mask-utils-module" if TF_524 else "pretrained-config-annotations"
    assert verdict(proc) == f"T1-FAIL import {EXPECTED[first][1]}", proc.stderr[-4000:]
