"""``torch`` as a module sees it when its ``torch.accelerator.synchronize()`` must not start CUDA.

A CUDA build of torch names 'cuda' as the current accelerator also on a machine without a GPU,
and ``torch.accelerator.synchronize()`` then initialises CUDA and raises 'Found no NVIDIA
driver'.  Without a usable accelerator there is nothing to wait for: the view's
``accelerator.synchronize`` returns at once; everything else is torch's own.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .device import accelerator_available


class _AcceleratorView:
    def __init__(self, accelerator: Any) -> None:
        self._accelerator = accelerator

    def synchronize(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs or accelerator_available():  # a device argument: torch's own answer
            return self._accelerator.synchronize(*args, **kwargs)
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._accelerator, name)


class TorchAcceleratorView:
    """``torch`` whose ``accelerator.synchronize()`` is a no-op without a usable accelerator."""

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch
        self.accelerator = _AcceleratorView(torch.accelerator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)
