"""T3 on speculators 0.8/0.9 (see :mod:`._spec09`): the unified trainer's step timer on a machine
without an accelerator.

``torch`` as a module sees it when its ``torch.accelerator.synchronize()`` must not start CUDA.
A CUDA build of torch names 'cuda' as the current accelerator also on a machine without a GPU,
and ``torch.accelerator.synchronize()`` then initialises CUDA and raises 'Found no NVIDIA
driver'.  Without a usable accelerator there is nothing to wait for: the view's
``accelerator.synchronize`` returns at once; everything else is torch's own.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.device import accelerator_available
from ...shims.module_view import ModuleView
from .. import _guards as guard
from ._spec09 import SPEC09_TRAINING, SPEC_09, TRAINER_09


def TorchAcceleratorView(torch: ModuleType) -> ModuleView:  # noqa: N802 - the view's name
    """``torch`` whose ``accelerator.synchronize()`` is a no-op without a usable accelerator."""
    accelerator = torch.accelerator

    def synchronize(*args: Any, **kwargs: Any) -> None:
        if args or kwargs or accelerator_available():  # a device argument: torch's own answer
            return accelerator.synchronize(*args, **kwargs)
        return None

    return ModuleView(torch, accelerator=ModuleView(accelerator, synchronize=synchronize))


@register
class TrainStepTimerWithoutAccelerator(Patch):
    """speculators 0.9.0 ``train/trainer.py:80`` ``_StepTimer.mark`` (and ``now``) call
    ``torch.accelerator.synchronize()`` on every logged step (every step by default): on a CUDA
    build of torch without a GPU it raises 'Found no NVIDIA driver'.  The trainer's ``torch``
    becomes a view whose ``accelerator.synchronize()`` returns at once without an accelerator."""

    id = "train-step-timer-without-accelerator"
    proof = Proof("fails", SPEC09_TRAINING, r"torch\.accelerator\.synchronize\(\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system", using="llama")
    fixes = ("T3",)
    summary = "the trainer's step timer does not synchronize an accelerator that is not there"
    upstream = "speculators 0.9.0 train/trainer.py:80,92 _StepTimer.mark/now torch.accelerator.synchronize()"
    target = f"{TRAINER_09}:_StepTimer"
    requires = {"speculators": SPEC_09}

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "_StepTimer")
        for name in ("mark", "now"):
            fn = getattr(cls, name, None)
            if fn is None or "torch.accelerator.synchronize()" not in guard.source(fn, f"_StepTimer.{name}"):
                raise TargetChanged(f"_StepTimer.{name} no longer calls torch.accelerator.synchronize()")
        torch = module.__dict__.get("torch")
        if not isinstance(torch, ModuleType) or not hasattr(torch, "accelerator"):
            raise TargetChanged(f"{TRAINER_09}.torch is not the torch module with torch.accelerator")

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.setattr(module, "torch", TorchAcceleratorView(module.torch))
