"""Driver-side patch of the speculators 0.3.x generator on vLLM >= 0.11.1: its unique-reply RPCs
get the list of replies they index (F6).

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
from ._generator_target import GENERATOR, rpc_method
from ..ranges import SPEC_03


@register
class CollectiveRpcSingleReply(Patch):
    """vLLM 0.11.1 changed ``collective_rpc(..., unique_reply_rank=r)`` to return
    that rank's reply itself instead of a list; generator:271 indexes ``[0]`` and
    gets the first layer's tensor."""

    id = "collective-rpc-single-reply"
    proof = Proof("fails", SELFTEST, r"RuntimeError: Boolean value of Tensor with more than one value is ambiguous", using="llama short")
    summary = "speculators' unique-reply RPCs get the list-of-replies shape they index"
    upstream = "vLLM 0.11.1 v1/executor/multiproc_executor.py: unique_reply_rank returns one reply -> [0] is layer 0"
    fixes = ("F6",)
    target = f"{GENERATOR}:MultiprocExecutor"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11.1"}

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "MultiprocExecutor").collective_rpc, "MultiprocExecutor.collective_rpc",
                         "method", "unique_reply_rank")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def collective_rpc(wrapped: Any, executor: Any, args: tuple, kwargs: dict) -> Any:
            result = wrapped(*args, **kwargs)
            method = rpc_method(args, kwargs)
            # only speculators' own worker-extension RPCs (underscore names), never
            # vLLM's internal ones (execute_model, sample_tokens, ...)
            if kwargs.get("unique_reply_rank") is not None and isinstance(method, str) and method.startswith("_"):
                return [result]
            return result

        bindings.wrap_method(changes, module, "MultiprocExecutor", "collective_rpc", collective_rpc)
