"""A server configured for hs-connectors' Mooncake backend while its master is down
(``mooncake-master-at-start``).

hs-connectors 0.9.0's connector sets its store up at the first write. Stock, ``vllm serve`` with
a master address nothing listens on loads the model, serves, answers the request with a handle
(on vLLM 0.15/0.16 with ``mooncake-answer-after-put`` on: HTTP 503 naming the store it cannot reach),
then retries the master for ~85 s and its EngineCore dies ("Mooncake setup failed"). Patched, the server exits at configuration time naming
the address, before any model loads. (The configuration is hs-connectors' own, from speculators'
``--mooncake-master`` launch option.)
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from proof_runs import find_symptom, proof_cases  # tests/support (on sys.path: tests/conftest.py)
from test_mooncake import _server, kv_config
from test_speculators_pipeline import _client_env

PID = "mooncake-master-at-start"
MODEL_LOADING = ("Starting to load model", "Loading weights", "Model loading took")

#: speculators' own request (its vllm_client, one attempt): the handle the server answers with, or the
#: HTTP error it answers (vLLM 0.15/0.16: mooncake-answer-after-put looks for the sample in the store first)
_REQUEST = r"""
import json, sys
import openai
from speculators.data_generation.vllm_client import generate_hidden_states
client = openai.OpenAI(base_url=sys.argv[1], api_key="EMPTY", max_retries=0)
model = client.models.list().data[0].id
try:
    handle, params = generate_hidden_states(client, model, {"input_ids": list(range(3, 40))}, timeout=120,
                                            max_retries=0)
    out = {"handle": handle, "params": params}
except openai.APIStatusError as exc:
    out = {"status": exc.status_code, "error": str(exc)}
print("SPEC_COMPAT_RESULT " + json.dumps(out))
"""


def _needed() -> None:
    from spec_compat import REGISTRY
    from spec_compat.core.versions import installed_version

    if installed_version("hs-connectors") is None:
        pytest.skip("hs-connectors is not installed in the server environment (speculators 0.9.0 cells install it)")
    needed, why = REGISTRY.get(PID).needed()
    if not needed:
        pytest.skip(f"{PID} is not needed here ({why})")


def _down_master() -> str:
    from conftest import free_port  # tests/server/conftest.py: a port nothing listens on

    return f"127.0.0.1:{free_port()}"


def _refused(fixture_model, client_python, tmp_path, disable: str | None = None) -> str:
    """The patched server's log: it exits at configuration naming the address, before any model loads."""
    master = _down_master()
    server = _server(fixture_model("llama"), kv_config(client_python, master), False, tmp_path / "server.log", disable)
    try:
        with pytest.raises(RuntimeError, match="vllm serve exited"):
            server.wait_ready()
        log = server.tail(40000)
    finally:
        server.stop()
    assert f"spec_compat[{PID}]: the Mooncake master at {master}" in log, log[-4000:]
    assert "--mooncake-master HOST:PORT" in log, log[-4000:]
    assert not [m for m in MODEL_LOADING if m in log], log[-4000:]
    return log


def test_master_down_is_refused_before_the_model_loads(fixture_model, client_python, tmp_path):
    _needed()
    _refused(fixture_model, client_python, tmp_path)


@pytest.mark.parametrize("pid", proof_cases("test_master_down_fails_late_only_without_this_patch"))
def test_master_down_fails_late_only_without_this_patch(fixture_model, client_python, tmp_path, prove, pid):
    _needed()
    proof = prove(pid)
    stock = _server(fixture_model("llama"), kv_config(client_python, _down_master()), False, tmp_path / "stock.log",
                    proof.disable)
    try:
        stock.wait_ready()  # stock: it loads the model and serves
        log = stock.log.read_text(errors="replace")
        assert [m for m in MODEL_LOADING if m in log], log[-3000:]
        since = len(log)
        answer = subprocess.run([client_python, "-c", _REQUEST, stock.url + "/v1"], capture_output=True, text=True,
                                timeout=300, env=_client_env())
        assert answer.returncode == 0, answer.stderr[-3000:]
        result = json.loads(answer.stdout.split("SPEC_COMPAT_RESULT ", 1)[1])
        if "handle" in result:  # answered: the handle of a sample never stored
            assert result["handle"], answer.stdout
        else:  # mooncake-answer-after-put (on here) found no store to look in: an error naming it
            assert result["status"] == 503 and "spec_compat[mooncake-answer-after-put]: the Mooncake store (master " \
                in result["error"], result
        deadline = time.monotonic() + 180  # after the answer: 20 connection retries (~85 s measured), then the crash
        while (find_symptom(proof.proof, stock.log.read_text(errors="replace"), since=since) is None
               and time.monotonic() < deadline):
            time.sleep(0.5)
    finally:
        stock.stop()
    proof.assert_symptom(stock.log.read_text(errors="replace"), since=since)
    (tmp_path / "patched").mkdir()
    proof.assert_absent(_refused(fixture_model, client_python, tmp_path / "patched", proof.baseline))
