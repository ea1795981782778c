"""Driver-side patch of the speculators 0.3.x generator on vLLM >= 0.11.1: the Scheduler it builds
gets the required ``block_size`` (F4).

It acts on a name that ``vllm_hidden_states_generator`` bound at import (see
:mod:`spec_compat.core.bindings`), so vLLM itself stays untouched for every other
caller in the process.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core import bindings
from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ._generator_target import GENERATOR
from ..ranges import SPEC_03


@register
class SchedulerBlockSize(Patch):
    """vLLM 0.11.1 added a required ``block_size`` to the v1 ``Scheduler``; the
    engine passes ``cache_config.block_size`` x DCP x PCP, read after config init."""

    id = "scheduler-block-size"
    proof = Proof("fails", SELFTEST, r"TypeError: Scheduler.__init__\(\) missing 1 required positional argument: 'block_size'", using="llama short")
    summary = "Scheduler gets block_size = cache block size x context-parallel sizes, as the engine does"
    upstream = "vLLM 0.11.1 v1/core/sched/scheduler.py: new required block_size; generator:148 -> TypeError"
    fixes = ("F4",)
    target = f"{GENERATOR}:Scheduler"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11.1"}

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "Scheduler").__init__, "Scheduler.__init__", "block_size", "vllm_config")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def adapt(kw: dict[str, Any]) -> dict[str, Any]:
            if "block_size" not in kw:
                cfg = kw["vllm_config"]
                pc = cfg.parallel_config
                kw["block_size"] = (
                    cfg.cache_config.block_size
                    * getattr(pc, "decode_context_parallel_size", 1)
                    * getattr(pc, "prefill_context_parallel_size", 1)
                )
            return kw

        bindings.adapt_call(changes, module, "Scheduler", adapt, kind="subclass")
