"""What the generator patches share: the module they act on, guards that read it, and what they
read of the calls they wrap (an RPC's method name, ``generate``'s token ids as lists)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .. import _guards as guard

#: speculators' hidden-states generator module: every generator patch targets a name bound in it
GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"


def generator_source(module: ModuleType) -> str:
    """The source of ``VllmHiddenStatesGenerator`` (a guard reads what ``generate`` does)."""
    return guard.source(guard.attr(module, "VllmHiddenStatesGenerator"), "VllmHiddenStatesGenerator")


def check_generate_params(module: ModuleType) -> None:
    guard.has_params(guard.attr(module, "VllmHiddenStatesGenerator").generate, "VllmHiddenStatesGenerator.generate",
                     "self", "token_ids")


def rpc_method(args: tuple, kwargs: dict) -> Any:
    """The method name of a ``MultiprocExecutor.collective_rpc`` call (collective-rpc-single-reply,
    rows-by-request-id)."""
    return args[0] if args else kwargs.get("method")


def as_lists(token_ids: Any) -> list[list[int]]:
    """``generate``'s token ids (a tensor, or a sequence of tensors or lists) as lists of ints
    (speculators 0.4.x: results-in-input-order, generate-in-fitting-batches)."""
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    return [list(ids.tolist() if hasattr(ids, "tolist") else ids) for ids in token_ids]
