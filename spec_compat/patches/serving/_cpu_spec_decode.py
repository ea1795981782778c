"""Shared by the CPU speculative-decoding units of this group (``cpu-runner-speculative-config``,
``cpu-runner-loads-drafter``, ``cpu-draft-token-copy``, ``cpu-rejection-sampler``,
``cpu-eagle-padded-batch``): the CPU runner's module and the vLLM releases they fix, and the
machinery of the torch stand-ins for vLLM's speculative-decoding Triton kernels (the kernels
themselves are in ``cpu_rejection_sampler.py`` and ``cpu_eagle_padded_batch.py``).

vLLM launches these kernels as ``kernel[grid](*args, **kwargs)``; on a machine
without a GPU Triton is disabled and the launch raises.  Each stand-in has
the kernel's parameter names (the patch checks they still match) and writes the
same output buffers with plain tensor operations, one request at a time - the
batches a CPU engine runs are small, and clarity beats speed here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...core.registry import Changes, NotNeeded, Patch, TargetChanged
from ...shims.module_view import ModuleView
from .. import _guards as guard

CPU_RUNNER = "vllm.v1.worker.cpu_model_runner"
VLLM_CPU_SPEC = ">=0.15,<0.17"


def _require_cpu_platform() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise NotNeeded(f"platform is {current_platform.device_name!r}, not cpu: vLLM's own path is used")


class TorchKernel:
    """Launchable like a Triton kernel: ``k[grid](*args, **kwargs)`` calls ``fn``."""

    def __init__(self, fn: Callable[..., None], name: str) -> None:
        self.fn = fn
        self.__name__ = name
        self.__wrapped__ = fn
        self.arg_names = list(inspect.signature(fn).parameters)
        self.launches = 0

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches += 1
            self.fn(*args, **kwargs)

        return launch

    def __repr__(self) -> str:
        return f"<spec_compat TorchKernel {self.__name__}>"


def kernel_arg_names(kernel: Any) -> list[str] | None:
    """Parameter names of a Triton ``JITFunction`` or of the plain function vLLM
    leaves behind when Triton is disabled; None if neither can be read."""
    names = getattr(kernel, "arg_names", None)
    if names is not None:
        return list(names)
    fn = getattr(kernel, "fn", kernel)
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _next_power_of_2(n: int) -> int:
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def TritonHelpers(placeholder: Any) -> ModuleView:  # noqa: N802 - the view's name
    """Stands in for a module's ``triton`` name where Triton is disabled: vLLM's
    placeholder module lacks the host-side helper ``next_power_of_2`` that the
    launch sites call before launching; everything else is delegated."""
    return ModuleView(placeholder, next_power_of_2=_next_power_of_2)


def _spans(cu_num_tokens: Any) -> list[tuple[int, int]]:
    ends = [int(x) for x in cu_num_tokens.tolist()]
    starts = [0, *ends[:-1]]
    return list(zip(starts, ends))


class _TorchKernels(Patch):
    """Shared: swap module-level Triton kernels for torch stand-ins on CPU."""

    kernels: dict[str, Any]

    def _kernels(self) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    def check(self, module: ModuleType) -> None:
        _require_cpu_platform()
        for name, stand_in in self._kernels().items():
            names = kernel_arg_names(guard.attr(module, name))
            if names != stand_in.arg_names:
                raise TargetChanged(f"{module.__name__}.{name} takes {names}, the stand-in {stand_in.arg_names}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        for name, stand_in in self._kernels().items():
            changes.setattr(module, name, stand_in)
        triton = getattr(module, "triton", None)
        if triton is not None and not hasattr(triton, "next_power_of_2"):
            changes.setattr(module, "triton", TritonHelpers(triton))
