"""A draft trained on hs-connectors' fp8 rows vs one trained on the same rows unquantized, served
side by side (#33 item 4).

The pipeline of ``test_speculators_pipeline.py`` (stock prepare-data, generate-offline-data through
the backport's file connector, train, evaluate) gives the unquantized rows (float32, as the fixtures
are served) and the draft trained on them. The same hidden-states files are written again as
hs-connectors 0.9.0's fp8 connector writes rows (its ``quantize_tensor_to_fp8``: e4m3 rows, one
fp32 scale per token), and the stock trainer trains on them with ``--hidden-states-backend fp8``
(its ``FP8Transfer`` dequantizes), same flags and seed. Both drafts are served by vLLM 0.16 through
``spec-compat evaluate`` on the same prompts: both lossless, acceptance printed side by side and
required to stay within 0.10 of each other (acceptance rate). ``matrix/run`` records it; CI runs the
fp8 trainer in ``test_hs_connectors.py``.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from test_speculators_pipeline import EPOCHS, _check_served, _evaluate, _last_epoch, _train
from test_speculators_pipeline import client_version, pipeline, serving_possible  # noqa: F401  (fixtures)

#: the fp8 connector's file format from the file connector's rows (client env: hs-connectors)
QUANTIZE = r"""
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("hidden_states"))  # the same vocabulary mapping
(dst / "hidden_states").mkdir()
n = 0
for f in sorted((src / "hidden_states").glob("hs_*.safetensors")):
    t = load_file(str(f))
    q, s = quantize_tensor_to_fp8(t["hidden_states"])
    save_file({**t, "hidden_states": q, SCALES_KEY: s}, str(dst / "hidden_states" / f.name))
    n += 1
print("FILES", n, str(t["hidden_states"].dtype))
"""
MAX_GAP = 0.10


@pytest.mark.parametrize("fixture", ["llama", "kimi-k25"])
def test_draft_trained_on_fp8_rows_accepts_like_the_unquantized_one(pipeline, client_python, tmp_path,  # noqa: F811
                                                                      serving_possible, fixture):  # noqa: F811
    p = pipeline(fixture)
    fp8_data = tmp_path / "data-fp8"
    q = subprocess.run([client_python, "-c", QUANTIZE, str(p["data"]), str(fp8_data)], capture_output=True, text=True,
                       timeout=600)
    assert q.returncode == 0, q.stderr[-3000:]
    files = len(list((p["data"] / "hidden_states").glob("hs_*.safetensors")))
    assert files > 0 and q.stdout.split()[:2] == ["FILES", str(files)], q.stdout
    train = _train(client_python, p["model"], fp8_data, tmp_path / "ckpt", p["trust"], "--epochs", str(EPOCHS[fixture]),
                   "--hidden-states-backend", "fp8")
    assert train.returncode == 0, (train.stdout[-4000:], train.stderr[-4000:])
    ev_proc, fp8 = _evaluate(p["model"], _last_epoch(tmp_path / "ckpt"), p["prompts"])
    _check_served(fp8, ev_proc)
    ref = p["evaluate"][1]
    _check_served(ref, p["evaluate"][0])
    side = {name: {k: r[k] for k in ("acceptance_rate", "mean_acceptance_length", "accepted_tokens", "draft_tokens",
                                     "per_position_accepted")} for name, r in (("unquantized", ref), ("fp8", fp8))}
    print(f"{fixture}: rows {q.stdout.split()[2]} -> fp8; " + json.dumps(side, sort_keys=True))
    assert abs(fp8["acceptance_rate"] - ref["acceptance_rate"]) <= MAX_GAP, side
