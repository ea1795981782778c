"""A Mooncake extraction is answered once its sample is in the store (hs-connectors 0.9, on the
vLLM 0.15/0.16 backport and on vLLM's own extraction API alike: the connector is the same).

hs-connectors 0.9.0's Mooncake connector puts a sample after its request has been answered: with the
master killed mid-run the put fails ('Mooncake put_from failed ... status=-900'), the error marker
cannot be published either, and the client got HTTP 200 with the handle of a sample no store holds.

When the put fails (the master died, the store is full) the worker logs it and publishes an error
marker (``<handle>:error``) if it still can; the answer was HTTP 200 either way, and a client only
finds out when it reads.  Here the API server waits for the sample -- or its marker -- with a Mooncake
client of its own (no segment: it stores nothing) before answering, and answers an error
naming the store when the sample is not there:

* the master does not answer: 503, so the client retries (a restarted master is found again by
  every client within seconds; what the dead one held is gone);
* the worker's error marker: 500 with its message; no marker either and a store without room for
  one more byte (a full store refuses the marker too): 500 saying so;
* neither within :data:`STORED_WAIT_S` (30 s): 504.

Pure Python apart from :func:`open_store` (imports Mooncake's client, lazily).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, register
from ...shims.hidden_states.http_errors import ErrorAnswer
from ...shims.hidden_states.mooncake_master import master
from .ehs_write_error_status import ExtractionWriteErrorStatus

log = logging.getLogger("spec_compat")

PID = "mooncake-answer-after-put"
PROOF = "tests/server/test_mooncake_master_killed.py::test_answers_unstored_samples_only_without_this_patch"

#: one watch per store configuration in this process (an API server serves one)
_WATCHES: dict[str, Any] = {}
_LOCK = threading.Lock()


#: how long an answer waits for its sample: a put is a memory copy, milliseconds unless the worker's
#: write threads are queued (a 235 MB Kimi-K2.5 sample at 4k tokens: ~0.25 s over local TCP).  Below
#: common client timeouts (speculators' tests use 60 s), so the client reads why.  A put that failed
#: while the master was down but is looked for only after a restarted master answers (which knows
#: nothing of it) ends here too: neither the sample nor its marker ever comes.
STORED_WAIT_S = 30.0
#: how long the API server's own client may take to join the store (Mooncake's setup retries a
#: master that does not answer for ~90 s)
SETUP_WAIT_S = 10.0
#: a local buffer for reading error markers (the API server reads nothing else)
LOCAL_BUFFER = 16 * 1024 * 1024
_POLL_MIN_S, _POLL_MAX_S = 0.0005, 0.02
#: after this long with neither the sample nor its marker, one 1-byte put asks whether the store
#: has room at all (a full store refuses the worker's error marker too)
FULL_PROBE_AFTER_S = 2.0
#: Mooncake's status codes a failed put reports, in words (mooncake-transfer-engine 0.3.13)
STATUS_MEANING = {-200: ("no space left in the store's mounted segments (the store is full, or a restarted master "
                         "has no segment mounted yet)"),
                  -900: "the master does not answer (RPC failed)"}


def explain(message: str) -> str:
    """``message`` with the meaning of the Mooncake status code it ends with, where known."""
    for code, meaning in STATUS_MEANING.items():
        if message.rstrip().endswith(f"status={code}"):
            return f"{message}: {meaning}"
    return message


def open_store(settings: Mapping[str, Any], patch_id: str) -> Any:
    """A Mooncake client joined to the configured master, with no segment of its own."""
    from mooncake.store import MooncakeDistributedStore  # type: ignore[import-not-found]

    store = MooncakeDistributedStore()
    status = store.setup(str(settings.get("local_hostname", "localhost")),
                         str(settings.get("metadata_server", "P2PHANDSHAKE")), 0, LOCAL_BUFFER,
                         str(settings.get("protocol", "tcp")), str(settings.get("device_name", "")),
                         master(settings))
    if status != 0:
        raise RuntimeError(f"spec_compat[{patch_id}]: Mooncake's client setup returned status {status}")
    return store


class StoreWatch:
    """Waits for samples in one store.  Every call to Mooncake's client runs on one thread of its
    own (a call can block for seconds while the master is gone); the client joins at first use."""

    def __init__(self, settings: Mapping[str, Any], patch_id: str,
                 opener: Callable[[Mapping[str, Any], str], Any] = open_store) -> None:
        self.settings = dict(settings)
        self.patch_id = patch_id
        self._opener = opener
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="spec-compat-mooncake")
        self._lock = threading.Lock()
        self._store: Any = None
        self._setup: Any = None

    def _name(self) -> str:
        return f"the Mooncake store (master {master(self.settings)})"

    async def _client(self) -> Any:
        with self._lock:
            if self._store is not None:
                return self._store
            if self._setup is None or (self._setup.done() and self._setup.exception() is not None):
                self._setup = self._pool.submit(self._opener, self.settings, self.patch_id)
            setup = self._setup
        result = await asyncio.wait_for(asyncio.wrap_future(setup), SETUP_WAIT_S)
        with self._lock:
            self._store = result
        return result

    def _full(self, handle: str) -> bool:
        """Whether the store refuses a 1-byte put for lack of space (the probe is removed again)."""
        key = handle + ":spec-compat-room"
        status = self._store.put(key, b"\0")
        if status == 0:
            self._store.remove(key, True)
        return status == -200

    def _look(self, handle: str) -> tuple[int, int, str | None]:
        """(is_exist of the marker, is_exist of the sample, the marker's message if present)."""
        store = self._store
        marker = store.is_exist(handle + ":error")
        if marker == 1:
            raw = store.get(handle + ":error")
            try:
                message = json.loads(bytes(raw).decode("utf-8")).get("error")
            except (ValueError, AttributeError):
                message = None
            return marker, 0, str(message or raw)
        return marker, store.is_exist(handle), None

    async def wait_stored(self, handle: str, timeout: float = STORED_WAIT_S) -> ErrorAnswer | None:
        """None once ``handle`` is in the store; the error answer when it cannot be."""
        try:
            await self._client()
        except (Exception, asyncio.TimeoutError) as exc:  # noqa: BLE001 -- any failure to join is the answer
            text = str(exc).removeprefix(f"spec_compat[{self.patch_id}]: ")
            why = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
            return ErrorAnswer(503, "ServiceUnavailableError",
                               f"spec_compat[{self.patch_id}]: {self._name()} cannot be reached ({why}); sample "
                               f"{handle} is not known to be stored. Retry once the master is back.")
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        probe_at, probed = time.monotonic() + FULL_PROBE_AFTER_S, False
        pause = _POLL_MIN_S
        while True:
            marker, sample, message = await loop.run_in_executor(self._pool, self._look, handle)
            if marker == 1:
                return ErrorAnswer(500, "InternalServerError",
                                   f"spec_compat[{self.patch_id}]: the server could not put sample {handle} into "
                                   f"{self._name()}: {explain(str(message))}")
            if sample == 1:
                return None
            if marker < 0 or sample < 0:
                return ErrorAnswer(503, "ServiceUnavailableError",
                                   f"spec_compat[{self.patch_id}]: {self._name()} does not answer (status "
                                   f"{min(marker, sample)}); sample {handle} is not stored. Retry once the master "
                                   "is back.")
            if not probed and time.monotonic() >= probe_at:
                probed = True
                if await loop.run_in_executor(self._pool, self._full, handle):
                    return ErrorAnswer(500, "InternalServerError",
                                       f"spec_compat[{self.patch_id}]: sample {handle} is not in {self._name()} and "
                                       f"the store has no room for a 1-byte object: {STATUS_MEANING[-200]}")
            if time.monotonic() >= deadline:
                return ErrorAnswer(504, "GatewayTimeoutError",
                                   f"spec_compat[{self.patch_id}]: sample {handle} is not in {self._name()} "
                                   f"{timeout:g} s after its request finished (see the server log)")
            await asyncio.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)



def _watch(instance: Any) -> Any:
    """The StoreWatch of the store the server's connector puts into (None: not hs-connectors' Mooncake
    connector)."""
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
