"""Driver-side patch of the speculators 0.3.x generator on vLLM >= 0.11.1: its per-step abort
spares requests whose (chunked) prefill is unfinished (F9).

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
class KeepUnfinishedPrefill(Patch):
    """speculators 0.3.0 (generator:263) aborts every scheduled request after one
    step.  With chunked prefill (default since vLLM 0.11.1) a long prompt's tail is
    never computed: 5x2000 tokens gave 192 rows for the last sequence, silently."""

    id = "keep-unfinished-prefill"
    proof = Proof("wrong-values", SELFTEST, r"RowCountError: spec_compat\[[\w-]+\]: row count != prompt length for req_\d+_\d+: \d+ != \d+", using="llama chunked-8x2000")
    summary = "the generator's per-step abort skips requests whose prefill is unfinished"
    upstream = "vLLM 0.11.1 chunked prefill default on; generator:263 aborts partial prefills -> truncated states"
    fixes = ("F9",)
    target = f"{GENERATOR}:Scheduler"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11.1"}

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "Scheduler").finish_requests, "Scheduler.finish_requests",
                         "request_ids", "finished_status")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def finish_requests(wrapped: Any, sched: Any, args: tuple, kwargs: dict) -> Any:
            call = dict(zip(("request_ids", "finished_status"), args), **kwargs)
            ids = call["request_ids"]
            ids = (ids,) if isinstance(ids, str) else list(ids)
            done = []
            for rid in ids:
                req = sched.requests.get(rid)
                if req is not None and req.num_computed_tokens < req.num_prompt_tokens:
                    continue  # its prefill continues in a later step
                done.append(rid)
            if not done:
                return None
            return wrapped(done, call["finished_status"])

        bindings.wrap_method(changes, module, "Scheduler", "finish_requests", finish_requests)
