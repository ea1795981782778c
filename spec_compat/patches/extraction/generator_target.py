"""What the generator patches share: the module they act on, and guards that read it."""

from __future__ import annotations

from types import ModuleType

from .. import _guards as guard

#: speculators' hidden-states generator module: every generator patch targets a name bound in it
GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"


def generator_source(module: ModuleType) -> str:
    """The source of ``VllmHiddenStatesGenerator`` (a guard reads what ``generate`` does)."""
    return guard.source(guard.attr(module, "VllmHiddenStatesGenerator"), "VllmHiddenStatesGenerator")


def check_generate_params(module: ModuleType) -> None:
    guard.has_params(guard.attr(module, "VllmHiddenStatesGenerator").generate, "VllmHiddenStatesGenerator.generate",
                     "self", "token_ids")
