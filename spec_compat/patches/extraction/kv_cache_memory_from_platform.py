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


class _CudaView:
    """``torch.cuda`` with ``mem_get_info`` answered by :func:`platform_mem_get_info`."""

    def __init__(self, cuda: ModuleType, patch_id: str) -> None:
        self._cuda = cuda
        self._patch_id = patch_id

    def mem_get_info(self, *args: Any) -> tuple[int, int]:
        if args or self._cuda.is_available():
            return self._cuda.mem_get_info(*args)
        return platform_mem_get_info(self._patch_id)

    def empty_cache(self) -> None:
        if self._cuda.is_available():
            self._cuda.empty_cache()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cuda, name)


class TorchView:
    """Stands in for the ``torch`` module inside one consumer module."""

    def __init__(self, torch: ModuleType, patch_id: str) -> None:
        self._torch = torch
        self.cuda = _CudaView(torch.cuda, patch_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def __repr__(self) -> str:
        return f"<spec_compat view of {self._torch!r}>"
