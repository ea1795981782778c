"""Driver-side patches every speculators 0.3.x generator run needs on vLLM >= 0.11: the engine
it builds (scheduler, cache and KV-cache configs), its step loop, and its rows put back by request id.

They act on names that ``vllm_hidden_states_generator`` bound at import (see
:mod:`spec_compat.core.bindings`), so vLLM itself stays untouched for every other
caller in the process.  Worker-side patches live in :mod:`.worker`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core import bindings, switches
from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from .generator_target import GENERATOR
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


@register
class KvCacheMemoryFromPlatform(Patch):
    """speculators 0.3.0 (generator:133) sizes the KV cache with
    ``torch.cuda.mem_get_info()``: without CUDA it raises (CPU engines, other
    accelerators).  With CUDA nothing changes."""

    id = "kv-cache-memory-from-platform"
    proof = Proof("fails", SELFTEST, r"free_memory, _ = torch\.cuda\.mem_get_info\(\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system", using="llama short")
    summary = "KV cache sized from the platform's budget when CUDA is absent (CUDA unchanged)"
    upstream = "speculators 0.3.0 generator:133 torch.cuda.mem_get_info(): no CUDA -> RuntimeError"
    fixes = ("F2",)
    target = f"{GENERATOR}:torch"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11"}

    def check(self, module: ModuleType) -> None:
        torch = getattr(module, "torch")
        if not isinstance(torch, ModuleType) or not hasattr(getattr(torch, "cuda", None), "mem_get_info"):
            raise TargetChanged(f"{GENERATOR}.torch is not the torch module with cuda.mem_get_info")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.memory import TorchView

        changes.setattr(module, "torch", TorchView(module.torch, self.id))


@register
class KvCacheConfigSignature(Patch):
    """vLLM 0.12 (v1/core/kv_cache_utils.py) removed the ``kv_cache_specs``
    parameter of ``get_kv_cache_config_from_groups``; generator:136 passes it."""

    id = "kv-cache-config-signature"
    proof = Proof("fails", SELFTEST, r"TypeError: get_kv_cache_config_from_groups\(\) got an unexpected keyword argument 'kv_cache_specs'", using="llama short")
    summary = "get_kv_cache_config_from_groups called without the removed kv_cache_specs"
    upstream = "vLLM 0.12.0 v1/core/kv_cache_utils.py: kv_cache_specs removed -> TypeError"
    fixes = ("F3",)
    target = f"{GENERATOR}:get_kv_cache_config_from_groups"
    requires = {"speculators": SPEC_03, "vllm": ">=0.12"}

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "get_kv_cache_config_from_groups")
        guard.has_params(fn, "get_kv_cache_config_from_groups", "vllm_config", "kv_cache_groups", "available_memory")
        guard.lacks_params(fn, "get_kv_cache_config_from_groups", "kv_cache_specs")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def adapt(kw: dict[str, Any]) -> dict[str, Any]:
            kw.pop("kv_cache_specs", None)
            return kw

        bindings.adapt_call(changes, module, "get_kv_cache_config_from_groups", adapt)


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


@register
class PrefixCachingOff(Patch):
    """vLLM 0.12 turns prefix caching on by default and needs a ``block_hasher`` on
    each Request (assertion in block_pool for prompts >= one block).  A cache hit
    skips computing the cached rows, so the capture silently loses them (58 -> 20)."""

    id = "prefix-caching-off"
    proof = Proof("fails", SELFTEST, r"assert len\(request\.block_hashes\) >= num_full_blocks.*\n(?:  .*\n)*AssertionError\b", using="llama batch-43-shared-prefixes")
    summary = "CacheConfig(enable_prefix_caching=False): every prompt row is computed and captured"
    upstream = "vLLM 0.12.0 config/cache.py prefix caching on; Request lacks block_hasher -> assert / lost rows"
    fixes = ("F8",)
    target = f"{GENERATOR}:CacheConfig"
    requires = {"speculators": SPEC_03, "vllm": ">=0.12"}

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "CacheConfig"), "CacheConfig", "enable_prefix_caching", "block_size")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def adapt(kw: dict[str, Any]) -> dict[str, Any]:
            kw["enable_prefix_caching"] = False
            return kw

        bindings.adapt_call(changes, module, "CacheConfig", adapt)


def _rpc_method(args: tuple, kwargs: dict) -> Any:
    return args[0] if args else kwargs.get("method")


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
            method = _rpc_method(args, kwargs)
            # only speculators' own worker-extension RPCs (underscore names), never
            # vLLM's internal ones (execute_model, sample_tokens, ...)
            if kwargs.get("unique_reply_rank") is not None and isinstance(method, str) and method.startswith("_"):
                return [result]
            return result

        bindings.wrap_method(changes, module, "MultiprocExecutor", "collective_rpc", collective_rpc)


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
            method = _rpc_method(args, kwargs)
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
