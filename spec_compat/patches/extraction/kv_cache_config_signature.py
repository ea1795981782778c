"""Driver-side patch of the speculators 0.3.x generator on vLLM >= 0.12: its KV-cache config call
without the removed ``kv_cache_specs`` (F3).

It acts on a name that ``vllm_hidden_states_generator`` bound at import (see
:mod:`spec_compat.core.bindings`), so vLLM itself stays untouched for every other
caller in the process.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core import bindings
from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ._generator_target import GENERATOR
from ..ranges import SPEC_03


@register
class KvCacheConfigSignature(Patch):
    """vLLM 0.12 (v1/core/kv_cache_utils.py) removed the ``kv_cache_specs``
    parameter of ``get_kv_cache_config_from_groups``; generator:136 passes it."""

    id = "kv-cache-config-signature"
    proof = Proof("fails", SELFTEST, r"TypeError: get_kv_cache_config_from_groups\(\) got an unexpected keyword argument 'kv_cache_specs'", using="llama short")
    summary = "get_kv_cache_config_from_groups called without the removed kv_cache_specs"
    upstream = "vLLM 0.12.0 v1/core/kv_cache_utils.py: kv_cache_specs removed -> TypeError"
    fixes = ("F3",)
    target = f"{GENERATOR}:get_kv_cache_config_from_groups"
    requires = {"speculators": SPEC_03, "vllm": ">=0.12"}

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "get_kv_cache_config_from_groups")
        guard.has_params(fn, "get_kv_cache_config_from_groups", "vllm_config", "kv_cache_groups", "available_memory")
        guard.lacks_params(fn, "get_kv_cache_config_from_groups", "kv_cache_specs")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def adapt(kw: dict[str, Any]) -> dict[str, Any]:
            kw.pop("kv_cache_specs", None)
            return kw

        bindings.adapt_call(changes, module, "get_kv_cache_config_from_groups", adapt)
