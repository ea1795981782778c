"""vLLM >= 0.17's view of the hidden-states cache, for connectors written against it (vLLM 0.15/0.16).

In vLLM 0.17 (PR #33736) the requested layers' states are the KV cache of a ``CacheOnlyAttentionLayer``
(``vllm.model_executor.models.extract_hidden_states``) in a KV-cache group of its own
(``HiddenStateCacheSpec``); a connector gets that tensor from ``register_kv_caches`` and gathers a
request's rows with ``extract_from_kv_cache`` by its block ids.  The backport keeps the rows in a
store shaped ``(num_blocks, block_size, L, H)`` that shares the target's block ids (one group):
``ehs-capture`` hands the store's tensor to the connector under :data:`LAYER_NAME`, registered as a
:class:`CacheOnlyAttentionLayer`, so such a connector (hs-connectors' Mooncake backend) finds it;
no group carries :class:`HiddenStateCacheSpec`, and a connector that looks for one falls back to the
single group, whose block ids index the store.

This module is also importable as ``vllm.model_executor.models.extract_hidden_states`` once
``ehs-cache-group`` is applied.  It imports neither torch nor vLLM.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

#: the name the store's tensor carries among the KV caches handed to the connector
LAYER_NAME = "spec_compat.extract_hidden_states.cache"
#: the speculative method a connector's view of the configuration names
METHOD = "extract_hidden_states"


class CacheOnlyAttentionLayer:
    """The layer whose "KV cache" is the hidden-states store: ``kv_cache`` is ``[tensor]``, the
    tensor shaped ``(num_blocks, block_size, num_hidden_states, hidden_size)``."""

    def __init__(self, layer_name: str, num_hidden_states: int, hidden_size: int) -> None:
        self.layer_name = layer_name
        self.num_hidden_states = int(num_hidden_states)
        self.hidden_size = int(hidden_size)
        self.kv_cache: list[Any] = []


class HiddenStateCacheSpec:
    """Named for connectors that look for vLLM >= 0.17's hidden-states KV-cache group; here no
    group is one (the store shares the target's group), so ``isinstance`` is False for each."""


def extract_from_kv_cache(kv_cache: Any, slot_mapping: Any, num_tokens: int) -> Any:
    """Rows ``[num_tokens, L, H]`` of a ``(num_blocks, block_size, L, H)`` cache at the first
    ``num_tokens`` slots of ``slot_mapping`` (flat slot = block id x block size + offset)."""
    return kv_cache.flatten(0, 1)[slot_mapping[:num_tokens]]


def register_layer(vllm_config: Any, cache: Any, layer_ids: list[int], hidden_size: int) -> CacheOnlyAttentionLayer:
    """Put the layer holding ``cache`` into the static forward context, where
    ``get_layers_from_vllm_config`` finds layers by type and name."""
    layer = CacheOnlyAttentionLayer(LAYER_NAME, len(layer_ids), hidden_size)
    layer.kv_cache = [cache]
    vllm_config.compilation_config.static_forward_context[LAYER_NAME] = layer
    return layer


def connector_view(vllm_config: Any, layer_ids: list[int]) -> Any:
    """A shallow copy of ``vllm_config`` whose ``speculative_config`` describes the method as vLLM
    0.17 builds it (the backport builds none: no drafter runs); every other part is shared."""
    view = copy.copy(vllm_config)
    spec = SimpleNamespace(method=METHOD, num_speculative_tokens=1, draft_model_config=SimpleNamespace(
        hf_config=SimpleNamespace(eagle_aux_hidden_state_layer_ids=list(layer_ids))))
    object.__setattr__(view, "speculative_config", spec)
    return view


def reads_cache_group(cls: Any) -> bool:
    """Whether connector class ``cls`` gathers rows with this module's ``extract_from_kv_cache``
    (imported by its module from vLLM's connector module path, which the backport answers)."""
    import sys

    module = sys.modules.get(getattr(cls, "__module__", ""), None)
    return getattr(module, "extract_from_kv_cache", None) is extract_from_kv_cache
