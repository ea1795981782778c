"""The rows behind ``extract_hidden_states`` on vLLM 0.15/0.16: hooks on the decoder stack.

vLLM 0.17 captures through a drafter model with a cache-only attention layer
(``model_executor/models/extract_hidden_states.py``); 0.15/0.16 have neither, and their aux
states cover ids 1..N-1 of Llama only.  After the KV cache exists, TP rank 0 gets a store shaped
like it (one row per KV slot) and hooks that write every requested id, 0..N, for every model.
Installed on ``GPUModelRunner.initialize_kv_cache_tensors``, which the CPU runner inherits: the CPU
engine runs the same method a GPU worker runs (store on the runner's device, eager execution).
The store's tensor joins the caches handed to the connector as a cache-only layer's
(:mod:`spec_compat.shims.hidden_states.cache_group`), as vLLM 0.17's hidden-states group does.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.hidden_states.contract import SETTINGS_KEY
from .. import _guards as guard
from . import VLLM_WITHOUT_EHS
from .config import SERVER_PROOF

log = logging.getLogger("spec_compat")


def _current_slots() -> Any:
    """The slot of each token of this step (any layer of the single KV-cache group), or None
    outside a scheduled step."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    mapping = get_forward_context().slot_mapping
    if isinstance(mapping, list):
        raise RuntimeError("spec_compat[ehs-capture]: micro-batched forward contexts are not supported")
    if not mapping:
        return None
    return next(iter(mapping.values()))


def _install(runner: Any, kv_cache_config: Any) -> Any:
    """The store of TP rank 0 (hooks installed, handed to the backport's connector), else None."""
    from vllm.config import CompilationMode
    from vllm.distributed import get_tensor_model_parallel_rank
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    from ...shims.decoder import find_decoder_stack
    from ...shims.hidden_states.store import HiddenStatesStore, install_capture

    settings = runner.vllm_config.kv_transfer_config.kv_connector_extra_config[SETTINGS_KEY]
    if get_tensor_model_parallel_rank() != 0:
        return None  # rank 0 captures and writes; every rank computes the same states
    mode = runner.vllm_config.compilation_config.mode
    if mode != CompilationMode.NONE:
        raise RuntimeError(f"spec_compat[ehs-capture]: the capture hooks need eager execution; compilation mode is {mode!r}")
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise RuntimeError(f"spec_compat[ehs-capture]: the target has {len(groups)} KV-cache groups; one is supported")
    stack = find_decoder_stack(runner.get_model(), "ehs-capture")
    n = settings["num_hidden_layers"]
    if len(stack.layers) != n:
        raise RuntimeError(f"spec_compat[ehs-capture]: the model's decoder stack has {len(stack.layers)} layers, its config says {n}")
    block_size = groups[0].kv_cache_spec.block_size
    check_room(kv_cache_config.num_blocks * block_size * len(settings["layer_ids"]) * settings["hidden_size"]
               * runner.model_config.dtype.itemsize, runner.device)
    store = HiddenStatesStore(settings["layer_ids"], settings["hidden_size"], kv_cache_config.num_blocks,
                              block_size, runner.model_config.dtype, runner.device)
    old = getattr(runner, "_spec_compat_ehs_hooks", ())
    for h in old:
        h.remove()
    runner._spec_compat_ehs_hooks = install_capture(stack.layers, store, _current_slots)
    if not has_kv_transfer_group():
        raise RuntimeError("spec_compat[ehs-capture]: no KV connector in this worker")
    connector = get_kv_transfer_group()
    if hasattr(connector, "attach_store"):  # the backport's connector; others read the cache layer
        connector.attach_store(store)
    log.info("spec_compat: extract_hidden_states: capturing ids %s; store %d blocks x %d tokens, %.1f MiB "
             "next to the KV cache", settings["layer_ids"], kv_cache_config.num_blocks, store.block_size,
             store.nbytes / 2**20)
    return store


