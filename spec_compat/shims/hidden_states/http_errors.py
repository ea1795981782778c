"""The HTTP answer of an extraction request whose hidden states were not written.

The backport's connector (:mod:`.connector`) can only report a failed write inside the
response's ``kv_transfer_params`` (``{"hidden_states_path": None, "error": message}``); vLLM's
completions endpoint would still answer HTTP 200.  :func:`error_answer` turns such an answer
into an HTTP error: 400 when the request itself cannot be extracted (a prompt given as
embeddings has no token ids), 500 when the server failed to write the file (storage gone,
unwritable or full: :func:`storage_problem` says which, as far as another process can tell).
Pure Python; imports nothing of vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .contract import PATH_KEY

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
