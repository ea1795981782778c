"""speculators 0.9's fused Triton losses under ``torch.compile`` on a GPU.

``losses/fused.py`` decorates ``loss_forward_kernel`` and ``loss_backward_kernel`` with one
``triton.autotune`` object, so both tuners hold the same ``configs`` and ``keys`` lists; the
trainer compiles ``Eagle3DraftModel.forward`` whenever CUDA is present, and Dynamo (torch 2.11.0,
triton 3.6.0, one H200) fails the first training step: "ListVariable(length=21) is already
tracked for mutation".  The backward tuner gets its own copies.
"""

from __future__ import annotations

from types import ModuleType

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, register
from ...shims.autotune import own_copy, shared_containers
from .. import _guards as guard


@register
class FusedLossOwnAutotuneLists(Patch):
    """speculators 0.9.0 training on a GPU with its default ``--loss-implementation fused``:
    ``losses/fused.py:128`` decorates the forward and backward Triton kernels with one ``triton.autotune``
    object (``_autotune_tile``: shared ``configs`` / ``keys`` lists), and the trainer compiles the draft
    forward whenever CUDA is present - loud: Dynamo ``AssertionError: ListVariable(length=21) is already
    tracked for mutation`` at the first step (torch 2.11.0, triton 3.6.0, one H200)."""

    id = "fused-loss-own-autotune-lists"
    proof = Proof("hardware", "tests/gpu/test_fused_loss.py::test_compiled_fused_loss_fails_without_the_patch",
                  r"ListVariable\(length=\d+\) is already tracked for mutation")
    summary = ("the fused loss's backward Triton autotuner gets its own configs/keys lists (shared with the "
               "forward one by a single triton.autotune decorator, which Dynamo refuses to trace)")
    upstream = ("speculators 0.9.0 losses/fused.py:128 shares one triton.autotune object between "
                "loss_forward_kernel and loss_backward_kernel -> torch.compile (CUDA): Dynamo "
                "'ListVariable ... is already tracked for mutation' at the first step")
    target = "speculators.losses.fused:loss_backward_kernel"
    requires = {"speculators": ">=0.9,<0.10"}

    def check(self, module: ModuleType) -> None:
        forward = guard.attr(module, "loss_forward_kernel")
        backward = guard.attr(module, "loss_backward_kernel")
        for name, tuner in (("loss_forward_kernel", forward), ("loss_backward_kernel", backward)):
            guard.has_attrs(tuner, name, "configs", "keys", "fn")
        if not shared_containers(forward, backward):
            raise NotNeeded("loss_forward_kernel and loss_backward_kernel no longer share a configs/keys list")

    def install(self, module: ModuleType, changes: Changes) -> None:
        forward, backward = module.loss_forward_kernel, module.loss_backward_kernel
        for name in shared_containers(forward, backward):
            changes.setattr(backward, name, own_copy(getattr(backward, name)))
