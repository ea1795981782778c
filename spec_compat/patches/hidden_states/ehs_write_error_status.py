"""A failed hidden-states write answers an HTTP error (vLLM 0.15/0.16 backport).

The backport's connector can report a request it could not write only through the response's
``kv_transfer_params`` (``hidden_states_path: null`` + ``error``); vLLM 0.15/0.16's
``completion/serving.py`` ``create_completion`` answers that with HTTP 200, and speculators'
client fails with "Response kv_transfer_params missing both 'hidden_states_path' and 'handle'",
not naming the cause.  Here the answer becomes HTTP 500 (400 for a prompt without token ids)
with the connector's message.  The connector writes on a background thread: an answer that names
a file is sent once the file is in place (its ``.lock`` removed), or as HTTP 500 if the write failed.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, register
from ...shims.hidden_states.http_errors import ErrorAnswer, error_answer, pending_path, wait_written
from .. import _guards as guard
from . import VLLM_WITHOUT_EHS

log = logging.getLogger("spec_compat")

PROOF = "tests/server/test_write_errors.py::test_failed_write_answers_an_http_error"


async def _create_completion(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = await wrapped(*args, **kwargs)
    params = getattr(result, "kv_transfer_params", None)
    answer = error_answer(params)
    path = pending_path(params)
    if path is not None:
        failure = await wait_written(path)
        if failure is not None:
            answer = ErrorAnswer(500, "InternalServerError", failure)
    if answer is None:
        return result
    from http import HTTPStatus

    log.warning("spec_compat[ehs-write-error-status]: HTTP %d: %s", answer.status, answer.message)
    return instance.create_error_response(answer.message, err_type=answer.err_type,
                                          status_code=HTTPStatus(answer.status))


@register
class ExtractionWriteErrorStatus(Patch):
    """The backport's failed write (storage directory gone, replaced, unwritable or full) on vLLM 0.15/0.16:
    ``completion/serving.py`` ``create_completion`` answers HTTP 200 with ``hidden_states_path: null``, and
    speculators' client fails with "Response kv_transfer_params missing both 'hidden_states_path' and
    'handle'" - the cause is only in the server log; now HTTP 500 with the cause."""

    id = "ehs-write-error-status"
    proof = Proof("wrong-values", PROOF, r"HTTP 200 for a request whose hidden states were not written")
    summary = ("/v1/completions answers once the hidden-states file is in place, and HTTP 500 with the "
               "connector's message when it was not written (400 for a prompt without token ids), not 200 "
               "with a null path")
    upstream = ("vLLM 0.15/0.16 completion/serving.py create_completion: a connector's error in "
                "kv_transfer_params still answers HTTP 200 (the backport's failed write)")
    target = "vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion"
    requires = {"vllm": VLLM_WITHOUT_EHS}
    side = "server"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "OpenAIServingCompletion")
        guard.exact_params(cls.create_completion, "OpenAIServingCompletion.create_completion",
                           "self", "request", "raw_request")
        guard.has_params(cls.create_error_response, "OpenAIServingCompletion.create_error_response",
                         "message", "err_type", "status_code")

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.wrap(module.OpenAIServingCompletion, "create_completion", _create_completion)
