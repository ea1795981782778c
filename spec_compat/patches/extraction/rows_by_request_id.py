"""Driver-side patch of the speculators 0.3.x generator: its captured rows put back by request id
in input order, row counts checked (driver half of F10; the worker half is capture-per-request).

It acts on a name that ``vllm_hidden_states_generator`` bound at import (see
:mod:`spec_compat.core.bindings`), so vLLM itself stays untouched for every other
caller in the process.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core import bindings, switches
from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ._generator_target import GENERATOR, rpc_method
from ..ranges import SPEC_03


@register
class RowsByRequestId(Patch):
    """Driver half of F10 (docs/failures.md): the per-request rows from the worker are
    put back in the order the requests were added, and every request's row count must
    equal its prompt length (speculators issue #279's silent class becomes an error)."""

    id = "rows-by-request-id"
    after = ("collective-rpc-single-reply",)
    proof = Proof("fails", SELFTEST, r"AttributeError: 'str' object has no attribute 'clone'", using="llama short")
    summary = "captured rows reassembled by request id in input order, row counts checked"
    upstream = "speculators 0.3.0 generator:278-295 slices the capture in input order; engine order differs (F10)"
    fixes = ("F10",)
    target = f"{GENERATOR}:MultiprocExecutor"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        guard.has_attrs(guard.attr(module, "MultiprocExecutor"), "MultiprocExecutor", "collective_rpc")
        guard.has_attrs(guard.attr(module, "Scheduler"), "Scheduler", "add_request")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims import handoff
        from ...shims.capture import RowCountError, find_payload

        def add_request(wrapped: Any, sched: Any, args: tuple, kwargs: dict) -> Any:
            req = args[0] if args else kwargs["request"]
            handoff.note_request(id(sched.vllm_config), req.request_id, int(req.num_prompt_tokens))
            return wrapped(*args, **kwargs)

        def pool_bytes() -> int:
            return switches.value(switches.POOL_VAR)

        def collective_rpc(wrapped: Any, executor: Any, args: tuple, kwargs: dict) -> Any:
            method = rpc_method(args, kwargs)
            key = id(executor.vllm_config)
            if method == "_reset_capture":
                handoff.stop_adding(key)
                if handoff.descriptor_arrived():  # else nothing was handed over yet in this process
                    pool_bytes()  # a malformed SPEC_COMPAT_SHM_POOL_MB fails here, before any work
                    spares = handoff.spares_for(executor)
                    if spares:  # recycled segments for the worker's next call (capture-handoff-shm)
                        return wrapped("_spec_compat_reset_capture", args=(spares,))
            result = wrapped(*args, **kwargs)
            if method != "_get_captured_states":
                return result
            order = handoff.take_input_order(key)
            replies = result if isinstance(result, list) else [result]
            for i, reply in enumerate(replies):
                payload = find_payload(reply)
                if payload is not None:
                    # one worker: segments read go to the pool (SPEC_COMPAT_SHM_POOL_MB) for the next call
                    layers = handoff.assemble(payload, order, pool_bytes if len(replies) == 1 else None)
                    if isinstance(result, list):
                        return [layers if j == i else r for j, r in enumerate(replies)]
                    return layers
            if any(r is not None for r in replies) and order:
                raise RowCountError(
                    "spec_compat[rows-by-request-id]: the worker returned rows without request ids "
                    "(is patch capture-per-request disabled?); refusing to slice them in input order"
                )
            return result

        bindings.wrap_method(changes, module, "Scheduler", "add_request", add_request)
        bindings.wrap_method(changes, module, "MultiprocExecutor", "collective_rpc", collective_rpc)
