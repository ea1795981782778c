"""Driver-side patches: speculators' hidden-state generator on newer vLLM.

They act on names that ``vllm_hidden_states_generator`` bound at import (see
:mod:`spec_compat.core.bindings`), so vLLM itself stays untouched for every other
caller in the process.  Worker-side patches live in :mod:`.worker`.
"""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType
from typing import Any

from ..core import bindings, switches
from ..core.proof import Proof, SELFTEST
from ..core.registry import Changes, NotNeeded, Patch, TargetChanged, register
from . import _guards as g

log = logging.getLogger("spec_compat")
GEN = "speculators.data_generation.vllm_hidden_states_generator"
from .ranges import SPEC_03


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
    target = f"{GEN}:SchedulerConfig"
    requires = {"speculators": SPEC_03, "vllm": ">=0.12"}

    def check(self, module: ModuleType) -> None:
        g.has_params(g.attr(module, "SchedulerConfig"), "SchedulerConfig", "is_encoder_decoder", "max_model_len")

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
    proof = Proof("wrong-values", "tests/engine/test_shims_needed.py::test_async_scheduling_off_reaches_the_config", r"^ASYNC None$")
    summary = "SchedulerConfig(async_scheduling=False) for the generator's synchronous loop"
    upstream = "vLLM 0.14.0 config/vllm.py: async scheduling auto-enabled for the mp executor"
    fixes = ("O3",)
    target = f"{GEN}:SchedulerConfig"
    requires = {"speculators": SPEC_03, "vllm": ">=0.14"}

    def check(self, module: ModuleType) -> None:
        g.has_params(g.attr(module, "SchedulerConfig"), "SchedulerConfig", "async_scheduling")

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
    proof = Proof("fails", SELFTEST, r"FAIL engine-start: RuntimeError: Found no NVIDIA driver on your system", using="llama short")
    summary = "KV cache sized from the platform's budget when CUDA is absent (CUDA unchanged)"
    upstream = "speculators 0.3.0 generator:133 torch.cuda.mem_get_info(): no CUDA -> RuntimeError"
    fixes = ("F2",)
    target = f"{GEN}:torch"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11"}

    def check(self, module: ModuleType) -> None:
        torch = getattr(module, "torch")
        if not isinstance(torch, ModuleType) or not hasattr(getattr(torch, "cuda", None), "mem_get_info"):
            raise TargetChanged(f"{GEN}.torch is not the torch module with cuda.mem_get_info")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.memory import TorchView

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
    target = f"{GEN}:get_kv_cache_config_from_groups"
    requires = {"speculators": SPEC_03, "vllm": ">=0.12"}

    def check(self, module: ModuleType) -> None:
        fn = g.attr(module, "get_kv_cache_config_from_groups")
        g.has_params(fn, "get_kv_cache_config_from_groups", "vllm_config", "kv_cache_groups", "available_memory")
        g.lacks_params(fn, "get_kv_cache_config_from_groups", "kv_cache_specs")

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
    target = f"{GEN}:Scheduler"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11.1"}

    def check(self, module: ModuleType) -> None:
        g.has_params(g.attr(module, "Scheduler").__init__, "Scheduler.__init__", "block_size", "vllm_config")

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
    target = f"{GEN}:Scheduler"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11.1"}

    def check(self, module: ModuleType) -> None:
        g.has_params(g.attr(module, "Scheduler").finish_requests, "Scheduler.finish_requests",
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
    proof = Proof("fails", SELFTEST, r"assert len\(request\.block_hashes\) >= num_full_blocks", using="llama batch-43-shared-prefixes")
    summary = "CacheConfig(enable_prefix_caching=False): every prompt row is computed and captured"
    upstream = "vLLM 0.12.0 config/cache.py prefix caching on; Request lacks block_hasher -> assert / lost rows"
    fixes = ("F8",)
    target = f"{GEN}:CacheConfig"
    requires = {"speculators": SPEC_03, "vllm": ">=0.12"}

    def check(self, module: ModuleType) -> None:
        g.has_params(g.attr(module, "CacheConfig"), "CacheConfig", "enable_prefix_caching", "block_size")

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
    target = f"{GEN}:MultiprocExecutor"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11.1"}

    def check(self, module: ModuleType) -> None:
        g.has_params(g.attr(module, "MultiprocExecutor").collective_rpc, "MultiprocExecutor.collective_rpc",
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
    proof = Proof("fails", SELFTEST, r"State error: sample_tokens\(\) must be called after execute_model\(\) returns None", using="llama consecutive-calls")
    summary = "execute_model is followed by sample_tokens when it returns None"
    upstream = "vLLM 0.11.1 v1/worker/gpu_model_runner.py two-phase step -> 'State error' on step 2"
    fixes = ("F7",)
    target = f"{GEN}:MultiprocExecutor"
    requires = {"speculators": SPEC_03, "vllm": ">=0.11.1"}

    def check(self, module: ModuleType) -> None:
        ex = g.attr(module, "MultiprocExecutor")
        g.has_attrs(ex, "MultiprocExecutor", "execute_model", "sample_tokens")
        g.has_params(ex.sample_tokens, "MultiprocExecutor.sample_tokens", "grammar_output")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def execute_model(wrapped: Any, executor: Any, args: tuple, kwargs: dict) -> Any:
            out = wrapped(*args, **kwargs)
            if out is None:
                out = executor.sample_tokens(None)
            return out

        bindings.wrap_method(changes, module, "MultiprocExecutor", "execute_model", execute_model)


# request order per generator (keyed by its VllmConfig), filled as requests are added
_ORDER: dict[int, list[tuple[str, int]]] = {}
_OPEN: set[int] = set()


@register
class RowsByRequestId(Patch):
    """Driver half of F10: the per-request rows from the worker are put back in
    the order the requests were added, and every request's row count must equal
    its prompt length (upstream issue #279's silent class becomes an error)."""

    id = "rows-by-request-id"
    proof = Proof("fails", SELFTEST, r"AttributeError: 'str' object has no attribute 'clone'", using="llama short")
    summary = "captured rows reassembled by request id in input order, row counts checked"
    upstream = "speculators 0.3.0 generator:278-295 slices the capture in input order; engine order differs (F10)"
    fixes = ("F10",)
    target = f"{GEN}:MultiprocExecutor"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        g.has_attrs(g.attr(module, "MultiprocExecutor"), "MultiprocExecutor", "collective_rpc")
        g.has_attrs(g.attr(module, "Scheduler"), "Scheduler", "add_request")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.capture import RowCountError, find_payload

        def add_request(wrapped: Any, sched: Any, args: tuple, kwargs: dict) -> Any:
            req = args[0] if args else kwargs["request"]
            key = id(sched.vllm_config)
            if key not in _OPEN:
                _ORDER[key] = []
                _OPEN.add(key)
            _ORDER[key].append((req.request_id, int(req.num_prompt_tokens)))
            return wrapped(*args, **kwargs)

        def collective_rpc(wrapped: Any, executor: Any, args: tuple, kwargs: dict) -> Any:
            method = _rpc_method(args, kwargs)
            key = id(executor.vllm_config)
            if method == "_reset_capture":
                _OPEN.discard(key)
                spares = _spares_for(executor)  # also checks SPEC_COMPAT_SHM_POOL_MB before any work
                if spares:  # recycled segments for the worker's next call (capture-handoff-shm)
                    return wrapped("_spec_compat_reset_capture", args=(spares,))
            result = wrapped(*args, **kwargs)
            if method != "_get_captured_states":
                return result
            _OPEN.discard(key)
            order = _ORDER.pop(key, [])
            replies = result if isinstance(result, list) else [result]
            for i, reply in enumerate(replies):
                payload = find_payload(reply)
                if payload is not None:
                    layers = _assemble(payload, order, recycle=len(replies) == 1)
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


#: opt-in switch of patch driver-wait-yields-cpu: "spin" (default) or "sleep"


@register
class DriverWaitYieldsCpu(Patch):
    """vLLM's ``MessageQueue.acquire_read`` (distributed/device_communicators/shm_broadcast.py)
    spins on ``sched_yield`` while speculators' driver waits for each worker step.  On a CPU
    platform with other work on the machine the spinning driver takes CPU from the model's
    threads (extraction at about half speed); on an idle machine the spin is the faster wait.
    Opt-in: ``SPEC_COMPAT_DRIVER_WAIT=sleep`` makes the driver's reply queues poll, then sleep."""

    id = "driver-wait-yields-cpu"
    proof = Proof("optimization", "tests/engine/test_handoff_engine.py::test_driver_reply_queues_do_not_spin", benchmark="benchmarks/results/capture_overhead_llama_loaded.json")
    summary = ("opt-in (SPEC_COMPAT_DRIVER_WAIT=sleep), CPU platform: the driver's reply queues sleep "
               "(<= 1 ms) instead of spinning while the worker computes")
    upstream = "vLLM shm_broadcast.py SpinTimer: sched_yield busy-wait in acquire_read (driver of speculators' generator)"
    target = f"{GEN}:MultiprocExecutor"
    requires = {"vllm": ">=0.11,<0.17"}  # cells that proved it; newer vLLM: re-check the wait loop

    def check(self, module: ModuleType) -> None:
        import os

        import torch

        if torch.cuda.is_available():
            raise NotNeeded("CUDA platform: the driver's polling does not take the model's cores")
        g.has_attrs(g.attr(module, "MultiprocExecutor"), "MultiprocExecutor", "collective_rpc")
        from vllm.distributed.device_communicators import shm_broadcast

        timer = g.attr(shm_broadcast, "SpinTimer")
        g.has_attrs(timer, "SpinTimer", "spin", "record_activity")
        if "_read_spin_timer" not in g.source(shm_broadcast.MessageQueue.acquire_read, "MessageQueue.acquire_read"):
            raise TargetChanged("MessageQueue.acquire_read no longer polls through _read_spin_timer")
        mode = switches.value(switches.DRIVER_WAIT_VAR)
        if mode == "spin":
            raise NotNeeded(f"{switches.DRIVER_WAIT_VAR} is not 'sleep': vLLM's spin wait kept (faster on an idle "
                            "machine; set it to 'sleep' when other work shares the CPU)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.polling import YieldingTimer

        def init(wrapped: Any, executor: Any, args: tuple, kwargs: dict) -> Any:
            out = wrapped(*args, **kwargs)
            queues = reply_queues(executor)
            for mq in queues:
                mq._read_spin_timer = YieldingTimer()
            if not queues:
                log.warning("spec_compat[%s]: the executor has no reply queue with _read_spin_timer; "
                            "the driver keeps spinning", self.id)
            return out

        bindings.wrap_method(changes, module, "MultiprocExecutor", "__init__", init)


def reply_queues(executor: Any) -> list[Any]:
    """The driver's reply queues of a MultiprocExecutor: ``response_mqs`` (vLLM >= 0.12)
    or each worker handle's ``worker_response_mq`` (0.11)."""
    found: dict[int, Any] = {}
    candidates = list(getattr(executor, "response_mqs", None) or ())
    candidates += [getattr(w, "worker_response_mq", None) for w in getattr(executor, "workers", None) or ()]
    for mq in candidates:
        if mq is not None and hasattr(mq, "_read_spin_timer"):
            found[id(mq)] = mq
    return list(found.values())


def _spares_for(executor: Any) -> list[str]:
    """Pooled segments for a one-worker executor's next call (none with several workers: each
    name must reach exactly one writer)."""
    handoff = sys.modules.get("spec_compat.shims.handoff")
    if handoff is None:  # nothing was handed over yet in this process
        return []
    switches.value(switches.POOL_VAR)  # a malformed switch fails here, early
    if len(getattr(executor, "workers", None) or ()) != 1:
        return []
    return handoff.take_spares()


def _assemble(payload: Any, order: list[tuple[str, int]], recycle: bool = False) -> list[Any]:
    """Per-request rows from the worker in input order: tensors (pickled reply) or a
    shared-memory descriptor (patch capture-handoff-shm): a layer whose rows lie in input order
    is a view of its mapped segment, the others are read straight into the output.  ``recycle``
    (one worker): segments read go to the pool (``SPEC_COMPAT_SHM_POOL_MB``) for the next call."""
    from ..shims.capture import assemble_in_order

    if type(payload).__name__ == "HandoffDescriptor":
        from ..shims.handoff import discard, materialize

        try:
            cap = switches.value(switches.POOL_VAR) if recycle else 0
        except ValueError:
            discard(payload)  # the segments are unlinked, not left in /dev/shm
            raise
        return materialize(payload, order, recycle_bytes=cap)
    return assemble_in_order(payload, order)


def _generator_source(module: ModuleType) -> str:
    return g.source(g.attr(module, "VllmHiddenStatesGenerator"), "VllmHiddenStatesGenerator")


def _tokenizer_path_is_trusted(class_source: str) -> str:
    """The parameter of the generator's ``__init__`` that its one bare
    ``AutoTokenizer.from_pretrained(p)`` loads, after checking on the syntax tree that the very
    same ``p`` (never re-assigned in ``__init__``) is loaded by ``AutoConfig.from_pretrained(p,
    trust_remote_code=True)`` there and handed as ``model=`` (and ``tokenizer=``, if given) to a
    ``ModelConfig(..., trust_remote_code=True)`` - in ``__init__`` itself or in a method that
    ``__init__`` calls only with ``p`` for that parameter (and that does not re-assign it).
    Anything else raises TargetChanged."""
    import ast
    import textwrap

    def changed(why: str) -> str:
        return f"the generator no longer loads the tokenizer bare from the path it trusts for AutoConfig and " \
               f"ModelConfig: {why}"

    try:
        tree = ast.parse(textwrap.dedent(class_source))
    except SyntaxError as exc:
        raise TargetChanged(changed(f"its source does not parse ({exc})")) from None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    methods = {n.name: n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef)}
    init = methods.get("__init__")
    if init is None:
        raise TargetChanged(changed("no __init__"))

    def calls(fn: ast.AST, dotted: str) -> list[ast.Call]:
        return [c for c in ast.walk(fn) if isinstance(c, ast.Call) and ast.unparse(c.func) == dotted]

    def trusts(call: ast.Call) -> bool:
        return any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in call.keywords)

    def name_of(node: ast.AST | None) -> str | None:
        return node.id if isinstance(node, ast.Name) else None

    def param_names(fn: ast.FunctionDef) -> list[str]:
        return [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]

    def rebound(fn: ast.FunctionDef, name: str) -> bool:
        """``name`` is assigned, deleted or declared global/nonlocal anywhere in ``fn``."""
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load):
                return True
            if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
                return True
        return False

    toks = calls(init, "AutoTokenizer.from_pretrained")
    if len(toks) != 1:
        raise TargetChanged(changed(f"__init__ calls AutoTokenizer.from_pretrained {len(toks)} times, "
                                    "expected once"))
    (tok,) = toks
    if any(k.arg in ("trust_remote_code", None) for k in tok.keywords) or any(
            isinstance(a, ast.Starred) for a in tok.args):
        raise TargetChanged(changed("the tokenizer call passes trust_remote_code (or **kwargs) itself"))
    path = name_of(tok.args[0]) if tok.args else None
    if path is None or path not in param_names(init) or path == "self":
        shown = ast.unparse(tok.args[0]) if tok.args else "(none)"
        raise TargetChanged(changed(f"the tokenizer path {shown} is not a parameter of __init__"))
    if rebound(init, path):
        raise TargetChanged(changed(f"{path} is re-assigned in __init__"))
    if not any(trusts(c) and c.args and name_of(c.args[0]) == path
               for c in calls(init, "AutoConfig.from_pretrained")):
        raise TargetChanged(changed(f"no AutoConfig.from_pretrained({path}, trust_remote_code=True) "
                                    "in __init__"))

    def hands_path(call: ast.Call, given: str) -> bool:
        """``ModelConfig(model=given, [tokenizer=given,] trust_remote_code=True)``."""
        kw = {k.arg: k.value for k in call.keywords}
        return (trusts(call) and name_of(kw.get("model")) == given
                and ("tokenizer" not in kw or name_of(kw["tokenizer"]) == given))

    def binds(c: ast.Call, fn: ast.FunctionDef, given: str) -> bool:
        """The call ``self.fn(...)`` passes ``path`` itself for ``fn``'s parameter ``given``."""
        if any(isinstance(a, ast.Starred) for a in c.args) or any(k.arg is None for k in c.keywords):
            return False
        positional = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)][1:]  # after self
        bound = dict(zip(positional, c.args))
        bound.update({k.arg: k.value for k in c.keywords})
        return name_of(bound.get(given)) == path

    for call in calls(init, "ModelConfig"):
        if hands_path(call, path):
            return path
    for name, fn in methods.items():
        handed = calls(init, f"self.{name}")
        if name == "__init__" or not handed:
            continue
        for call in calls(fn, "ModelConfig"):
            given = name_of({k.arg: k.value for k in call.keywords}.get("model"))
            if (given in param_names(fn)[1:] and not rebound(fn, given) and hands_path(call, given)
                    and all(binds(c, fn, given) for c in handed)):
                return path
    raise TargetChanged(changed(f"no ModelConfig(model={path}, trust_remote_code=True) of the same path"))


