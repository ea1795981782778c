"""Kimi-K2.5's remote tokenizer on transformers 5: the checkpoint's ``tokenization_kimi.py`` imports
``bytes_to_unicode`` from gpt2's tokenization module, which transformers 5 no longer defines.  Each
load runs in a child process (this process imports no transformers), through ``AutoTokenizer`` with
``trust_remote_code=True`` as vLLM and speculators load it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)
from spec_compat.core.versions import in_range, installed_version

_LOAD = r"""
import json, sys
import spec_compat
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
texts = ["plain ascii", "caf\u00e9 \u2014 \u6f22\u5b57 \U0001f600", "<|im_user|>user<|im_middle|>hi<|im_end|>"]
print(json.dumps([[tok.encode(t, add_special_tokens=False), tok.decode(tok.encode(t, add_special_tokens=False))]
                  for t in texts]))
"""


def _needed() -> str | None:
    v = installed_version("transformers")
    if v is None:
        return "transformers is not installed"
    if not in_range(v, ">=5.0,<5.20"):
        return f"transformers {v}: the gpt2 module still defines bytes_to_unicode"
    return None


@pytest.mark.parametrize("pid", proof_cases("test_tokenizer_fails_with_only_this_patch_disabled"))
def test_tokenizer_fails_with_only_this_patch_disabled(tmp_path, prove, pid):
    reason = _needed()
    if reason:
        pytest.skip(reason)
    from spec_compat.fixtures.kimi_k25 import _write_tokenizer

    out = tmp_path / "kimi"
    out.mkdir()
    _write_tokenizer(out)
    proof = prove(pid)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    stock = subprocess.run([sys.executable, "-c", _LOAD, str(out)], capture_output=True, text=True, timeout=300,
                           env=dict(env, SPEC_COMPAT_DISABLE=proof.disable))
    assert stock.returncode != 0, stock.stdout
    proof.assert_symptom(stock.stderr)
    patched = subprocess.run([sys.executable, "-c", _LOAD, str(out)], capture_output=True, text=True, timeout=300,
                             env=dict(env, SPEC_COMPAT_DISABLE=proof.baseline))
    assert patched.returncode == 0, patched.stderr[-3000:]
    proof.assert_absent(patched.stderr)
    (ascii_ids, ascii_back), (uni_ids, uni_back), (chat_ids, chat_back) = json.loads(patched.stdout.splitlines()[-1])
    # byte-level fixture: one token per UTF-8 byte, the special markers one token each, and back again
    assert ascii_ids == list(b"plain ascii") and ascii_back == "plain ascii"
    text = "caf\u00e9 \u2014 \u6f22\u5b57 \U0001f600"
    assert uni_ids == list(text.encode()) and uni_back == text
    assert len(chat_ids) == 3 + len("user") + len("hi") and chat_back == "<|im_user|>user<|im_middle|>hi<|im_end|>"
