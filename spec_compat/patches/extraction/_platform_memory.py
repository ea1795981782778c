"""F2: a memory budget for the KV cache that does not assume CUDA (kv-cache-memory-from-platform on
speculators 0.3.x, mem-get-info-from-platform on 0.4.x).

speculators 0.3.0 sizes its KV cache from ``torch.cuda.mem_get_info()``.  On a
CUDA device that stays exactly as it was.  Without CUDA the platform's own KV
budget is used: on vLLM's CPU platform that is ``VLLM_CPU_KVCACHE_SPACE``
(``CpuPlatform.get_device_total_memory``); other platforms are asked through
``torch.<device_type>.mem_get_info``.  No number is ever invented.
"""

from __future__ import annotations

import logging

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
