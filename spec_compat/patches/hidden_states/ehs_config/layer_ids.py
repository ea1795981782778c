"""Checking the layer ids of vLLM's ``extract_hidden_states`` method
(``draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids``).

Convention (:data:`LAYER_ID_CONVENTION`), N = ``num_hidden_layers`` of the target's text config:

* id i < N: the input of decoder layer i, ``hidden + residual`` (id 0: the embedding);
* id N: the output of the last decoder layer, before the final norm.

Accepted: a non-empty list of distinct integers 0 <= id <= N (``bool`` is not an integer
here).  The states are stored in ascending id order, whatever order the request gave.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

#: prefix of every error message raised here
#: the configuration key checked
KEY = "eagle_aux_hidden_state_layer_ids"
LAYER_ID_CONVENTION = (
    "id i < N = input of decoder layer i (hidden + residual; id 0 = the embedding), "
    "id N = output of the last decoder layer before the final norm (N = num_hidden_layers)"
)


class LayerIdError(ValueError):
    """Unusable layer ids; the message names the offending ids, N and the accepted range."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _accepted(n: int) -> str:
    return f"accepted: a non-empty list of distinct integers 0 <= id <= N, N = num_hidden_layers = {n}"


def check_layer_ids(ids: Any, num_hidden_layers: int) -> tuple[int, ...]:
    """``ids`` checked against ``num_hidden_layers`` (N); returned ascending (storage order).

    Raises :class:`LayerIdError` for: a non-list, an empty list, non-integers (bools
    included), ids < 0 or > N, repeated ids (checked in that order).
    """
    n = num_hidden_layers
    if not _is_int(n) or n < 1:
        raise LayerIdError(f"spec_compat[ehs-config]: num_hidden_layers must be a positive integer, got {n!r}")
    problem = ""
    if not isinstance(ids, (list, tuple)):
        problem = f"not a list ({type(ids).__name__})"
    elif not ids:
        problem = "empty"
    elif bad := [i for i in ids if not _is_int(i)]:
        problem = f"not integers {bad}"
    elif bad := [i for i in ids if not 0 <= i <= n]:
        problem = f"out of range {bad}"
    elif bad := sorted(i for i, count in Counter(ids).items() if count > 1):
        problem = f"repeated {bad}"
    if problem:
        raise LayerIdError(f"spec_compat[ehs-config]: {KEY} {ids!r}: {problem}; {_accepted(n)}")
    return tuple(sorted(int(i) for i in ids))