@register
class TokenizerTrustRemoteCode(Patch):
    """speculators (generator:84) loads the tokenizer without ``trust_remote_code``
    while it loads the same model's config and vLLM ModelConfig WITH it; Kimi-K2.5's
    tokenizer is remote code (tiktoken) -> ValueError before the engine starts."""

    id = "tokenizer-trust-remote-code"
    proof = Proof("fails", SELFTEST, r"ValueError: The repository \S+ contains custom code which must be executed to correctly load the model", using="kimi-k25 short")
    summary = ("tokenizer loaded with trust_remote_code=True, only because speculators already "
               "trusts the same model path for AutoConfig and ModelConfig")
    upstream = "speculators 0.3.0-0.4.x generator:84 AutoTokenizer.from_pretrained(path) -> remote-code tokenizer fails"
    fixes = ("K1",)
    target = f"{GEN}:AutoTokenizer"
    requires = {"speculators": ">=0.3,<0.5"}

    def check(self, module: ModuleType) -> None:
        _tokenizer_path_is_trusted(_generator_source(module))
        g.has_attrs(g.attr(module, "AutoTokenizer"), "AutoTokenizer", "from_pretrained")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import logging

        original = module.AutoTokenizer
        log = logging.getLogger("spec_compat")

        class AutoTokenizer:
            """speculators' AutoTokenizer: same trust as its config loading of the same path."""

            @staticmethod
            def from_pretrained(path: Any, *args: Any, **kwargs: Any) -> Any:
                if "trust_remote_code" not in kwargs:
                    log.info("spec_compat[%s]: tokenizer of %s loaded with trust_remote_code=True, as "
                             "speculators loads its config", TokenizerTrustRemoteCode.id, path)
                    kwargs["trust_remote_code"] = True
                return original.from_pretrained(path, *args, **kwargs)

            def __getattr__(self, name: str) -> Any:  # pragma: no cover - class-level use only
                return getattr(original, name)

        changes.setattr(module, "AutoTokenizer", AutoTokenizer)


