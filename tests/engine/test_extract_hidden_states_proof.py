"""Proofs of need of the ``extract_hidden_states`` backport (vLLM 0.15/0.16): with only one patch
disabled, ``LLM(speculative_config={"method": "extract_hidden_states", ...})`` fails with the
declared symptom; with every patch on, the same run writes a file whose rows equal a transformers
forward of the same weights.  (Row coverage in depth: test_extract_hidden_states.py.)"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from ehs_engine import engine_settings, run_engine  # noqa: E402

LAYER_IDS = [0, 2, 4]


def _spec(model_dir: Path, storage: Path) -> dict:
    rng = random.Random(2)
    return {"model": str(model_dir), "layer_ids": LAYER_IDS, "storage": str(storage),
            "engine": engine_settings(True, True), "waves": [[[rng.randrange(1, 250) for _ in range(70)]]]}


def _rows_equal_reference(model_dir: Path, result: list[dict]) -> str:
    from safetensors.torch import load_file

    from spec_compat.verify.compare import compare_states
    from spec_compat.verify.hidden_states_reference import reference_rows
    from spec_compat.verify.reference import load_reference_model

    (r,) = result
    data = load_file(r["kv_transfer_params"]["hidden_states_path"])
    assert data["token_ids"].tolist() == r["prompt_token_ids"]
    want = reference_rows(load_reference_model(str(model_dir), "float32"), r["prompt_token_ids"], LAYER_IDS)
    cmp = compare_states(data["hidden_states"], want, tolerance=1e-5 * float(want.abs().max()),
                         sides=("engine", "reference"))
    assert cmp, cmp.detail
    return cmp.detail


@pytest.mark.vllm_only
@pytest.mark.parametrize("pid", proof_cases("test_fails_with_only_this_server_patch_disabled"))
def test_fails_with_only_this_server_patch_disabled(llama_dir, tmp_path, prove, pid):
    proof = prove(pid)
    stock, _ = run_engine(_spec(llama_dir, tmp_path / "stock"), tmp_path, disable=proof.disable)
    assert stock.returncode != 0, f"extraction ran with {pid} disabled"
    proof.assert_symptom(stock.stdout + stock.stderr)
    patched, result = run_engine(_spec(llama_dir, tmp_path / "patched"), tmp_path)
    assert patched.returncode == 0 and result, patched.stderr[-4000:]
    proof.assert_absent(patched.stdout + patched.stderr)
    print(_rows_equal_reference(llama_dir, result))
