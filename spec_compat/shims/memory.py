"""F2: a memory budget for the KV cache that does not assume CUDA.

speculators 0.3.0 sizes its KV cache from ``torch.cuda.mem_get_info()``.  On a
CUDA device that stays exactly as it was.  Without CUDA the platform's own KV
budget is used: on vLLM's CPU platform that is ``VLLM_CPU_KVCACHE_SPACE``
(``CpuPlatform.get_device_total_memory``); other platforms are asked through
``torch.<device_type>.mem_get_info``.  No number is ever invented.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

log = logging.getLogger("spec_compat")


def platform_mem_get_info(patch_id: str) -> tuple[int, int]:
    """(free, total) bytes that the running platform offers for the KV cache (``patch_id``: the
    patch that asks, named in the log and the error)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.mem_get_info()
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        budget = int(current_platform.get_device_total_memory())
        log.info("spec_compat[%s]: no CUDA; KV cache budget from the CPU platform: %.2f GiB", patch_id,
                 budget / 2**30)
        return budget, budget
    device = getattr(torch, str(current_platform.device_type), None)
    info = getattr(device, "mem_get_info", None)
    if info is None:
        raise RuntimeError(
            f"spec_compat[{patch_id}]: cannot size the KV cache on platform {current_platform.device_type!r}: "
            "CUDA is not available and the platform exposes no mem_get_info"
        )
    return info()


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
