"""A Mooncake extraction is answered once its sample is in the store (hs-connectors 0.9, on the
vLLM 0.15/0.16 backport and on vLLM's own extraction API alike: the connector is the same).

hs-connectors 0.9.0's Mooncake connector puts a sample after its request has been answered: with the
master killed mid-run the put fails ('Mooncake put_from failed ... status=-900'), the error marker
cannot be published either, and the client got HTTP 200 with the handle of a sample no store holds.
"""

from __future__ import annotations

import json
import logging
import threading
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, register
from .http_errors import ExtractionWriteErrorStatus

log = logging.getLogger("spec_compat")

PID = "mooncake-answer-after-put"
PROOF = "tests/server/test_mooncake_master_killed.py::test_answers_unstored_samples_only_without_this_patch"

#: one watch per store configuration in this process (an API server serves one)
_WATCHES: dict[str, Any] = {}
_LOCK = threading.Lock()


def _watch(instance: Any) -> Any:
    """The StoreWatch of the store the server's connector puts into (None: not hs-connectors' Mooncake
    connector).  The shim is imported here, at the first Mooncake answer, not with the registry."""
    from ...shims.hidden_states.mooncake_answer import StoreWatch
    from ...shims.hidden_states.mooncake_master import mooncake_settings

    engine = getattr(instance, "engine_client", None)
    config = getattr(getattr(engine, "vllm_config", None), "kv_transfer_config", None)
    settings = mooncake_settings(config)
    if settings is None:
        return None
    key = json.dumps(settings, sort_keys=True, default=str)
    with _LOCK:
        if key not in _WATCHES:
            _WATCHES[key] = StoreWatch(settings, PID)
        return _WATCHES[key]


async def _create_completion(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = await wrapped(*args, **kwargs)
    from ...shims.hidden_states.offline_store import is_store_manifest

    params = getattr(result, "kv_transfer_params", None)
    if not is_store_manifest(params):  # a Mooncake answer (the transfer manifest) only
        return result
    watch = _watch(instance)
    if watch is None:
        return result
    handle = params["handle"]
    answer = await watch.wait_stored(handle)
    if answer is None:
        return result
    from http import HTTPStatus

    log.warning("spec_compat[%s]: HTTP %d: %s", PID, answer.status, answer.message)
    return instance.create_error_response(answer.message, err_type=answer.err_type,
                                          status_code=HTTPStatus(answer.status))


@register
class MooncakeAnswerAfterPut(Patch):
    """hs-connectors 0.9.0's Mooncake connector answers a request with its sample's handle (``request_finished``)
    and puts the sample afterwards on a worker thread (``_write_sample``); with the master killed mid-run (or
    the store full) the put fails (``Mooncake put_from failed ... status=-900`` / ``-200``), only the log says
    so, and the client holds an HTTP 200 with the handle of a sample no store holds - silent until its reader
    fails; now the API server answers once the sample is in the store: 503 naming the master, 500 with the
    worker's error marker (store full), 504 after 30 s (vLLM 0.15/0.16 and native 0.32 alike)."""

    id = PID
    proof = Proof("wrong-values", PROOF, r"HTTP 200 with the handle of a sample the store does not hold")
    summary = ("/v1/completions answers a Mooncake extraction once its sample is in the store: HTTP 503 naming "
               "the master when the store does not answer (clients retry), 500 with the worker's error marker, "
               "504 after 30 s; not 200 with the handle of a sample that was never stored")
    upstream = ("hs-connectors 0.9.0 MooncakeHiddenStatesConnector: request_finished answers with the handle, "
                "_write_sample puts later on a worker thread; a failed put is only logged")
    target = "vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion"
    requires = {"hs-connectors": ">=0.9,<0.10"}
    after = ("ehs-write-error-status",)
    side = "server"

    def check(self, module: ModuleType) -> None:
        ExtractionWriteErrorStatus.check(self, module)  # the same target, wrapped after it

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.wrap(module.OpenAIServingCompletion, "create_completion", _create_completion)
