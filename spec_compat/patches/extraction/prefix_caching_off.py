"""Driver-side patch of the speculators 0.3.x generator on vLLM >= 0.12: the CacheConfig it builds
turns prefix caching off, so every prompt row is computed and captured (F8).

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
class PrefixCachingOff(Patch):
    """vLLM 0.12 turns prefix caching on by default and needs a ``block_hasher`` on
    each Request (assertion in block_pool for prompts >= one block).  A cache hit
    skips computing the cached rows, so the capture silently loses them (58 -> 20)."""

    id = "prefix-caching-off"
    proof = Proof("fails", SELFTEST, r"assert len\(request\.block_hashes\) >= num_full_blocks.*\n(?:  .*\n)*AssertionError\b", using="llama batch-43-shared-prefixes")
    summary = "CacheConfig(enable_prefix_caching=False): every prompt row is computed and captured"
    upstream = "vLLM 0.12.0 config/cache.py prefix caching on; Request lacks block_hasher -> assert / lost rows"
    fixes = ("F8",)
    target = f"{GENERATOR}:CacheConfig"
    requires = {"speculators": SPEC_03, "vllm": ">=0.12"}

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "CacheConfig"), "CacheConfig", "enable_prefix_caching", "block_size")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def adapt(kw: dict[str, Any]) -> dict[str, Any]:
            kw["enable_prefix_caching"] = False
            return kw

        bindings.adapt_call(changes, module, "CacheConfig", adapt)
