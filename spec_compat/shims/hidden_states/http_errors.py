"""The HTTP answer of an extraction request whose hidden states were not written.

The backport's connector (:mod:`.connector`) can only report a failed write inside the
response's ``kv_transfer_params`` (``{"hidden_states_path": None, "error": message}``); vLLM's
completions endpoint would still answer HTTP 200.  :func:`error_answer` turns such an answer
into an HTTP error: 400 when the request itself cannot be extracted (a prompt given as
embeddings has no token ids), 500 when the server failed to write the file (storage gone,
unwritable or full: :func:`storage_problem` says which, as far as another process can tell).
The connector writes on a background thread (:mod:`.writer`), so an answer naming a path can
arrive before the file: :func:`wait_written` waits for it (or its ``.error`` marker) first.
Pure Python; imports nothing of vLLM.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .contract import PATH_KEY
from .files import _unlink_quietly, lock_path
from .writer import FAILED, WRITTEN, outcome

#: how long an answer waits for its file before it fails (the writer thread queues at most
#: writer.MAX_PENDING files; a 235 MB file, Kimi-K2.5 at 4k tokens, takes well under a second)
WRITE_WAIT_S = 600.0
#: first and longest pause between two looks at the file
_POLL_MIN_S, _POLL_MAX_S = 0.0005, 0.01

#: the prefix of every message the backport's connector puts under ``"error"``
OWN_PREFIX = "spec_compat[ehs-"
#: a request the server cannot extract at all (the client's fault): the connector's wording
_CLIENT_ERRORS = ("has no prompt token ids",)


@dataclass(frozen=True)
class ErrorAnswer:
    status: int
    err_type: str
    message: str


def error_answer(kv_transfer_params: Any) -> ErrorAnswer | None:
    """The HTTP error for a ``kv_transfer_params`` answer of the backport's connector that
    carries an error and no path; None for anything else (a written file, another connector's
    parameters, no parameters)."""
    if not isinstance(kv_transfer_params, Mapping) or kv_transfer_params.get(PATH_KEY) is not None:
        return None
    message = kv_transfer_params.get("error")
    if not isinstance(message, str) or not message.startswith(OWN_PREFIX):
        return None
    if any(fragment in message for fragment in _CLIENT_ERRORS):
        return ErrorAnswer(400, "BadRequestError", message)
    return ErrorAnswer(500, "InternalServerError", message)


def storage_problem(storage: str) -> str:
    """Why nothing (not even an ``.error`` marker) could be written under ``storage``, as far as
    the scheduler's process can tell."""
    if not os.path.exists(storage):
        return f"the hidden-states directory {storage} no longer exists"
    if not os.path.isdir(storage):
        return f"the hidden-states directory {storage} is no longer a directory"
    if not os.access(storage, os.W_OK | os.X_OK):
        return f"the hidden-states directory {storage} is not writable"
    try:
        free = os.statvfs(storage).f_bavail
    except OSError:
        free = None
    if free == 0:
        return f"no space left in the hidden-states directory {storage}"
    return "the write failed"


async def wait_written(path: str, timeout: float = WRITE_WAIT_S) -> str | None:
    """Wait until the connector's file ``path`` is in place; None then (its ``.lock`` removed, as a
    lock-aware reader removes it, so no client waits on it again), or the error message when the
    write failed (``.error``), the storage directory went away, or ``timeout`` seconds passed."""
    storage = os.path.dirname(path) or "."
    deadline = time.monotonic() + timeout
    pause = _POLL_MIN_S
    while True:
        state, message = outcome(path)
        if state == WRITTEN:
            _unlink_quietly(lock_path(path))
            return None
        if state == FAILED:
            return message
        if not os.path.isdir(storage):
            return f"spec_compat[ehs-capture]: {path} was not written: {storage_problem(storage)}"
        if time.monotonic() >= deadline:
            return (f"spec_compat[ehs-capture]: {path} was not written within {timeout:g} s "
                    "(see the engine log)")
        await asyncio.sleep(pause)
        pause = min(pause * 2, _POLL_MAX_S)


def pending_path(kv_transfer_params: Any) -> str | None:
    """The file an answer of the backport's connector names (None for anything else)."""
    if not isinstance(kv_transfer_params, Mapping):
        return None
    path = kv_transfer_params.get(PATH_KEY)
    return path if isinstance(path, str) and path else None

