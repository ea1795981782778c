"""A trainer whose hidden-states backend does not match the server's (``file-transfer-refuses-fp8``).

hs-connectors 0.9.0's fp8 connector writes float8 rows with per-token scales; stock speculators
0.9.0 ``train --hidden-states-backend file`` reads them through ``FileTransfer`` and its
``CollateFn`` casts them to bf16 without the scales: every row is wrong, nothing fails. Here the
files are written in that connector's format from known rows (the server side is proven in
``test_hs_connectors.py``), then read the trainer's way (``ArrowDataset`` + ``CollateFn``) in the
client environment: with ``--hidden-states-backend fp8`` the rows come back within the e4m3 bound;
with ``file`` the patched run refuses the first sample naming its file, the stock run hands the
trainer rows off by their token's scale. No engine is started.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)

SCRIPT = r"""
import sys, tempfile
from pathlib import Path
import spec_compat  # noqa: F401  (the registry, before speculators)
import torch
from datasets import Dataset
from safetensors.torch import save_file
from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8
from hs_connectors.transfer import FileTransfer, FP8Transfer
from speculators.train.data import ArrowDataset, CollateFn

backend = sys.argv[1]
root = Path(tempfile.mkdtemp(prefix="backend-mismatch-"))
T, L, H, n = 24, 4, 16, 2
g = torch.Generator().manual_seed(0)
ids = [torch.randint(0, 100, (T,), generator=g) for _ in range(n)]
ds = Dataset.from_dict({"input_ids": [x.tolist() for x in ids], "loss_mask": [[1] * T] * n, "seq_len": [T] * n})
ds.set_format(type="torch")
ds.save_to_disk(str(root))
(root / "hidden_states").mkdir()
refs = []
for i in range(n):
    rows = (torch.randn(T, L, H, generator=g) * 0.05).to(torch.bfloat16)
    q, s = quantize_tensor_to_fp8(rows)  # the fp8 connector's payload
    save_file({"hidden_states": q, SCALES_KEY: s, "token_ids": ids[i]}, str(root / "hidden_states" / f"hs_{i}.safetensors"))
    refs.append(rows.float())
transfer = (FP8Transfer if backend == "fp8" else FileTransfer)(root / "hidden_states")
data = ArrowDataset(max_len=T, datapath=str(root), transfer=transfer, on_missing="raise")
collate = CollateFn(max_len=T, hidden_size=H, num_target_layers=L - 1, dtype=torch.bfloat16)
worst = 0.0
for i in range(n):
    try:
        batch = collate([data[i]])
    except ValueError as exc:
        print(f"REFUSED {exc}", flush=True)
        sys.exit(0)
    got = torch.cat([batch["hidden_states"][0].float().reshape(T, L - 1, H),
                     batch["verifier_last_hidden_states"][0].float().reshape(T, 1, H)], dim=1)
    assert got.shape == refs[i].shape and bool(torch.isfinite(got).all()), (got.shape, got.dtype)
    worst = max(worst, float((got - refs[i]).abs().max() / refs[i].abs().max()))
tol = 0.07  # e4m3: half a step at the top of a binade is 1/16 of the value; bf16 rounding on top
verdict = "OK" if worst <= tol else "WRONG"
print(f"{verdict} {'fp8' if backend == 'fp8' else 'file'} backend on fp8 files: max|diff|/max|ref| = {worst:.3g} "
      f"{'<=' if worst <= tol else '>'} {tol}", flush=True)
"""


def _python() -> str:
    return os.environ.get("SPEC_COMPAT_CLIENT_PYTHON") or sys.executable


def _read(backend: str, disable: str = "") -> str:
    probe = subprocess.run([_python(), "-c", "import hs_connectors, speculators.train.data, datasets"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("no speculators 0.9 trainer with hs-connectors in the client environment")
    env = dict(os.environ, SPEC_COMPAT_DISABLE=disable)
    proc = subprocess.run([_python(), "-c", SCRIPT, backend], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("OK ", "WRONG ", "REFUSED "))]
    assert len(lines) == 1, proc.stdout[-2000:]
    return lines[0]


def test_fp8_files_read_with_the_fp8_backend_come_back_within_the_bound():
    line = _read("fp8")
    assert line.startswith("OK fp8 backend on fp8 files"), line


@pytest.mark.parametrize("pid", proof_cases("test_fp8_files_read_as_plain_files_fail_only_without_this_patch"))
def test_fp8_files_read_as_plain_files_fail_only_without_this_patch(prove, pid):
    proof = prove(pid)
    stock = _read("file", proof.disable)
    proof.assert_symptom(stock, report=True)
    patched = _read("file", proof.baseline)
    proof.assert_absent(patched, report=True)
    assert patched.startswith("REFUSED spec_compat[file-transfer-refuses-fp8]: the hidden states at "), patched
    assert "hs_0.safetensors" in patched and "--hidden-states-backend fp8" in patched, patched
