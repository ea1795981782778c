"""Worker-side patches for vLLM 0.15.x's own Kimi-K2.5 model class
(``vllm/model_executor/models/kimi_k25.py``) where it cannot be built without
CUDA or without MLA.  vLLM 0.16 rewrote both places (``current_platform``
device, loading delegated to ``DeepseekV2ForCausalLM``): there they are not needed.

Both are no-ops where the stock code works: with CUDA, the device shim passes
straight through; with MLA (the fused projection exists) the loader passes every
weight to vLLM's own ``load_weights`` unchanged.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.swap import swapped
from .. import _guards as guard

KIMI = "vllm.model_executor.models.kimi_k25"
CLS = "KimiK25ForConditionalGeneration"
VLLM_015 = ">=0.15,<0.16"


class _CudaView:
    """``torch.cuda`` whose ``current_device()`` names the platform's device."""

    def __init__(self, cuda: Any, device: Any) -> None:
        self._cuda = cuda
        self._device = device

    def current_device(self) -> Any:
        return self._device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cuda, name)


class _TorchView:
    """``torch`` as kimi_k25.py sees it during one ``__init__`` call without CUDA."""

    def __init__(self, torch: ModuleType, device: Any) -> None:
        self._torch = torch
        self.cuda = _CudaView(torch.cuda, device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


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


# the renames of 0.15.x KimiK25ForConditionalGeneration.load_weights (kimi_k25.py:464-483)
# that matter for the attention's a-projections
_LM_PREFIX = ("language_model.model", "language_model")
_A_PROJ = (".q_a_proj", ".kv_a_proj_with_mqa")
_FUSED = ".fused_qkv_a_proj"


@register
class KimiK25LoadUnfusedQkvA(Patch):
    """vLLM 0.15.x kimi_k25.py:482-483/523 always maps q_a_proj/kv_a_proj_with_mqa onto
    ``fused_qkv_a_proj``, which only the MLA attention has: with VLLM_MLA_DISABLE=1
    (CPU) loading raises KeyError '...self_attn.fused_qkv_a_proj.weight'.  As
    deepseek_v2.py:1356 does, they load into the unfused modules when no fused one exists."""

    id = "kimi-k25-load-unfused-qkv-a"
    proof = Proof("fails", SELFTEST, r"KeyError: 'language_model\.layers\.\d+\.self_attn\.fused_qkv_a_proj\.weight'", using="kimi-k25 short")
    fixes = ("K5",)
    summary = ("q_a_proj / kv_a_proj_with_mqa weights load into the non-MLA attention's own modules "
               "when the model has no fused_qkv_a_proj (VLLM_MLA_DISABLE=1); otherwise vLLM's loader as is")
    upstream = ("vLLM 0.15.x model_executor/models/kimi_k25.py:482,523 fused_qkv_a_proj mapping without "
                "fallback -> KeyError with VLLM_MLA_DISABLE=1")
    target = f"{KIMI}:{CLS}"
    requires = {"vllm": VLLM_015}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, CLS)
        guard.has_params(cls.load_weights, f"{CLS}.load_weights", "self", "weights")
        src = guard.source(cls.load_weights, f"{CLS}.load_weights")
        needed = ['"language_model.model": "language_model"',
                  '(".fused_qkv_a_proj", ".q_a_proj", 0)',
                  '(".fused_qkv_a_proj", ".kv_a_proj_with_mqa", 1)']
        missing = [s for s in needed if s not in src]
        if missing:
            raise TargetChanged(f"{CLS}.load_weights no longer maps {'; '.join(missing)}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def load_weights(wrapped: Any, model: Any, args: tuple, kwargs: dict) -> Any:
            return load_unfused(wrapped, model, *args, **kwargs)

        def load_unfused(inner: Any, model: Any, /, weights: Any) -> Any:
            from vllm.model_executor.model_loader.weight_utils import default_weight_loader

            params = dict(model.named_parameters())

            def rest() -> Any:
                for item in weights:
                    name = item[0]
                    proj = next((p for p in _A_PROJ if p + "." in name), None)
                    if proj is not None:
                        mapped = name.replace(*_LM_PREFIX)
                        if mapped.replace(proj, _FUSED) not in params and mapped in params:
                            param = params[mapped]
                            kwargs = item[2] if len(item) > 2 else {}
                            getattr(param, "weight_loader", default_weight_loader)(param, item[1], **kwargs)
                            continue
                    yield item

            return inner(rest())

        changes.wrap(getattr(module, CLS), "load_weights", load_weights)
