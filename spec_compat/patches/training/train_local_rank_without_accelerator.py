"""T3 on speculators 0.8/0.9 (see :mod:`._spec09`): the unified trainer's local rank on a machine
without an accelerator."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.device import accelerator_available
from ...shims.training_views import CpuRank
from .. import _guards as guard
from ._spec09 import SPEC09_TRAINING, SPEC_09, TRAINER_09

log = logging.getLogger("spec_compat")


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
