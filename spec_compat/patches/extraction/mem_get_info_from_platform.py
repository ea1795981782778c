"""Driver-side patch of the speculators 0.4.x generator: its KV-cache budget without an accelerator
(F2; kv-cache-memory-from-platform does the same on 0.3.x)."""

from __future__ import annotations

from types import ModuleType

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ._generator_target import GENERATOR
from ..ranges import SPEC_04


@register
class MemGetInfoFromPlatform(Patch):
    """speculators 0.4.x (utils/util.py mem_get_info) returns (0, 0) when torch sees
    no accelerator: the generator then sizes a zero-block KV cache (CPU engines).
    With an accelerator nothing changes."""

    id = "mem-get-info-from-platform"
    proof = Proof("fails", SELFTEST, r"free_memory, _ = mem_get_info\(\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system", using="llama short")
    summary = "KV cache budget from the vLLM platform when torch sees no accelerator (0.4.x; else unchanged)"
    upstream = "speculators 0.4.x utils/util.py mem_get_info -> (0, 0) without an accelerator -> no KV blocks"
    fixes = ("F2",)
    target = f"{GENERATOR}:mem_get_info"
    requires = {"speculators": SPEC_04}

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "mem_get_info")
        if not callable(fn):
            raise TargetChanged(f"{GENERATOR}.mem_get_info is not callable")
        # the replacement takes no arguments, as upstream's does: any other signature is drift
        guard.exact_params(fn, f"{GENERATOR}.mem_get_info")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ._platform_memory import platform_mem_get_info

        original = module.mem_get_info

        def mem_get_info() -> tuple[int, int]:
            import torch

            acc = torch.accelerator.current_accelerator()
            # a CUDA build of torch on a machine without a GPU still names "cuda"
            if acc is None or (acc.type == "cuda" and not torch.cuda.is_available()):
                return platform_mem_get_info(MemGetInfoFromPlatform.id)
            return original()

        changes.setattr(module, "mem_get_info", mem_get_info)
