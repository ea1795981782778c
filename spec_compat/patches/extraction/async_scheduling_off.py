"""Driver-side patch of the speculators 0.3.x generator on vLLM >= 0.14: the SchedulerConfig it
builds keeps async scheduling off for its synchronous step loop (O3).

It acts on a name that ``vllm_hidden_states_generator`` bound at import (see
:mod:`spec_compat.core.bindings`), so vLLM itself stays untouched for every other
caller in the process.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core import bindings
from ...core.proof import Proof
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ._generator_target import GENERATOR
from ..ranges import SPEC_03


@register
class AsyncSchedulingOff(Patch):
    """vLLM 0.14 turns async scheduling on by itself for the multiprocessing
    executor; speculators drives the executor synchronously, step by step."""

    id = "async-scheduling-off"
    # scheduler-config-init-vars adapts the same binding's keyword arguments: its adapter runs first
    after = ("scheduler-config-init-vars",)
    proof = Proof("wrong-values", "tests/engine/test_shims_needed.py::test_async_scheduling_off_reaches_the_config", r"(?m)^ASYNC None$")
    summary = "SchedulerConfig(async_scheduling=False) for the generator's synchronous loop"
    upstream = "vLLM 0.14.0 config/vllm.py: async scheduling auto-enabled for the mp executor"
    fixes = ("O3",)
    target = f"{GENERATOR}:SchedulerConfig"
    requires = {"speculators": SPEC_03, "vllm": ">=0.14"}

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "SchedulerConfig"), "SchedulerConfig", "async_scheduling")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def adapt(kw: dict[str, Any]) -> dict[str, Any]:
            kw.setdefault("async_scheduling", False)
            return kw

        bindings.adapt_call(changes, module, "SchedulerConfig", adapt)
