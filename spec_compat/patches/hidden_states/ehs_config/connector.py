"""A KV connector that writes each prompt's hidden states to a safetensors file (vLLM 0.15/0.16).

vLLM's name ``ExampleHiddenStatesConnector`` resolves here (``ehs-config`` sets ``kv_connector_module_path``).
* Scheduler side: tracks each request's prompt ids and KV block ids; the step that computes a prompt's last token
  lists one save.  :meth:`request_finished` answers ``{"hidden_states_path": path}``, or ``None`` + ``error``.
* Worker side (TP rank 0, holding ehs-capture's
  :class:`~spec_compat.patches.hidden_states.ehs_capture.HiddenStatesStore`): ``wait_for_save`` gathers the prompt's
  rows (on a GPU queued to pinned memory, :func:`~spec_compat.shims.hidden_states.writer.host_rows`; for
  hs-connectors' fp8 writer quantized on the GPU first, :func:`.fp8_rows.device_fp8`) for a
  :class:`~spec_compat.shims.hidden_states.writer.BackgroundWriter`: the step removes a stale file
  and takes ``<path>.lock`` (a broken storage directory fails here: the answer names it); the writer thread writes
  (temp file + rename) and releases the lock.  A failed write is logged and marked (``.error``); the engine goes on.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole,
)

from ....shims.hidden_states.cache_group import extract_from_kv_cache  # noqa: F401 (vLLM >= 0.17's helper, for connectors of its cache)
from ....shims.hidden_states.contract import CONNECTOR_NAME, PATH_KEY, SETTINGS_KEY
from ....shims.hidden_states.files import HiddenStatesWriteError, _mark_error, final_path, hidden_states_tensors, lock_path
from ....shims.hidden_states.http_errors import storage_problem
from ....shims.hidden_states.upstream_writer import save_and_release
from ....shims.hidden_states.writer import FAILED, PENDING, BackgroundWriter, host_rows, outcome, static_override
from .fp8_rows import device_fp8, is_hs_connectors_fp8

log = logging.getLogger("spec_compat")


@dataclass
class Save:
    req_id: str
    path: str
    token_ids: list[int]
    block_ids: list[int]


@dataclass
class HiddenStatesMetadata(KVConnectorMetadata):
    saves: list[Save] = field(default_factory=list)


@dataclass
class _Tracked:
    token_ids: list[int] | None
    block_ids: list[int]
    path: str | None = None  # set once the save is scheduled


def settings_of(vllm_config: Any) -> dict[str, Any]:
    kv = vllm_config.kv_transfer_config
    settings = (kv.kv_connector_extra_config or {}).get(SETTINGS_KEY) if kv is not None else None
    if not settings:
        raise ValueError(
            f"spec_compat[ehs-capture]: {CONNECTOR_NAME} writes the hidden states of the speculative method "
            "'extract_hidden_states'; pass --speculative-config with that method (and its layer ids) too"
        )
    return settings


class HiddenStatesConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        settings = settings_of(vllm_config)
        self.storage = str(settings["storage"])
        self.layer_ids = tuple(settings["layer_ids"])
        self._tracked: dict[str, _Tracked] = {}
        self.store: Any = None  # worker side, TP rank 0: set by ehs-capture
        self.writer: BackgroundWriter | None = None  # worker side, created with the first write

    # -- worker side -----------------------------------------------------------------------
    def attach_store(self, store: Any) -> None:
        self.store = store

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None
    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, HiddenStatesMetadata) or not meta.saves:
            return
        if self.store is None:
            from vllm.distributed import get_tensor_model_parallel_rank

            if get_tensor_model_parallel_rank() != 0:
                return  # rank 0 writes
            raise RuntimeError("spec_compat[ehs-capture]: no hidden-state store in this worker: the patch ehs-capture is "
                               "not applied (it covers vLLM's CPU model runner), nothing captures the layers")
        metadata = {"layer_ids": ",".join(map(str, self.store.layer_ids))}
        if self.writer is None:
            self.writer = BackgroundWriter()
        write = self.tensor_writer()
        fp8 = is_hs_connectors_fp8(write)
        for save in meta.saves:
            try:
                rows = self.store.rows(save.block_ids, len(save.token_ids))
                if fp8 and rows.device.type != "cpu":  # quantized on the device: the host path's bytes (fp8_rows)
                    self.writer.submit(save.path, *device_fp8(rows, save.token_ids))
                    continue
                rows, ready = host_rows(rows)
                self.writer.submit(save.path, hidden_states_tensors(rows, save.token_ids), metadata, ready, write)
            except HiddenStatesWriteError as exc:
                log.error("%s", exc)
            except Exception as exc:  # a bad request must not stop the engine
                message = f"spec_compat[ehs-capture]: request {save.req_id}: {type(exc).__name__}: {exc}"
                log.exception("%s", message)
                _mark_error(save.path, message)

    #: vLLM >= 0.17's hook: a subclass's override (hs-connectors' fp8 quantizes there) writes each file
    _write_tensors = staticmethod(save_and_release)

    @classmethod
    def tensor_writer(cls) -> Any:
        """A subclass's ``_write_tensors`` override, or None (this class's own write)."""
        return static_override(cls, HiddenStatesConnector, "_write_tensors")

    @property
    def writes(self) -> int:
        """Files written so far (the writer thread's count; queued writes not included)."""
        return self.writer.written if self.writer is not None else 0

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for the queued writes (tests, shutdown); False when ``timeout`` passed first."""
        return self.writer.drain(timeout) if self.writer is not None else True

    def shutdown(self) -> None:
        if self.writer is not None:
            self.writer.close()

    # -- scheduler side --------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = HiddenStatesMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            tracked = self._tracked.get(new.req_id)
            if tracked is None:
                ids = list(new.prompt_token_ids) if new.prompt_token_ids is not None else None
                tracked = self._tracked[new.req_id] = _Tracked(ids, [])
            tracked.block_ids = list(new.block_ids[0])
            self._maybe_save(meta, new.req_id, tracked, new.num_computed_tokens + scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_blocks[0]) if new_blocks is not None else []
            elif new_blocks is not None:
                tracked.block_ids.extend(new_blocks[0])
            self._maybe_save(meta, req_id, tracked, cached.num_computed_tokens[i] + scheduled.get(req_id, 0))
        return meta

    def _maybe_save(self, meta: HiddenStatesMetadata, req_id: str, tracked: _Tracked, done: int) -> None:
        if tracked.path is not None or tracked.token_ids is None or done < len(tracked.token_ids):
            return
        tracked.path = final_path(self.storage, req_id)
        meta.saves.append(Save(req_id, tracked.path, tracked.token_ids, list(tracked.block_ids)))

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        tracked = self._tracked.pop(request.request_id, None)
        if tracked is None:
            return False, None
        if tracked.token_ids is None:
            return False, {PATH_KEY: None,
                           "error": f"spec_compat[ehs-capture]: request {request.request_id} has no prompt token ids "
                                    "(prompt embeddings): nothing to write"}
        if tracked.path is None:  # finished (aborted) before its prompt was computed
            return False, None
        state, message = outcome(tracked.path)
        if state == FAILED:
            return False, {PATH_KEY: None, "error": message}
        # written, or being written (the step took its lock); neither: not even the lock was created
        if state == PENDING and not os.path.exists(lock_path(tracked.path)):
            return False, {PATH_KEY: None, "error": f"spec_compat[ehs-capture]: request {request.request_id}: {tracked.path} was "
                                                    f"not written: {storage_problem(self.storage)} (see the engine log)"}
        return False, {PATH_KEY: tracked.path}


#: the name vLLM's factory looks up, and the base class hs-connectors imports (ehs-connector-module)
ExampleHiddenStatesConnector = HiddenStatesConnector
