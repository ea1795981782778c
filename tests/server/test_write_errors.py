"""A request whose hidden states the server cannot write gets an HTTP error naming the cause,
and the server keeps serving (the backport, vLLM 0.15/0.16).  The storage directory is replaced
by a plain file between two requests, then restored.  Proof of need of ehs-write-error-status:
without it the same request answers HTTP 200 with ``hidden_states_path: null``."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)
from spec_compat.core.versions import in_range, installed_version

from test_speculators_client import _WRITE_DATASET, _post, _written, serve_args

LAYER_IDS = [1, 2, 3, 4]


def _request(server, model: Path, ids: list[int]) -> tuple[int, dict]:
    return _post(server.url + "/v1/completions", {"model": str(model), "prompt": ids, "max_tokens": 1,
                                                  "return_token_ids": True})


def _broken_storage_answer(server, model: Path, storage: Path, ids: list[int]) -> tuple[int, dict]:
    """One good request, then one with the directory replaced by a file; the directory is back
    afterwards (holding the first file only)."""
    status, body = _request(server, model, ids[:20])
    assert status == 200 and _written(body["kv_transfer_params"]["hidden_states_path"]), (status, body)
    aside = storage.with_name(storage.name + ".aside")
    storage.rename(aside)
    storage.write_text("not a directory\n")
    try:
        return _request(server, model, ids)
    finally:
        storage.unlink()
        aside.rename(storage)


def _report(status: int, body: dict) -> str:
    kv = body.get("kv_transfer_params")
    if status == 200 and isinstance(kv, dict) and kv.get("hidden_states_path") is None:
        return f"HTTP 200 for a request whose hidden states were not written: kv_transfer_params {json.dumps(kv)}"
    return f"HTTP {status}: {json.dumps(body)[:500]}"


@pytest.mark.parametrize("pid", proof_cases("test_failed_write_answers_an_http_error"))
def test_failed_write_answers_an_http_error(fixture_model, serve, client_python, tmp_path, prove, pid):
    from spec_compat.patches.hidden_states import VLLM_WITHOUT_EHS

    if not in_range(installed_version("vllm"), VLLM_WITHOUT_EHS):
        pytest.skip(f"vLLM {installed_version('vllm')} has its own extract_hidden_states (outside {VLLM_WITHOUT_EHS})")
    model = fixture_model("llama")
    rng = random.Random(5)
    ids = [rng.randrange(1, 250) for _ in range(70)]
    proof = prove(pid)

    stock_dir = tmp_path / "stock"
    stock = serve(serve_args(model, stock_dir, LAYER_IDS), env={"SPEC_COMPAT_DISABLE": proof.disable})
    stock.wait_ready()
    report = _report(*_broken_storage_answer(stock, model, stock_dir, ids))
    stock.stop()
    proof.assert_symptom(report, report=True)

    storage = tmp_path / "patched"
    server = serve(serve_args(model, storage, LAYER_IDS), env={"SPEC_COMPAT_DISABLE": proof.baseline})
    server.wait_ready()
    status, body = _broken_storage_answer(server, model, storage, ids)
    report = _report(status, body)
    proof.assert_absent(report, report=True)
    message = body["error"]["message"]
    assert status == 500 and body["error"]["type"] == "InternalServerError", report
    assert "was not written" in message and f"the hidden-states directory {storage} is no longer a directory" in message, \
        report
    # the server keeps serving: the same prompt again is written in full
    status, body = _request(server, model, ids)
    assert status == 200 and _written(body["kv_transfer_params"]["hidden_states_path"]), (status, body)
    # stock speculators' client reports the server's reason (not a malformed answer)
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([ids]))
    subprocess.run([client_python, "-c", _WRITE_DATASET, str(rows), str(tmp_path / "prep")],
                   check=True, capture_output=True, text=True, timeout=300)
    aside = storage.with_name("patched.aside")
    storage.rename(aside)
    storage.write_text("not a directory\n")
    proc = subprocess.run(
        [str(Path(client_python).parent / "speculators"), "generate-offline-data", "--endpoint", server.url + "/v1",
         "--model", str(model), "--preprocessed-data", str(tmp_path / "prep"), "--output", str(tmp_path / "out"),
         "--fail-on-error", "--max-retries", "0"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, COLUMNS="200", HF_HUB_OFFLINE="1"))
    server.stop()
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "is no longer a directory" in out, out[-3000:]
