"""vLLM 0.17's hidden-states KV-cache group as connectors see it, on vLLM 0.15/0.16.

hs-connectors 0.9.0's ``MooncakeHiddenStatesConnector`` imports ``HiddenStateCacheSpec``
(``vllm/v1/kv_cache_interface.py``) and ``CacheOnlyAttentionLayer``
(``vllm/model_executor/models/extract_hidden_states.py``), both added in vLLM 0.17 (PR #33736),
and reads the method and its layer ids from ``vllm_config.speculative_config``, which the
backport does not build (``ehs-config``).  Here those names exist
(:mod:`spec_compat.shims.hidden_states.cache_group`), and a connector that is not the backport's
own is created with a view of the configuration that describes the method; ``ehs-capture`` hands
it the store's tensor as the cache-only layer's KV cache.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.hidden_states.contract import SETTINGS_KEY
from .. import _guards as guard
from . import VLLM_WITHOUT_EHS

FACTORY = "vllm.distributed.kv_transfer.kv_connector.factory"
#: vLLM >= 0.17's module of the cache-only layer, answered by the backport's module
LAYER_MODULE = "vllm.model_executor.models.extract_hidden_states"
SPEC_MODULE = "vllm.v1.kv_cache_interface"
BACKPORT = "spec_compat.shims.hidden_states.cache_group"

PROOF = "tests/server/test_mooncake.py::test_mooncake_backend_fails_with_only_this_patch_disabled"


def _create_connector(wrapped: Any, _factory: Any, args: tuple, kwargs: dict) -> Any:
    config = args[0] if args else kwargs["config"]
    kv = config.kv_transfer_config
    settings = (kv.kv_connector_extra_config or {}).get(SETTINGS_KEY) if kv is not None else None
    # ehs-config sorted the connector once: the backport's writers (and subclasses) get a storage
    # directory and see the configuration as it is; readers of the cache group get none
    if settings is None or settings["storage"] is not None:
        return wrapped(*args, **kwargs)
    from ...shims.hidden_states.cache_group import connector_view

    view = connector_view(config, settings["layer_ids"])
    if args:
        args = (view, *args[1:])
    else:
        kwargs = {**kwargs, "config": view}
    return wrapped(*args, **kwargs)


@register
class HiddenStatesCacheGroup(Patch):
    """hs-connectors 0.9.0's Mooncake backend (``speculators train --hidden-states-backend mooncake`` and its
    ``MooncakeHiddenStatesConnector``) on vLLM 0.15/0.16: the connector imports ``HiddenStateCacheSpec`` and
    ``CacheOnlyAttentionLayer`` (vLLM 0.17's hidden-states KV-cache group, PR #33736) and reads the method
    (its layer ids) from ``speculative_config`` - loud: ``ImportError: cannot import name
    'HiddenStateCacheSpec' from 'vllm.v1.kv_cache_interface'`` when the server creates it."""

    id = "ehs-cache-group"
    proof = Proof("fails", PROOF, r"cannot import name 'HiddenStateCacheSpec' from 'vllm\.v1\.kv_cache_interface'")
    summary = ("connectors built on vLLM 0.17's hidden-states KV-cache group (hs-connectors' Mooncake): "
               "HiddenStateCacheSpec, CacheOnlyAttentionLayer and the method's config are there; the "
               "backport's store is the layer's cache")
    upstream = ("vLLM <=0.16 lacks v1/kv_cache_interface.py HiddenStateCacheSpec and "
                "models/extract_hidden_states.py (0.17, PR #33736); hs-connectors 0.9.0's Mooncake connector needs both")
    target = f"{FACTORY}:KVConnectorFactory"
    requires = {"vllm": VLLM_WITHOUT_EHS}
    side = "server"

    def check(self, module: ModuleType) -> None:
        factory = guard.attr(module, "KVConnectorFactory")
        guard.has_params(factory.create_connector, "KVConnectorFactory.create_connector", "config", "role")
        spec = importlib.import_module(SPEC_MODULE)
        if hasattr(spec, "HiddenStateCacheSpec"):
            raise TargetChanged(f"{SPEC_MODULE} has its own HiddenStateCacheSpec")

    def install(self, module: ModuleType, changes: Changes) -> None:
        backport = importlib.import_module(BACKPORT)
        spec = importlib.import_module(SPEC_MODULE)
        changes.setattr(spec, "HiddenStateCacheSpec", backport.HiddenStateCacheSpec)
        changes.setitem(sys.modules, LAYER_MODULE, backport, label=f"sys.modules[{LAYER_MODULE!r}]")
        changes.wrap(module.KVConnectorFactory, "create_connector", _create_connector)
