"""T3 on speculators 0.8/0.9: the unified trainer (``speculators train``) on a machine without an
accelerator.  0.9.0 keeps the local rank in ``train/distributed.py`` and times every logged
step with ``torch.accelerator.synchronize()``; on a CUDA build of torch without a GPU both
start CUDA.  With an accelerator (or under torchrun) both patches pass straight through.
0.8.1 has the same code (``train/distributed.py`` identical; ``train/trainer.py`` L58/L68
``_StepTimer``, L192 ``get_local_rank()``, L340 ``model.to(self.local_rank)``)."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.accelerator_view import TorchAcceleratorView
from ...shims.device import accelerator_available
from ...shims.training_views import CpuRank
from .. import _guards as guard

log = logging.getLogger("spec_compat")

#: the speculators releases these were measured on (0.8.1, 0.9.0: train/distributed.py, train/trainer.py)
SPEC_09 = ">=0.8,<0.10"
TRAINER_09 = "speculators.train.trainer"
#: stock ``speculators train`` on data generated through vLLM, with the patch off
SPEC09_TRAINING = "tests/server/test_speculators_pipeline.py::test_stock_training_fails_without_the_patch"


@register
class TrainLocalRankWithoutAccelerator(Patch):
    """speculators 0.9.0 ``train/trainer.py:348`` ``self.model.to(self.local_rank)`` with
    ``local_rank = get_local_rank()`` (an int: CUDA device 0) and batches ``.to(local_rank)``:
    without a GPU the first ``.to`` raises 'Found no NVIDIA driver'.  Outside torchrun, without
    an accelerator, the trainer's local rank is 'cpu', which compares equal to rank 0."""

    id = "train-local-rank-without-accelerator"
    proof = Proof("fails", SPEC09_TRAINING, r"self\.model\.to\(self\.local_rank\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system", using="llama")
    fixes = ("T3",)
    summary = ("without an accelerator and outside torchrun, the trainer's get_local_rank() answers the device "
               "name 'cpu' that compares equal to the rank number; otherwise unchanged")
    upstream = "speculators 0.9.0 train/distributed.py get_local_rank -> int, train/trainer.py:348 model.to(local_rank)"
    target = f"{TRAINER_09}:get_local_rank"
    requires = {"speculators": SPEC_09}

    def check(self, module: ModuleType) -> None:
        # the trainer's own bindings of train/distributed.py's getters (recovery.py keeps its own)
        guard.exact_params(guard.attr(module, "get_local_rank"), f"{TRAINER_09}.get_local_rank")
        guard.exact_params(guard.attr(module, "is_distributed"), f"{TRAINER_09}.is_distributed")
        if "self.local_rank = get_local_rank()" not in guard.source(guard.attr(module, "Trainer"), "Trainer"):
            raise TargetChanged("Trainer no longer takes its local rank from get_local_rank()")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def get_local_rank(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            rank = wrapped(*args, **kwargs)
            if module.is_distributed() or accelerator_available():
                return rank
            log.info("spec_compat: %s: no accelerator, training on cpu", TrainLocalRankWithoutAccelerator.id)
            return CpuRank(int(rank))

        changes.wrap(module, "get_local_rank", get_local_rank)


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
