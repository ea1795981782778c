"""T3 (see :mod:`._without_cuda`): speculators' checkpoint resume on a machine without CUDA."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.naming import through
from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.device import accelerator_available
from ...shims.training_views import TorchLoadView
from .. import _guards as guard
from ._targets import CHECKPOINTER, SPEC_TRAIN


@register
class CheckpointLoadWithoutCuda(Patch):
    """speculators' SingleGPUCheckpointer resumes onto CUDA: 0.3.x hard-codes
    ``safe_open(device="cuda:0")`` / ``torch.load(map_location="cuda:0")`` ('todo: generalize'),
    0.4.x asks ``get_current_device()``, which answers from ``torch.accelerator`` and initialises
    CUDA on a CUDA build without a GPU.  Without CUDA both load to cpu (the Trainer then moves it)."""

    id = "checkpoint-load-without-cuda"
    proof = Proof("fails", "tests/engine/test_training.py::test_resume_without_cuda_needs_shim", r"in load_model_state_dict\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system")
    fixes = ("T3",)
    summary = "without CUDA, resuming from a checkpoint loads tensors to cpu instead of cuda:0"
    upstream = ("speculators 0.3.x train/checkpointer.py SingleGPUCheckpointer 'cuda:0' (todo: generalize); "
                "0.4.x get_current_device() -> CUDA init without a GPU")
    target = f"{CHECKPOINTER}:SingleGPUCheckpointer"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        src = guard.source(module.SingleGPUCheckpointer, "SingleGPUCheckpointer")
        if "get_current_device()" in src:
            if not callable(module.__dict__.get("get_current_device")):
                raise TargetChanged(f"{CHECKPOINTER}.get_current_device is not a function")
            return
        guard.has_params(guard.attr(module, "load_safetensors_state_dict"), "load_safetensors_state_dict", "path", "device")
        if not isinstance(module.__dict__.get("torch"), ModuleType):
            raise TargetChanged(f"{CHECKPOINTER}.torch is not the torch module")
        if '"cuda:0"' not in src:
            raise TargetChanged("SingleGPUCheckpointer neither hard-codes cuda:0 nor asks get_current_device()")

    def install(self, module: ModuleType, changes: Changes) -> None:
        torch = module.torch
        if "get_current_device()" in guard.source(module.SingleGPUCheckpointer, "SingleGPUCheckpointer"):
            def get_current_device(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> str:
                if args or kwargs or accelerator_available():  # arguments: upstream's own TypeError
                    return wrapped(*args, **kwargs)
                return "cpu"

            changes.wrap(module, "get_current_device", get_current_device)
            return

        def load_safetensors_state_dict(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            return _load_safetensors_state_dict(wrapped, *args, **kwargs)

        def _load_safetensors_state_dict(inner: Any, /, path: Any, device: str) -> Any:
            if str(device).startswith("cuda") and not torch.cuda.is_available():
                device = "cpu"
            with through(CheckpointLoadWithoutCuda.id, f"{CHECKPOINTER}.load_safetensors_state_dict"):
                return inner(path, device)

        changes.wrap(module, "load_safetensors_state_dict", load_safetensors_state_dict)
        changes.setattr(module, "torch", TorchLoadView(torch))
