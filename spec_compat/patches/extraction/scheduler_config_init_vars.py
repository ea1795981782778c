"""Driver-side patch of the speculators 0.3.x generator on vLLM >= 0.12: the SchedulerConfig it
builds gets the ``is_encoder_decoder`` InitVar (F1).

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
class SchedulerConfigInitVars(Patch):
    """vLLM 0.12 (config/scheduler.py) made ``max_model_len`` and ``is_encoder_decoder``
    required InitVars of SchedulerConfig; speculators 0.3.0 (generator:194) passes
    neither ``is_encoder_decoder`` -> validation error at start-up."""

    id = "scheduler-config-init-vars"
    proof = Proof("fails", SELFTEST, r"ValidationError: 1 validation error for SchedulerConfig\nis_encoder_decoder\n  Field required", using="llama short")
    summary = "SchedulerConfig gets is_encoder_decoder=False (decoder-only extraction)"
    upstream = "vLLM 0.12.0 config/scheduler.py: required InitVar is_encoder_decoder; generator:194 -> TypeError"
    fixes = ("F1",)
    target = f"{GENERATOR}:SchedulerConfig"
    requires = {"speculators": SPEC_03, "vllm": ">=0.12"}

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "SchedulerConfig"), "SchedulerConfig", "is_encoder_decoder", "max_model_len")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def adapt(kw: dict[str, Any]) -> dict[str, Any]:
            kw.setdefault("is_encoder_decoder", False)
            return kw

        bindings.adapt_call(changes, module, "SchedulerConfig", adapt)