from .ranges import SPEC_04


@register
class MemGetInfoFromPlatform(Patch):
    """speculators 0.4.x (utils/util.py mem_get_info) returns (0, 0) when torch sees
    no accelerator: the generator then sizes a zero-block KV cache (CPU engines).
    With an accelerator nothing changes."""

    id = "mem-get-info-from-platform"
    proof = Proof("fails", SELFTEST, r"FAIL engine-start: RuntimeError: Found no NVIDIA driver on your system", using="llama short")
    summary = "KV cache budget from the vLLM platform when torch sees no accelerator (0.4.x; else unchanged)"
    upstream = "speculators 0.4.x utils/util.py mem_get_info -> (0, 0) without an accelerator -> no KV blocks"
    fixes = ("F2",)
    target = f"{GEN}:mem_get_info"
    requires = {"speculators": SPEC_04}

    def check(self, module: ModuleType) -> None:
        fn = g.attr(module, "mem_get_info")
        if not callable(fn):
            raise TargetChanged(f"{GEN}.mem_get_info is not callable")
        # the replacement takes no arguments, as upstream's does: any other signature is drift
        g.exact_params(fn, f"{GEN}.mem_get_info")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.memory import platform_mem_get_info

        original = module.mem_get_info

        def mem_get_info() -> tuple[int, int]:
            import torch

            acc = torch.accelerator.current_accelerator()
            # a CUDA build of torch on a machine without a GPU still names "cuda"
            if acc is None or (acc.type == "cuda" and not torch.cuda.is_available()):
                return platform_mem_get_info(MemGetInfoFromPlatform.id)
            return original()

        changes.setattr(module, "mem_get_info", mem_get_info)


