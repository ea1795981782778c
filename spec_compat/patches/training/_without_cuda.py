"""T3: speculators' EAGLE-3 trainer on a machine without CUDA: device and local rank,
checkpoint resume, the FSDP path under torchrun (gloo), and the draft's compiled forward
and flex attention (``train-device-without-cuda``, ``checkpoint-load-without-cuda``,
``fsdp-without-cuda``, ``draft-eager-without-cuda``, ``draft-attention-without-flex-backward``).
With CUDA every one of these patches passes straight through.

Shared by the two draft-forward units: whether a call's tensor is on CUDA."""

from __future__ import annotations

from typing import Any


def on_cuda(tensor: Any) -> bool:
    return bool(getattr(tensor, "is_cuda", False))
