"""device-name-without-accelerator (F2): speculators 0.4.x's data-generation metadata names the device
without asking a CUDA build of torch that has no GPU."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, register
from ...shims.device import accelerator_available
from .. import _guards as guard
from ..ranges import SPEC_04

CONFIG_GEN = "speculators.data_generation.config_generator"


@register
class DeviceNameWithoutAccelerator(Patch):
    """speculators 0.4.x writes its data_config.json metadata with ``get_device_name(0)``
    (config_generator.py ``_get_gpu_info`` -> utils/util.py), which trusts
    ``torch.accelerator.current_accelerator()``: a CUDA build of torch names 'cuda' even with
    no GPU, and ``torch.cuda.get_device_name`` raises 'no NVIDIA driver' after extraction."""

    id = "device-name-without-accelerator"
    proof = Proof("fails", "tests/engine/test_training.py::test_data_config_metadata_without_accelerator_needs_shim", r"in _get_gpu_info\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system")
    fixes = ("F2",)
    summary = ("the data-generation metadata names the device 'NO ACCELERATOR' (speculators' own value, "
               "recorded as 'CPU ONLY') when torch has no usable accelerator; with one unchanged")
    upstream = ("speculators 0.4.x data_generation/config_generator.py _get_gpu_info -> utils/util.py "
                "get_device_name(0) -> torch.cuda init error on a CUDA build without GPU")
    target = f"{CONFIG_GEN}:get_device_name"
    requires = {"speculators": SPEC_04}

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "get_device_name"), f"{CONFIG_GEN}.get_device_name", "idx")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def get_device_name(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> str:
            if not accelerator_available():
                return "NO ACCELERATOR"
            return wrapped(*args, **kwargs)

        changes.wrap(module, "get_device_name", get_device_name)
