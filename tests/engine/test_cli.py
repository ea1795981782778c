"""The CLI in a real cell: `report --json` and `run` on an unmodified script (`evaluate --json`
keeping stdout for its one JSON document while vLLM logs is checked by every evaluation in
test_serving)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spec_compat.core.versions import installed_version, release_of

pytestmark = pytest.mark.engine


#: vLLM releases where every extraction shim of a speculators series is needed (CPU machine)
FULLY_PATCHED_VLLM = ("0.15.1", "0.16.0")
EXTRACTION_IDS = {
    "0.3": {
        "scheduler-config-init-vars", "kv-cache-memory-from-platform", "kv-cache-config-signature",
        "scheduler-block-size", "keep-unfinished-prefill", "prefix-caching-off", "collective-rpc-single-reply",
        "two-phase-step", "capture-per-request", "rows-by-request-id", "tokenizer-trust-remote-code",
        "decoder-stack-locator", "capture-layer-hooks", "async-scheduling-off",
    },
    "0.4": {
        "tokenizer-trust-remote-code", "mem-get-info-from-platform", "results-in-input-order",
        "generate-in-fitting-batches", "capture-layer-hooks",
    },
}


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spec_compat", "report", *args],
                          capture_output=True, text=True, timeout=300)


def test_report_json_lists_every_shim_applied():
    proc = _report("--json", "--strict")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert set(data["versions"]) == {"speculators", "vllm", "transformers", "torch"}
    assert data["versions"]["vllm"] == installed_version("vllm")
    statuses = {p["id"]: p["status"] for p in data["patches"]}
    for p in data["patches"]:
        assert set(p) == {"id", "status", "target", "reason", "touched", "proof"} and p["reason"]
        assert p["status"] in ("applied", "not-needed"), p
        if p["proof"] is not None:  # the declared proof and whether some cell recorded its pass
            assert set(p["proof"]) == {"kind", "test", "status", "recorded_in"}, p
            assert p["proof"]["status"] == ("recorded" if p["proof"]["recorded_in"] else "unproven"), p
    series = ".".join(data["versions"]["speculators"].split(".")[:2])
    if str(release_of(data["versions"]["vllm"])) in FULLY_PATCHED_VLLM and not data["platform"]["cuda_available"]:
        applied = {pid for pid, st in statuses.items() if st == "applied"}
        assert applied >= EXTRACTION_IDS[series], sorted(EXTRACTION_IDS[series] - applied)


def test_report_text_and_disable_switch():
    env = dict(os.environ, SPEC_COMPAT_DISABLE="rows-by-request-id")
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "report"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("rows-by-request-id"))
    assert "disabled" in line


def test_run_unmodified_script(llama_dir, tmp_path):
    import torch

    out = tmp_path / "states.pt"
    script = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "extract.py")
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "run", script, "--model", str(llama_dir),
                           "--out", str(out), "--lengths", "5,300,2000"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = torch.load(out)
    assert [r["hidden_states"][0].shape[0] for r in results] == [5, 300, 2000]
    assert all(len(r["hidden_states"]) == 4 for r in results)
