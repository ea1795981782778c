"""``cpu-attention-isa-probe`` on the real engine, on a CPU with AMX tiles (skipped elsewhere):
plain vLLM decoding in bf16 with the default block size (128) dies in EngineCore without the
patch ('Unsupported CPU attention configuration ... isa=0'); with it, the greedy tokens equal
those of the same engine at block size 16, where vLLM itself picks the 'vec16' kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spec_compat import REGISTRY
from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)

pytestmark = pytest.mark.engine

SCRIPT = r"""
import json, sys
import spec_compat  # noqa: F401
from vllm import LLM, SamplingParams
kw = {"block_size": int(sys.argv[2])} if sys.argv[2] != "default" else {}
llm = LLM(sys.argv[1], dtype="bfloat16", enforce_eager=True, max_model_len=512, max_num_seqs=4, **kw)
prompts = [{"prompt_token_ids": [(7 * i + j) % 200 + 3 for j in range(40 + 9 * i)]} for i in range(3)]
outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True), use_tqdm=False)
print("SPEC_COMPAT_RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
"""


def _amx_cpu() -> bool:
    from spec_compat.patches.extraction.cpu_attention_isa_probe import amx_tiles

    return bool(amx_tiles())


def _decode(model, block: str, disable: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("SPEC_COMPAT_DISABLE", None)
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    return subprocess.run([sys.executable, "-c", SCRIPT, str(model), block], env=env, capture_output=True,
                          text=True, timeout=600)


def _tokens(proc: subprocess.CompletedProcess) -> list[list[int]]:
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SPEC_COMPAT_RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-4000:]
    return json.loads(line[len("SPEC_COMPAT_RESULT "):])


@pytest.mark.parametrize("pid", proof_cases("test_amx_cpu_decodes_with_the_probe_and_dies_without"))
def test_amx_cpu_decodes_with_the_probe_and_dies_without(llama_dir, prove, pid):
    proof = prove(pid)
    if not REGISTRY.get(pid).needed()[0]:
        pytest.skip(f"{pid} is not needed with this vLLM")
    if not _amx_cpu():
        pytest.skip("this CPU has no AMX tiles: vLLM never picks the 'amx' kernels")
    from spec_compat.patches.extraction.cpu_attention_isa_probe import amx_attention_works

    assert not amx_attention_works(64)  # the Llama fixture's head size: the installed _C lacks it
    patched_run = _decode(llama_dir, "default", proof.baseline or None)
    proof.assert_absent(patched_run.stdout + patched_run.stderr)
    patched = _tokens(patched_run)
    reference = _tokens(_decode(llama_dir, "16", proof.baseline or None))
    assert [len(t) for t in patched] == [12, 12, 12]
    assert patched == reference
    stock = _decode(llama_dir, "default", proof.disable)
    assert stock.returncode != 0
    proof.assert_symptom(stock.stdout + stock.stderr)
