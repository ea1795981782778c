"""Which extraction answers become HTTP errors (spec_compat.shims.hidden_states.http_errors) and
the patch's wrapper on a stand-in completions handler (the real endpoint:
tests/server/test_write_errors.py)."""

from __future__ import annotations

import asyncio
import os
from http import HTTPStatus
from types import SimpleNamespace

import pytest

from spec_compat.shims.hidden_states.http_errors import ErrorAnswer, error_answer

WRITE = "spec_compat[ehs-capture]: request r1: /hs/r1.safetensors was not written: the write failed"
EMBEDS = "spec_compat[ehs-capture]: request r2 has no prompt token ids (prompt embeddings): nothing to write"


@pytest.mark.parametrize("params", [
    None, {}, {"hidden_states_path": "/hs/r.safetensors"},
    {"hidden_states_path": "/hs/r.safetensors", "error": WRITE},  # a path wins: the file exists
    {"hidden_states_path": None, "error": "another connector's trouble"},
    {"hidden_states_path": None, "error": 3}, {"hidden_states_path": None}, ["hidden_states_path"], "error",
])
def test_anything_but_the_connectors_error_passes_through(params):
    assert error_answer(params) is None


def test_a_failed_write_is_a_server_error_with_the_message():
    assert error_answer({"hidden_states_path": None, "error": WRITE}) == ErrorAnswer(500, "InternalServerError", WRITE)


def test_a_prompt_without_token_ids_is_the_clients_error():
    assert error_answer({"hidden_states_path": None, "error": EMBEDS}) == ErrorAnswer(400, "BadRequestError", EMBEDS)


class _Serving:
    """The two methods the patch touches, with upstream's parameter names."""

    def __init__(self, params):
        self.params = params

    async def create_completion(self, request, raw_request=None):
        await asyncio.sleep(0)
        return SimpleNamespace(kv_transfer_params=self.params, request=request)

    def create_error_response(self, message, err_type="BadRequestError", status_code=HTTPStatus.BAD_REQUEST,
                              param=None):
        return ("error", message, err_type, status_code)


def test_the_wrapper_answers_the_error_and_leaves_good_answers_alone(tmp_path):
    import threading

    from spec_compat.patches.hidden_states.ehs_write_error_status import _create_completion

    async def call(params):
        serving = _Serving(params)
        return await _create_completion(serving.create_completion, serving, ("req",), {})

    path = tmp_path / "x.safetensors"
    (tmp_path / "x.safetensors.lock").write_text("")
    # the writer thread renames the file into place after the answer left the engine: the answer waits
    def put_in_place():
        tmp = tmp_path / ".x.safetensors.tmp"
        tmp.write_text("rows")
        os.replace(tmp, path)

    threading.Timer(0.2, put_in_place).start()
    good = asyncio.run(call({"hidden_states_path": str(path)}))
    assert good.kv_transfer_params == {"hidden_states_path": str(path)} and good.request == "req"
    assert path.read_text() == "rows" and not (tmp_path / "x.safetensors.lock").exists()
    # the write failed after the answer left the engine: its .error marker becomes HTTP 500
    late = tmp_path / "late.safetensors"
    (tmp_path / "late.safetensors.error").write_text(WRITE + "\n")
    assert asyncio.run(call({"hidden_states_path": str(late)})) == (
        "error", WRITE, "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR)
    assert asyncio.run(call({"hidden_states_path": None, "error": WRITE})) == (
        "error", WRITE, "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR)
    assert asyncio.run(call({"hidden_states_path": None, "error": EMBEDS}))[2:] == (
        "BadRequestError", HTTPStatus.BAD_REQUEST)
