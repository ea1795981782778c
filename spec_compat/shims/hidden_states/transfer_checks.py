"""What a trainer reading hidden-state files with hs-connectors' plain ``file`` backend must refuse.

hs-connectors 0.9.0's fp8 connector writes ``hidden_states`` as float8_e4m3fn plus
``hidden_states_scales`` (one fp32 scale per token); only its ``fp8`` backend (``FP8Transfer``)
multiplies them back. Read through the ``file`` backend, the payload passes unchanged and
speculators' collate casts the fp8 values to bf16 without their scales: every row is wrong (off by
its token's scale) and nothing fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: hs-connectors 0.9.0's key for the per-token scales of an fp8 payload
SCALES_KEY = "hidden_states_scales"


def scaled_payload(sample: Any) -> str | None:
    """Why ``sample`` (a loaded tensor dict, or None) is an fp8 payload with scales, or None."""
    if not isinstance(sample, dict):
        return None
    hs = sample.get("hidden_states")
    dtype = str(getattr(hs, "dtype", ""))
    if SCALES_KEY in sample:
        return f"it holds {SCALES_KEY!r} (per-token scales) next to hidden_states {dtype}"
    if "float8" in dtype:
        return f"its hidden_states are {dtype}"
    return None


def refuse_scaled_payload(sample: Any, where: str, patch_id: str) -> Any:
    """``sample`` unchanged, or ValueError when it is an fp8 payload read as plain files."""
    why = scaled_payload(sample)
    if why is not None:
        raise ValueError(
            f"spec_compat[{patch_id}]: the hidden states at {where} were written by hs-connectors' fp8 connector "
            f"({why}); the trainer reads them with the 'file' backend, which would use the fp8 values without "
            "their scales. Read them with --hidden-states-backend fp8 (the backend the server was started with).")
    return sample


def reads_plainly(instance: Any, base: type, name: str) -> bool:
    """``instance`` reads with ``base``'s own ``name`` method: no subclass between them overrides it
    (hs-connectors' ``FP8Transfer`` overrides both reads and dequantizes; it is not checked)."""
    return not any(name in vars(k) for k in type(instance).__mro__ if k is not base and issubclass(k, base))


def cached_file(instance: Any, file_idx: Any) -> str:
    """The file ``FileTransfer.get_cached(file_idx)`` read."""
    return str(Path(getattr(instance, "hidden_states_path", ".")) / f"hs_{file_idx}.safetensors")


def generated_file(params: Any) -> str:
    """What ``FileTransfer.get_generated(params)`` read: the server's path, else its handle."""
    if isinstance(params, dict):
        return str(params.get("hidden_states_path") or params.get("handle") or params)
    return str(params)