def _generate_params(module: ModuleType) -> None:
    g.has_params(g.attr(module, "VllmHiddenStatesGenerator").generate, "VllmHiddenStatesGenerator.generate",
                 "self", "token_ids")


@register
class ResultsInInputOrder(Patch):
    """speculators 0.4.x returns ``generate`` results in text-sorted request-id order
    (req_N_0, req_N_1, req_N_10, ...): from 11 sequences on, ``results[j]`` is not
    input j, and its stock script pairs loss masks by position - silently."""

    id = "results-in-input-order"
    proof = Proof("wrong-values", SELFTEST, r"RowCountError: spec_compat\[generator-input-checks\]: result \d+ carries \d+ input ids that are not input \d+'s", using="llama batch-43-shared-prefixes")
    summary = "generate() results put back in input order (text-sorted request ids undone), checked by input_ids"
    upstream = "speculators 0.4.0.1 generator:335 sorted(request_id_to_idx) -> results out of input order for >=11"
    fixes = ("G1",)
    target = f"{GEN}:VllmHiddenStatesGenerator"
    requires = {"speculators": SPEC_04}

    def check(self, module: ModuleType) -> None:
        _generate_params(module)
        if "sorted(request_id_to_idx" not in _generator_source(module):
            raise TargetChanged("generate() no longer iterates sorted(request_id_to_idx)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.batching import restore_input_order

        cls = module.VllmHiddenStatesGenerator
        inner = cls.generate

        def generate(self: Any, token_ids: Any) -> list[dict]:
            return restore_input_order(inner(self, token_ids), token_ids,
                                       self.vllm_config.model_config.max_model_len - 1)

        changes.setattr(cls, "generate", generate)


@register
class GenerateInFittingBatches(Patch):
    """speculators 0.4.x keeps every request of a call alive until its loop ends:
    more sequences than ``max_num_seqs`` (32) raise 'req_0_32 not found in captured
    states', and a call over the KV budget raises as well."""

    id = "generate-in-fitting-batches"
    proof = Proof("fails", SELFTEST, r"RuntimeError: Request req_0_32 not found in captured states", using="llama batch-43-shared-prefixes")
    summary = "generate() splits a call into sub-calls within max_num_seqs and the KV-cache budget"
    upstream = "speculators 0.4.0.1 generator:279 loop keeps all requests alive -> >32 sequences or over-budget raises"
    fixes = ("G2",)
    target = f"{GEN}:VllmHiddenStatesGenerator"
    requires = {"speculators": SPEC_04}

    def check(self, module: ModuleType) -> None:
        _generate_params(module)
        if "all_prefill_complete" not in _generator_source(module):
            raise TargetChanged("generate() no longer runs the all_prefill_complete loop")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.batching import split_to_fit

        cls = module.VllmHiddenStatesGenerator
        inner = cls.generate

        def generate(self: Any, token_ids: Any) -> list[dict]:
            cfg = self.vllm_config
            batches = split_to_fit(
                token_ids,
                max_seqs=cfg.scheduler_config.max_num_seqs,
                num_blocks=cfg.cache_config.num_gpu_blocks,
                block_size=cfg.cache_config.block_size,
                max_len=cfg.model_config.max_model_len - 1,
            )
            results: list[dict] = []
            for batch in batches:
                results.extend(inner(self, batch))
            return results

        changes.setattr(cls, "generate", generate)


@register
class GeneratorInputChecks(Patch):
    """speculators 0.3-0.4 (generator:228/251) passes token ids to the engine unchecked and cuts
    sequences over ``max_model_len - 1`` silently; rows lost on the way (upstream #279) go
    unnoticed, and NaN/inf states are returned (and saved) as they are (upstream checks them since
    #615).  Bad ids now raise before the engine, truncation is logged, rows are counted, non-finite
    values are counted per result and layer (``SPEC_COMPAT_NONFINITE``: raise, or warn)."""

    id = "generator-input-checks"
    proof = Proof("guard", "tests/engine/test_generator_inputs.py::test_lost_rows_raise_instead_of_passing_silently", r"FAIL chunked-8x2000: sequence \d+ layer \d+: (?:shape engine \[\d+, \d+\] != reference \[\d+, \d+\]|max\|diff\|=\S+ > tolerance)", also_off=("keep-unfinished-prefill", "capture-per-request", "rows-by-request-id"))
    summary = ("generate() inputs checked before the engine (empty, non-int, out-of-vocabulary ids), "
               "truncation logged with counts, every result's rows counted, NaN/inf captured values "
               "counted per result and layer: an error (SPEC_COMPAT_NONFINITE=warn: a warning with the counts)")
    upstream = ("speculators 0.3.0-0.4.x generator: ids[:max_len] truncates silently, bad ids reach vLLM; "
                "issue #279: lost rows go unnoticed; NaN/inf states saved silently (checked upstream since #615)")
    fixes = ("#279",)
    target = f"{GEN}:VllmHiddenStatesGenerator"
    requires = {"speculators": ">=0.3,<0.5"}

    def check(self, module: ModuleType) -> None:
        _generate_params(module)
        if "ids[:max_len]" not in _generator_source(module):
            raise TargetChanged("generate() no longer truncates with ids[:max_len]")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import os

        from ..shims.inputs import check_finite, check_inputs, check_results

        cls = module.VllmHiddenStatesGenerator
        inner = cls.generate
        pid = self.id

        def generate(self: Any, token_ids: Any) -> list[dict]:
            model_config = self.vllm_config.model_config
            try:
                vocab = int(model_config.get_vocab_size())
            except Exception:  # noqa: BLE001 - an unreadable vocabulary size only skips the range check
                vocab = None
            max_len = model_config.max_model_len - 1
            nonfinite = switches.value(switches.NONFINITE_VAR)  # a bad switch fails before the engine
            seqs, _ = check_inputs(token_ids, vocab, max_len, pid)
            results = inner(self, seqs)
            check_results(results, seqs, max_len, pid)
            check_finite(results, pid, nonfinite, getattr(self, "layer_ids", None))
            return results

        changes.setattr(cls, "generate", generate)


@register
class DriverTorchThreads(Patch):
    """speculators 0.3.0 (generator:283) clones every captured row in the driver with torch's
    intra-op pool on the cores vLLM's CPU worker computes on: on vLLM 0.16 (Llama fixture, 2 cores)
    those copies took ten times as long as alone; extraction ran at 0.84-0.89 of plain prefill."""

    id = "driver-torch-threads"
    proof = Proof("optimization", "tests/engine/test_handoff_engine.py::test_handoff_rows_equal_the_pickled_path", benchmark="benchmarks/results/capture_overhead_llama_driver_threads_4rounds.json")
    summary = ("CPU platform: generate() runs with SPEC_COMPAT_DRIVER_THREADS (default 1) torch threads "
               "in the driver; the caller's count is restored after each call")
    upstream = ("speculators 0.3.0 generator:283 per-sequence clone() in the driver, split over torch's "
                "threads on the cores vLLM's CPU worker computes on")
    target = f"{GEN}:VllmHiddenStatesGenerator"
    requires = {"speculators": SPEC_03, "vllm": ">=0.16,<0.17"}  # the cell that measured it (P2)

    def check(self, module: ModuleType) -> None:
        import os

        import torch


        _generate_params(module)
        if torch.cuda.is_available():
            raise NotNeeded("CUDA platform: the driver's copies do not share the model's CPU cores")
        if switches.value(switches.DRIVER_THREADS_VAR) is None:
            raise NotNeeded(f"{switches.DRIVER_THREADS_VAR}=keep: the driver keeps torch's thread count")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import os

        import torch

        from ..shims.threads import torch_threads

        n = switches.value(switches.DRIVER_THREADS_VAR)
        assert n is not None  # check() made 'keep' not-needed
        cls = module.VllmHiddenStatesGenerator
        inner = cls.generate

        def generate(self: Any, token_ids: Any) -> list[dict]:
            with torch_threads(torch, n):
                return inner(self, token_ids)

        changes.setattr(cls, "generate", generate)
