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


def _backport_range_holds() -> bool:
    from spec_compat.core.versions import in_range, installed_version
    from spec_compat.patches.hidden_states import VLLM_WITHOUT_EHS

    return in_range(installed_version("vllm"), VLLM_WITHOUT_EHS) is not False  # None (no vLLM): vllm_only skips


# another vLLM has no such method to backport (0.11 refuses it in SpeculativeConfig; >= 0.17 has its own)
pytestmark = pytest.mark.skipif(not _backport_range_holds(),
                                reason="the extract_hidden_states backport is for the vLLM releases in its range only")


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


@pytest.fixture(scope="module")
def patched_run(llama_dir, tmp_path_factory):
    """``patched_run(disable="")``: the run with every patch on (apart from ``disable``), once each."""
    done: dict[str, tuple] = {}

    def get(disable: str = "") -> tuple:
        if disable not in done:
            tmp = tmp_path_factory.mktemp("patched")
            done[disable] = run_engine(_spec(llama_dir, tmp / "storage"), tmp, disable=disable or None)
        return done[disable]

    return get


def _baselines() -> list[str]:
    from spec_compat import REGISTRY

    return sorted({",".join(REGISTRY.get(pid).proof.also_off)
                   for pid in proof_cases("test_fails_with_only_this_server_patch_disabled")})


@pytest.mark.vllm_only
@pytest.mark.parametrize("baseline", _baselines())
def test_patched_run_writes_the_reference_rows(llama_dir, patched_run, baseline):
    """The patched half of the proofs below, an ordinary test (CI runs it on every change, while the
    stock halves re-run only when their inputs change): the file's rows equal the reference."""
    patched, result = patched_run(baseline)
    assert patched.returncode == 0 and result, patched.stderr[-4000:]
    print(_rows_equal_reference(llama_dir, result))


@pytest.mark.vllm_only
@pytest.mark.parametrize("pid", proof_cases("test_fails_with_only_this_server_patch_disabled"))
def test_fails_with_only_this_server_patch_disabled(llama_dir, tmp_path, patched_run, prove, pid):
    proof = prove(pid)
    stock, _ = run_engine(_spec(llama_dir, tmp_path / "stock"), tmp_path, disable=proof.disable)
    assert stock.returncode != 0, f"extraction ran with {pid} disabled"
    proof.assert_symptom(stock.stdout + stock.stderr)
    patched, result = patched_run(proof.baseline)  # its rows: test_patched_run_writes_the_reference_rows
    assert patched.returncode == 0 and result, patched.stderr[-4000:]
    proof.assert_absent(patched.stdout + patched.stderr)
