"""The hand-off of vLLM >= 0.28's ``ExampleHiddenStatesConnector`` when its cache lives in host memory.

Upstream copies a finished request's rows out of the KV cache on a CUDA side stream into pinned
host memory and lets a writer thread wait on a CUDA event.  On the CPU build the cache is already
in host memory and there is no CUDA: the rows are copied out synchronously (they must leave the
cache before its blocks are reused) and the writer gets an event that is already complete.
Everything else - slot order, lock file, writer pool, bookkeeping - stays the connector's own.
"""

from __future__ import annotations

import fcntl
import logging
import os
from functools import partial
from typing import Any, Callable

log = logging.getLogger("spec_compat")


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
