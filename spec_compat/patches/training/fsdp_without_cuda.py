"""T3 (see :mod:`._without_cuda`): speculators' FSDP path under torchrun (gloo) on a machine without
CUDA."""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.swap import swapped
from ...shims.training_views import DistView
from .. import _guards as guard
from ._targets import SPEC_TRAIN, TRAINER


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@register
class FsdpWithoutCuda(Patch):
    """speculators' FSDP path (trainer.py ``setup_model``) materialises sharded layers with
    ``to_empty(device="cuda")`` and reduces metrics with ``ReduceOp.AVG``: under torchrun on a
    machine without CUDA (gloo) the first raises 'no NVIDIA driver', the second is not a gloo
    op.  Without CUDA the layers materialise on cpu and AVG is SUM / world size."""

    id = "fsdp-without-cuda"
    proof = Proof("fails", "tests/engine/test_training.py::test_torchrun_two_cpu_ranks_fsdp", r'm\.to_empty\(device=(?:"cuda"|acc_type)\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system')
    fixes = ("T3",)
    summary = ("torchrun without CUDA: FSDP layers materialise on cpu instead of the hard-coded 'cuda', and "
               "metric reduction with ReduceOp.AVG runs as SUM / world size on gloo; with CUDA unchanged")
    upstream = 'speculators 0.3.0-0.4.x train/trainer.py setup_model to_empty(device="cuda"), dist.reduce(op=AVG)'
    target = f"{TRAINER}:Trainer"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "Trainer")
        if 'to_empty(device="cuda")' not in guard.source(cls.setup_model, "Trainer.setup_model"):
            raise TargetChanged('Trainer.setup_model no longer calls to_empty(device="cuda")')
        if not isinstance(module.__dict__.get("dist"), ModuleType):
            raise TargetChanged(f"{TRAINER}.dist is not torch.distributed")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def setup_model(wrapped: Any, trainer: Any, args: tuple, kwargs: dict) -> Any:
            if not getattr(trainer, "is_distributed", False) or _cuda_available():
                return wrapped(*args, **kwargs)
            layers = list(getattr(trainer.model, "layers", []) or [])

            def on_cpu(m: Any) -> Any:
                inner = type(m).to_empty

                def to_empty(*a: Any, device: Any = None, **kw: Any) -> Any:
                    if device is not None and str(device).startswith("cuda"):
                        device = "cpu"
                    return inner(m, *a, device=device, **kw)

                return to_empty

            with contextlib.ExitStack() as stack:
                for m in layers:
                    stack.enter_context(swapped(m, "to_empty", on_cpu(m)))  # this instance, for this call only
                return wrapped(*args, **kwargs)

        changes.wrap(module.Trainer, "setup_model", setup_model)
        changes.setattr(module, "dist", DistView(module.dist))
