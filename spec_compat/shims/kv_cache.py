"""F3: ``get_kv_cache_config_from_groups`` lost its ``kv_cache_specs`` parameter (vLLM 0.12)."""

from __future__ import annotations

import inspect
from typing import Any


def drop_removed_kwargs(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Drop keyword arguments that ``fn`` no longer accepts (and that it never needed)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}
