"""kimi-k25-device-without-cuda (K4): vLLM 0.15.x's Kimi-K2.5 model built without CUDA; with CUDA
the wrapped constructor passes straight through (see :mod:`._kimi_k25`)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.module_view import ModuleView
from ...shims.swap import swapped
from .. import _guards as guard
from ._kimi_k25 import CLS, KIMI, VLLM_015


def _TorchView(torch: ModuleType, device: Any) -> ModuleView:  # noqa: N802 - the view's name
    """``torch`` as kimi_k25.py sees it during one ``__init__`` call without CUDA: its
    ``torch.cuda.current_device()`` names the platform's device."""
    return ModuleView(torch, cuda=ModuleView(torch.cuda, current_device=lambda: device))


def _platform_device() -> Any:
    """What vLLM 0.16 uses there: ``current_platform.current_device()`` ("cpu" on the CPU platform)."""
    try:
        from vllm.platforms import current_platform

        device = current_platform.current_device()
    except Exception:
        device = None
    return device if device is not None else "cpu"


@register
class KimiK25DeviceWithoutCuda(Patch):
    """vLLM 0.15.x kimi_k25.py:323 sets ``self.device = torch.cuda.current_device()``
    in ``KimiK25ForConditionalGeneration.__init__``: without CUDA (CPU engine) model
    construction raises 'Found no NVIDIA driver'.  Only without CUDA, and only inside
    that call, kimi_k25's ``torch.cuda.current_device()`` names the platform device."""

    id = "kimi-k25-device-without-cuda"
    proof = Proof("fails", SELFTEST, r"self\.device = torch\.cuda\.current_device\(\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system", using="kimi-k25 short")
    fixes = ("K4",)
    summary = ("without CUDA, the Kimi-K2.5 model's constructor puts its vision tower and projector on the "
               "platform device (CPU) instead of torch.cuda.current_device(); with CUDA unchanged")
    upstream = "vLLM 0.15.x model_executor/models/kimi_k25.py:323 torch.cuda.current_device() -> no NVIDIA driver"
    target = f"{KIMI}:{CLS}"
    requires = {"vllm": VLLM_015}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, CLS)
        if "torch.cuda.current_device()" not in guard.source(cls.__init__, f"{CLS}.__init__"):
            raise TargetChanged(f"{CLS}.__init__ no longer calls torch.cuda.current_device()")
        torch = module.__dict__.get("torch")
        if not isinstance(torch, ModuleType) or not hasattr(getattr(torch, "cuda", None), "current_device"):
            raise TargetChanged(f"{KIMI}.torch is not the torch module with cuda.current_device")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def __init__(wrapped: Any, model: Any, args: tuple, kwargs: dict) -> None:
            real = module.__dict__.get("torch")
            if not isinstance(real, ModuleType) or real.cuda.is_available():
                return wrapped(*args, **kwargs)
            # kimi_k25.py's own global, for this call only
            with swapped(module, "torch", _TorchView(real, _platform_device())):
                return wrapped(*args, **kwargs)

        changes.wrap(getattr(module, CLS), "__init__", __init__)
