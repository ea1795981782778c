"""Two Triton ``Autotuner`` objects made by one ``triton.autotune(...)`` decorator share the
lists it was given (``configs``, ``keys``) and the ``Config`` objects in them.  Dynamo
(torch 2.11) refuses to trace two kernels reaching one mutable list from two sources
("ListVariable ... is already tracked for mutation").  :func:`shared_containers` names the
shared attributes, :func:`own_copy` makes the second tuner's copies.  Imports neither torch nor
triton.
"""

from __future__ import annotations

import copy
from typing import Any

#: mutable containers compared by identity (immutable values may be shared freely)
_CONTAINERS = (list, dict, set)


def shared_containers(first: Any, second: Any) -> list[str]:
    """Attribute names whose value is one and the same list, dict or set in both objects."""
    mine = vars(second)
    theirs = vars(first)
    return sorted(name for name, value in mine.items()
                  if isinstance(value, _CONTAINERS) and theirs.get(name) is value)


def own_copy(value: Any) -> Any:
    """A new container with copies of the items that are objects with attributes (a tuner's
    ``Config`` entries); plain values are kept."""
    def item(v: Any) -> Any:
        return copy.copy(v) if hasattr(v, "__dict__") or hasattr(v, "__slots__") else v

    if isinstance(value, list):
        return [item(v) for v in value]
    if isinstance(value, dict):
        return {k: item(v) for k, v in value.items()}
    return {item(v) for v in value}
