"""T3 (see :mod:`._without_cuda`): speculators' EAGLE-3 trainer's device and local rank on a machine
without CUDA."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ...core.proof import Proof, TRAINING
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.device import accelerator_available
from ...shims.training_views import CpuRank
from .. import _guards as guard
from ._targets import SPEC_TRAIN, UTILS

log = logging.getLogger("spec_compat")


@register
class TrainDeviceWithoutCuda(Patch):
    """speculators' train.py does ``device = torch.device(local_rank)`` and the Trainer moves
    model and batches with ``.to(local_rank)``: an int means CUDA, so without CUDA the first
    ``.to`` raises 'Found no NVIDIA driver'; under torchrun ``maybe_setup_distributed`` needs an
    accelerator.  Without one, the process trains on "cpu" (gloo process group under torchrun)."""

    id = "train-device-without-cuda"
    proof = Proof("fails", TRAINING, r"d2t = torch\.from_numpy\(np\.load\(d2t_path\)\)\.to\(device\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system", using="llama")
    fixes = ("T3",)
    summary = ("without an accelerator, maybe_setup_distributed returns as local rank the device name 'cpu' "
               "that compares equal to the rank number, and under torchrun starts a gloo process group; "
               "with an accelerator, unchanged")
    upstream = "speculators 0.3.0-0.4.x train/utils.py maybe_setup_distributed + scripts/train.py torch.device(local_rank)"
    target = f"{UTILS}:maybe_setup_distributed"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        # the replacement takes no arguments, as upstream's does: any other signature is drift
        guard.exact_params(guard.attr(module, "maybe_setup_distributed"), f"{UTILS}.maybe_setup_distributed")
        for name in ("is_distributed", "local_rank", "world_size"):
            if name not in module.__dict__:
                raise TargetChanged(f"{UTILS} has no module-level {name}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def maybe_setup_distributed(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> tuple:
            if args or kwargs or accelerator_available():  # arguments: upstream's own TypeError
                return wrapped(*args, **kwargs)
            if not module.is_distributed:
                log.info("spec_compat: %s: no accelerator, training on cpu", TrainDeviceWithoutCuda.id)
                return CpuRank(0), 1, 0, False
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("gloo")
            rank = dist.get_rank()
            log.info("spec_compat: %s: no accelerator, gloo process group rank %d of %d on cpu",
                     TrainDeviceWithoutCuda.id, rank, module.world_size)
            return CpuRank(int(module.local_rank)), module.world_size, rank, True

        changes.wrap(module, "maybe_setup_distributed", maybe_setup_distributed)
