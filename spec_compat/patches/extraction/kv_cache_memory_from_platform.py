"""Driver-side patch of the speculators 0.3.x generator: its KV cache sized from the platform's
budget when CUDA is absent (F2; mem-get-info-from-platform does the same on 0.4.x).

It acts on a name that ``vllm_hidden_states_generator`` bound at import (see
:mod:`spec_compat.core.bindings`), so vLLM itself stays untouched for every other
caller in the process.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.module_view import ModuleView
from ._generator_target import GENERATOR
from ._platform_memory import platform_mem_get_info
from ..ranges import SPEC_03


@register
class KvCacheMemoryFromPlatform(Patch):
    """speculators 0.3.0 (generator:133) sizes the KV cache with
    ``torch.cuda.mem_get_info()``: without CUDA it raises (CPU engines, other
    accelerators).  With CUDA nothing changes."""

    id = "kv-cache-memory-from-platform"
    proof = Proof("fails", SELFTEST, r"free_memory, _ = torch\.cuda\.mem_get_info\(\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system", using="llama short")
    summary = "KV cache sized from the platform's budget when CUDA is absent (CUDA unchanged)"
    upstream = "speculators 0.3.0 generator:133 torch.cuda.mem_get_info(): no CUDA -> RuntimeError"
    fixes = ("F2",)
    target = f"{GENERATOR}:torch"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11"}

    def check(self, module: ModuleType) -> None:
        torch = getattr(module, "torch")
        if not isinstance(torch, ModuleType) or not hasattr(getattr(torch, "cuda", None), "mem_get_info"):
            raise TargetChanged(f"{GENERATOR}.torch is not the torch module with cuda.mem_get_info")

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.setattr(module, "torch", TorchView(module.torch, self.id))


def TorchView(torch: ModuleType, patch_id: str) -> ModuleView:  # noqa: N802 - the view's name
    """Stands in for the ``torch`` module inside one consumer module: ``torch.cuda.mem_get_info``
    answered by :func:`platform_mem_get_info` and ``empty_cache`` a no-op when CUDA is absent."""
    cuda = torch.cuda

    def mem_get_info(*args: Any) -> tuple[int, int]:
        if args or cuda.is_available():
            return cuda.mem_get_info(*args)
        return platform_mem_get_info(patch_id)

    def empty_cache() -> None:
        if cuda.is_available():
            cuda.empty_cache()

    return ModuleView(torch, cuda=ModuleView(cuda, mem_get_info=mem_get_info, empty_cache=empty_cache))
