"""speculators 0.9's fused Triton losses under ``torch.compile`` on a GPU.

``losses/fused.py`` decorates ``loss_forward_kernel`` and ``loss_backward_kernel`` with one
``triton.autotune`` object, so both tuners hold the same ``configs`` and ``keys`` lists; the
trainer compiles ``Eagle3DraftModel.forward`` whenever CUDA is present, and Dynamo (torch 2.11.0,
triton 3.6.0, one H200) fails the first training step: "ListVariable(length=21) is already
tracked for mutation".  The backward tuner gets its own copies.

Two Triton ``Autotuner`` objects made by one ``triton.autotune(...)`` decorator share the
lists it was given (``configs``, ``keys``) and the ``Config`` objects in them.  Dynamo
(torch 2.11) refuses to trace two kernels reaching one mutable list from two sources
("ListVariable ... is already tracked for mutation").  :func:`shared_containers` names the
shared attributes, :func:`own_copy` makes the second tuner's copies.  Imports neither torch nor
triton.
"""

from __future__ import annotations

import copy
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, register
from .. import _guards as guard

#: mutable containers compared by identity (immutable values may be shared freely)
_CONTAINERS = (list, dict, set)


def shared_containers(first: Any, second: Any) -> list[str]:
    """Attribute names whose value is one and the same list, dict or set in both objects."""
    mine = vars(second)
    theirs = vars(first)
    return sorted(name for name, value in mine.items()
                  if isinstance(value, _CONTAINERS) and theirs.get(name) is value)


def own_copy(value: Any) -> Any:
    """A new container with copies of the items that are objects with attributes (a tuner's
    ``Config`` entries); plain values are kept."""
    def item(v: Any) -> Any:
        return copy.copy(v) if hasattr(v, "__dict__") or hasattr(v, "__slots__") else v

    if isinstance(value, list):
        return [item(v) for v in value]
    if isinstance(value, dict):
        return {k: item(v) for k, v in value.items()}
    return {item(v) for v in value}


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
