"""T3 (see :mod:`._without_cuda`): speculators 0.3.0's compiled draft forward runs eager on a machine
without CUDA."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from ...core.proof import Claim, Proof, MEASURED
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ..ranges import SPEC_03
from ._targets import CORE, DRAFT
from ._without_cuda import on_cuda


@register
class DraftEagerWithoutCuda(Patch):
    """speculators 0.3.0 core.py decorates ``Eagle3DraftModel.forward`` with ``@torch.compile``
    unconditionally (0.4.0 compiles only with CUDA): on CPU inductor compiles every new packed
    shape (demo Llama data, one 17-step epoch: 84.4 s compiled vs 40.8 s eager, 2.07x, median of 2
    interleaved rounds, benchmarks/results/draft_eager_cpu.json).  Calls whose tensors are not on
    CUDA run the uncompiled forward."""

    id = "draft-eager-without-cuda"
    proof = Proof("measured", MEASURED, benchmark="benchmarks/results/draft_eager_cpu.json", claims=(
        Claim("one epoch on CPU: compiled (patch off) / eager (patch on) seconds, median of 2 rounds",
              "seconds_per_epoch.compiled (patch off)", "seconds_per_epoch.eager (patch on)", value="2.07"),))
    fixes = ("T3",)
    summary = ("Eagle3DraftModel.forward runs uncompiled when its inputs are not on CUDA (as speculators "
               "0.4.0 does); CUDA calls keep the torch.compile'd forward")
    upstream = "speculators 0.3.0 models/eagle3/core.py @torch.compile forward (conditional since 0.4.0)"
    target = f"{CORE}:{DRAFT}"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        fwd = guard.attr(module, DRAFT).__dict__.get("forward")
        if getattr(fwd, "_torchdynamo_orig_callable", None) is None:
            raise TargetChanged(f"{DRAFT}.forward is not a torch.compile'd function "
                                "(with TORCHDYNAMO_DISABLE=1 torch.compile returns it unchanged)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        cls = getattr(module, DRAFT)
        compiled = cls.__dict__["forward"]
        eager = compiled._torchdynamo_orig_callable

        # plain function, not changes.wrap: the forward of a torch.compile'd model, which dynamo may trace
        @functools.wraps(eager)
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            first = kwargs.get("hidden_states", args[0] if args else None)
            return (compiled if on_cuda(first) else eager)(self, *args, **kwargs)

        changes.setattr(cls, "forward", forward)
