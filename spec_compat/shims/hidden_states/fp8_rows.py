"""Rows as float8_e4m3fn with one fp32 scale per token, computed where the rows are, with the bytes
hs-connectors 0.9.0's fp8 connector writes (its file format: ``hidden_states`` fp8 [T, L, H],
``hidden_states_scales`` fp32 [T, 1, 1]; scale = per-token amax / 448, clamped at 1e-12).

hs-connectors quantizes in its writer, on the host: bf16 rows cross PCIe and the CPU quantizes them.
Quantizing on the device first halves the bytes copied and takes the work off the writer thread
(``benchmarks/fp8_rows_gpu.py``). Running hs-connectors' own function on a CUDA tensor does not give
its bytes (measured on an H100: 0.095 % of the fp8 bytes and 16 % of the scales differ): it divides
the amax by a Python float, which CUDA computes as a multiplication by the reciprocal while the CPU
divides. Here both divisions are tensor by tensor, which CPU and CUDA round alike (IEEE division),
and the cast is c10's conversion on both.
"""

from __future__ import annotations

from typing import Any

#: the key hs-connectors 0.9.0 stores the per-token scales under
SCALES_KEY = "hidden_states_scales"


def quantize_rows(rows: Any) -> tuple[Any, Any]:
    """``(fp8 rows, fp32 scales [T, 1, ..])`` of ``rows`` [T, ...], on the rows' device."""
    import torch

    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        raise RuntimeError(f"spec_compat[ehs-connector-module]: torch {torch.__version__} has no float8_e4m3fn: "
                           "fp8 hidden states are unavailable")
    if not isinstance(rows, torch.Tensor) or rows.dim() < 2 or not rows.is_floating_point():
        got = f"{rows.dtype} {list(rows.shape)}" if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise ValueError(f"spec_compat[ehs-connector-module]: fp8 rows need a floating tensor [T, ...] of 2 or more "
                         f"dims, got {got}")
    x = rows.float()
    amax = x.abs().amax(dim=tuple(range(1, x.dim())), keepdim=True)
    scale = (amax / torch.full_like(amax, torch.finfo(fp8).max)).clamp(min=1e-12)
    return (x / scale).to(fp8), scale
