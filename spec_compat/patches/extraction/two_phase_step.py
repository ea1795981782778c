"""Driver-side patch of the speculators 0.3.x generator on vLLM >= 0.11.1: its step loop calls
``sample_tokens`` after an ``execute_model`` that returns None (F7).

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
class TwoPhaseStep(Patch):
    """vLLM 0.11.1 split a step into ``execute_model`` (returns None) and
    ``sample_tokens``; without the second call the next step fails with
    'State error' (generator:261)."""

    id = "two-phase-step"
    proof = Proof("fails", SELFTEST, r"RuntimeError: State error: sample_tokens\(\) must be called after execute_model\(\) returns None", using="llama consecutive-calls")
    summary = "execute_model is followed by sample_tokens when it returns None"
    upstream = "vLLM 0.11.1 v1/worker/gpu_model_runner.py two-phase step -> 'State error' on step 2"
    fixes = ("F7",)
    target = f"{GENERATOR}:MultiprocExecutor"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11.1"}

    def check(self, module: ModuleType) -> None:
        ex = guard.attr(module, "MultiprocExecutor")
        guard.has_attrs(ex, "MultiprocExecutor", "execute_model", "sample_tokens")
        guard.has_params(ex.sample_tokens, "MultiprocExecutor.sample_tokens", "grammar_output")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def execute_model(wrapped: Any, executor: Any, args: tuple, kwargs: dict) -> Any:
            out = wrapped(*args, **kwargs)
            if out is None:
                out = executor.sample_tokens(None)
            return out

        bindings.wrap_method(changes, module, "MultiprocExecutor", "execute_model", execute_model)
