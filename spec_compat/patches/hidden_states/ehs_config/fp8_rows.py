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

The connector's device branch (:func:`device_fp8`): when its writer is hs-connectors 0.9.0's fp8
``_write_tensors`` (:func:`is_hs_connectors_fp8`) and the rows are on an accelerator, the rows are
quantized there, only the fp8 rows and scales are copied to pinned host memory, and the writer thread
saves them as that writer would (:func:`fp8_file_tensors`: its tensors, key order and no metadata)
through :func:`~spec_compat.shims.hidden_states.upstream_writer.save_and_release`.  The file's bytes are the host path's
(tests/unit/test_hidden_states_connector.py on the CPU, tests/gpu/test_fp8_rows_cuda.py on CUDA).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ....shims.hidden_states.files import hidden_states_tensors
from ....shims.hidden_states.upstream_writer import save_and_release
from ....shims.hidden_states.writer import host_tensors

#: the key hs-connectors 0.9.0 stores the per-token scales under
SCALES_KEY = "hidden_states_scales"
#: hs-connectors' fp8 writer (``FP8HiddenStatesConnector._write_tensors``: module, qualified name) and
#: the versions whose bytes :func:`quantize_rows` is known to give; any other writer keeps the host path
HS_CONNECTORS_FP8_WRITER = ("hs_connectors.fp8_hidden_states_connector", "FP8HiddenStatesConnector._write_tensors")
HS_CONNECTORS_FP8_VERSIONS = ("0.9.0",)


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


def is_hs_connectors_fp8(write: Any) -> bool:
    """Whether ``write`` (a connector's ``_write_tensors`` override) is hs-connectors' fp8 writer, of a
    version in :data:`HS_CONNECTORS_FP8_VERSIONS`."""
    if (getattr(write, "__module__", None), getattr(write, "__qualname__", None)) != HS_CONNECTORS_FP8_WRITER:
        return False
    try:
        return importlib.import_module("hs_connectors.version").version in HS_CONNECTORS_FP8_VERSIONS
    except (ImportError, AttributeError):
        return False


def fp8_file_tensors(tensors: Mapping[str, Any]) -> dict[str, Any]:
    """What hs-connectors' fp8 writer saves for ``tensors`` (``hidden_states``, ``token_ids``), in its
    key order: ``{**tensors, "hidden_states": fp8 rows, SCALES_KEY: scales}``, on the rows' device."""
    rows, scales = quantize_rows(tensors["hidden_states"])
    return {**tensors, "hidden_states": rows, SCALES_KEY: scales}


def device_fp8(rows: Any, token_ids: Any) -> tuple[dict[str, Any], None, Any, Any]:
    """The connector's device branch: the arguments after ``path`` of
    :meth:`~spec_compat.shims.hidden_states.writer.BackgroundWriter.submit`: ``(host tensors, None, ready,
    save_and_release)``.  The rows (checked as :func:`~spec_compat.shims.hidden_states.files.hidden_states_tensors`
    does) are quantized where they are, the fp8 rows and scales queued to pinned host memory (``ready``: the
    copies' CUDA event; None for CPU tensors, passed as they are); no metadata, and a plain save, as
    hs-connectors' writer does."""
    tensors, ready = host_tensors(fp8_file_tensors(hidden_states_tensors(rows, token_ids)))
    return tensors, None, ready, save_and_release
