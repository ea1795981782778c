"""Raw Kimi-K2.5 chats through speculators' own chat preprocessing (0.3.0 - 0.7.x).

Those releases build the loss mask from ``tokenizer(text, return_offsets_mapping=True)``; Kimi-K2.5's
tokenizer is remote-code tiktoken (a Python tokenizer), which cannot return offsets: stock
preprocessing drops every conversation (one log line each) and ends with no samples.  Each run is a
child process calling the release's ``load_and_preprocess_dataset`` the way its ``scripts/prepare_data.py``
does, on the Kimi-K2.5 fixture and the demo chats.  The rows are
checked against the chat template itself: each row is the template's token ids of one conversation,
and the masked tokens decode to exactly that conversation's assistant contents.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chat_rows import DEMO_CHATS, assert_rows_follow_the_template  # tests/support (on sys.path: tests/conftest.py)
from proof_runs import proof_cases
from spec_compat.core.versions import in_range, installed_version
from spec_compat.patches.extraction.slow_tokenizer_offsets import SPEC_WITH_OFFSETS

#: the release's load_and_preprocess_dataset, called as its prepare script calls it
_PREPARE = r"""
import inspect, json, sys
import spec_compat
from speculators.data_generation.preprocessing import load_and_preprocess_dataset as prepare

model, data, out = sys.argv[1:4]
params = inspect.signature(prepare).parameters
kwargs = {"seq_length": 1024, "build_dataset_num_proc": 2, "seed": 0, "token_freq_path": out + "/token_freq.pt"}
if "train_data_paths" in params:  # 0.5+
    kwargs["train_data_paths"] = [data]
else:  # 0.3 / 0.4
    kwargs["train_data_path"] = data
    kwargs["cache_dir"] = out + "/hf_cache"
if "trust_remote_code" in params:  # 0.6+ (earlier releases trust the checkpoint's code themselves)
    kwargs["trust_remote_code"] = True
dataset, _ = prepare(target_model_path=model, **kwargs)
if len(dataset) == 0:
    raise SystemExit("speculators' preprocessing produced no samples")
print("SPEC_COMPAT_RESULT " + json.dumps({"input_ids": [list(map(int, r)) for r in dataset["input_ids"]],
                                          "loss_mask": [list(map(int, r)) for r in dataset["loss_mask"]]}))
"""

def _speculators_with_offsets() -> str | None:
    v = installed_version("speculators")
    if v is None:
        return "speculators is not installed"
    if not in_range(v, SPEC_WITH_OFFSETS):
        return f"speculators {v} does not ask the tokenizer for offsets (only {SPEC_WITH_OFFSETS} does)"
    if in_range(v, "<0.5") and installed_version("vllm") is None:
        return f"speculators {v}'s data_generation package imports vLLM, which this (training-only) environment lacks"
    return None


@pytest.fixture(scope="module")
def kimi_model(tmp_path_factory) -> Path:
    reason = _speculators_with_offsets()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("kimi") / "kimi-k25"
    # the whole fixture (config too): 0.6+ load the processor through the checkpoint's config
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "fixture", "kimi-k25", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _prepare(model: Path, out: Path, disable: str) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_MODULES_CACHE=str(out / "modules"),
               HF_DATASETS_CACHE=str(out / "datasets"), SPEC_COMPAT_DISABLE=disable)
    return subprocess.run([sys.executable, "-c", _PREPARE, str(model), str(DEMO_CHATS), str(out)],
                          capture_output=True, text=True, timeout=600, env=env)


def _result(proc: subprocess.CompletedProcess) -> dict:
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("SPEC_COMPAT_RESULT "):
            return json.loads(line.split(" ", 1)[1])
    raise AssertionError(f"no result (rc={proc.returncode}):\n{proc.stderr[-3000:]}")


def test_kimi_chat_rows_follow_the_template(kimi_model, tmp_path):
    """The patched run: 64 rows, each one conversation's template ids, masked exactly on its
    assistant contents (every assistant turn, nothing else)."""
    proc = _prepare(kimi_model, tmp_path / "prep", disable="")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _result(proc)
    assert_rows_follow_the_template(kimi_model, rows, DEMO_CHATS, tmp_path)


@pytest.mark.parametrize("pid", proof_cases("test_kimi_chats_need_offsets_shim"))
def test_kimi_chats_need_offsets_shim(kimi_model, tmp_path, prove, pid):
    proof = prove(pid)
    patched = _prepare(kimi_model, tmp_path / "on", disable=proof.baseline)
    assert patched.returncode == 0, patched.stderr[-3000:]
    assert len(_result(patched)["input_ids"]) == 64
    proof.assert_absent(patched.stderr)
    stock = _prepare(kimi_model, tmp_path / "off", disable=proof.disable)
    # stock: every conversation fails with the tokenizer's NotImplementedError, is logged and dropped,
    # and the run ends with no samples (0.7: ValueError 'No samples remain'; 0.3: an IndexError on
    # sample 0; else the empty dataset)
    assert stock.returncode != 0, stock.stdout[-2000:]
    dropped = [ln for ln in stock.stderr.splitlines() if "Failed to process conversation" in ln]
    assert dropped, stock.stderr[-3000:]
    # the verdict on the conversations: the first such line (each one says why it was dropped)
    proof.assert_symptom(dropped[0], report=True)
    assert ("No samples remain" in stock.stderr or "produced no samples" in stock.stderr
            or "out of bounds for size 0" in stock.stderr), stock.stderr[-3000:]
