"""speculators' own stock scripts, unmodified, under ``spec-compat run``.

The scripts (``scripts/build_vocab_mapping.py``, ``scripts/train.py``) are not part of the
speculators wheel or sdist, so this test needs a checkout of speculators at the installed
version: ``SPEC_COMPAT_STOCK_SCRIPTS=/path/to/speculators/scripts``.  Without it the test is
skipped (CI has no GitHub access); the demo tests drive the same library calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = os.environ.get("SPEC_COMPAT_STOCK_SCRIPTS")

pytestmark = pytest.mark.skipif(not SCRIPTS, reason="SPEC_COMPAT_STOCK_SCRIPTS (a speculators scripts/ checkout) not set")


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPAT_DISABLE"}
    return subprocess.run([sys.executable, "-m", "spec_compat", "run", str(Path(SCRIPTS) / script), *args],
                          capture_output=True, text=True, timeout=1200, env=env)


@pytest.mark.parametrize("model", ["llama", "kimi-k25"])
def test_stock_vocab_mapping_and_train_scripts(demo, tmp_path, model):
    res = demo(model)
    out = Path(res["out"])
    vocab = _run("build_vocab_mapping.py", "--token-freq-path", str(out / "token_freq.pt"),
                 "--draft-vocab-size", "256", "--target-model-path", res["model_dir"],
                 "--output-path", str(tmp_path / "vocab"))
    assert vocab.returncode == 0, vocab.stderr[-3000:]
    train = _run("train.py", "--verifier-name-or-path", res["model_dir"], "--data-path", res["data_dir"],
                 "--save-path", str(tmp_path / "ck"), "--epochs", "1", "--total-seq-len", "1024",
                 "--d2t-path", str(tmp_path / "vocab" / "d2t.npy"), "--t2d-path", str(tmp_path / "vocab" / "t2d.npy"))
    assert train.returncode == 0, train.stderr[-3000:]
    cfg = json.loads((tmp_path / "ck" / "0" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert cfg["draft_vocab_size"] == 256
    layer = cfg["transformer_layer_config"]
    assert layer["head_dim"] == layer["hidden_size"] // layer["num_attention_heads"]