def check_room(nbytes: int, device: Any) -> None:
    """On a CUDA device the store (one row of L x H per KV slot, e.g. 0.8x the MLA cache of
    Kimi-K2.5 with 4 ids) comes on top of a KV cache already sized to ``gpu_memory_utilization``:
    refuse with the sizes instead of a bare out-of-memory error.  Host memory is not checked."""
    if getattr(device, "type", None) != "cuda":
        return
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    if nbytes > free:
        raise RuntimeError(
            f"spec_compat[ehs-capture]: the hidden-states store needs {nbytes / 2**30:.2f} GiB on {device} (one row of "
            f"the requested layers per KV slot), {free / 2**30:.2f} GiB are free after the KV cache: lower "
            "--gpu-memory-utilization (or --num-gpu-blocks-override) to leave room for it")


def _initialize_kv_cache_tensors(wrapped: Any, runner: Any, args: tuple, kwargs: dict) -> Any:
    """The KV caches vLLM allocates, plus the store's tensor as a cache-only layer's cache (what
    ``initialize_kv_cache`` hands the connector next, as vLLM 0.17's hidden-states group)."""
    caches = wrapped(*args, **kwargs)
    kv = runner.vllm_config.kv_transfer_config
    if kv is not None and SETTINGS_KEY in (kv.kv_connector_extra_config or {}) and isinstance(caches, dict):
        import torch

        from ...shims.hidden_states.cache_group import LAYER_NAME, register_layer

        settings = kv.kv_connector_extra_config[SETTINGS_KEY]
        store = _install(runner, runner.kv_cache_config)  # the runner's own copy (guarded in check)
        # other TP ranks hold no rows (rank 0 writes): an empty cache of the same shape
        cache = store.cache if store is not None else torch.empty(
            (0, 1, len(settings["layer_ids"]), settings["hidden_size"]), dtype=runner.model_config.dtype)
        register_layer(runner.vllm_config, cache, settings["layer_ids"], settings["hidden_size"])
        caches = {**caches, LAYER_NAME: cache}
    return caches


@register
class ExtractHiddenStatesCapture(Patch):
    """The rows behind the ``extract_hidden_states`` method on vLLM 0.15/0.16 (no ``ExtractHiddenStatesModel``
    or cache-only layer: vLLM 0.17 ``models/extract_hidden_states.py``; no aux states for ids 0 and N or
    DeepSeek/Kimi): without it the connector has nothing to write - loud: ``no hidden-state store in this
    worker``."""

    id = "ehs-capture"
    proof = Proof("fails", SERVER_PROOF, r"RuntimeError: spec_compat\[ehs-capture\]: no hidden-state store in this worker")
    summary = ("extract_hidden_states rows: hooks on the decoder stack write ids 0..N (input of layer i; "
               "N = last layer's output before the norm) at each token's KV slot, TP rank 0")
    upstream = "vLLM <=0.16 has no extract_hidden_states model/proposer (0.17 models/extract_hidden_states.py)"
    # the base class: CPUModelRunner (vLLM 0.15/0.16) inherits initialize_kv_cache(_tensors) from it
    target = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
    requires = {"vllm": VLLM_WITHOUT_EHS}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "GPUModelRunner")
        guard.has_params(cls.initialize_kv_cache, "GPUModelRunner.initialize_kv_cache", "kv_cache_config")
        guard.has_attrs(cls, "GPUModelRunner", "get_model")
        guard.has_params(cls.initialize_kv_cache_tensors, "GPUModelRunner.initialize_kv_cache_tensors", "kv_cache_config")
        source = guard.source(cls.initialize_kv_cache, "GPUModelRunner.initialize_kv_cache")
        if "self.kv_cache_config = kv_cache_config" not in source:
            raise TargetChanged("GPUModelRunner.initialize_kv_cache no longer keeps self.kv_cache_config")
        if "self.initialize_kv_cache_tensors(" not in source or ".register_kv_caches(kv_caches)" not in source:
            raise TargetChanged("GPUModelRunner.initialize_kv_cache no longer hands the tensors of "
                                "initialize_kv_cache_tensors to the connector's register_kv_caches")

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.wrap(module.GPUModelRunner, "initialize_kv_cache_tensors", _initialize_kv_cache_tensors)
