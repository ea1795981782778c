"""Whether torch has a usable accelerator.

``torch.accelerator.current_accelerator()`` names 'cuda' for any CUDA build of torch, also on a
machine without a GPU; ``torch.accelerator.is_available()`` (torch >= 2.6) asks for a device.
"""

from __future__ import annotations


def accelerator_available() -> bool:
    import torch

    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "is_available"):
        return bool(acc.is_available())
    return bool(torch.cuda.is_available())
