"""The rows behind ``extract_hidden_states`` on vLLM 0.15/0.16: hooks on the decoder stack.

vLLM 0.17 captures through a drafter model with a cache-only attention layer
(``model_executor/models/extract_hidden_states.py``); 0.15/0.16 have neither, and their aux
states cover ids 1..N-1 of Llama only.  After the KV cache exists, TP rank 0 gets a store shaped
like it (one row per KV slot) and hooks that write every requested id, 0..N, for every model.
Installed on ``GPUModelRunner.initialize_kv_cache_tensors``, which the CPU runner inherits: the CPU
engine runs the same method a GPU worker runs (store on the runner's device, eager execution).
The store's tensor joins the caches handed to the connector as a cache-only layer's
(:mod:`spec_compat.shims.hidden_states.cache_group`), as vLLM 0.17's hidden-states group does.

The store - where the requested layers' states live inside a vLLM worker: one row per KV slot.
:class:`HiddenStatesStore` holds a tensor ``(num_blocks, block_size, L, H)`` indexed like the
target's KV cache: a token at KV slot ``s`` keeps its L states at ``flat[s]``.  Forward hooks on
the decoder layers (:func:`install_capture`) write each layer's column at the slots of the tokens
being computed; a finished prompt's rows are read back through its block ids (:func:`gather_rows`).
Because rows sit where the token's KV sits, a prefix served from vLLM's prefix cache, a prompt split
over chunked-prefill steps and a batch in any order all read back complete: the rows were written
when those tokens were computed, in the same blocks.

Layer-id convention (ehs-config's ``LAYER_ID_CONVENTION``): id i < N is the input of decoder
layer i, ``hidden + residual`` (a forward pre-hook); id N is the output of layer N-1 before the
final norm (a forward hook).  Hooks never replace ``forward``; they need eager execution (they
read the slot mapping of the current step at run time).

Where a request's rows lie in a block-paged cache (:func:`token_slots`, :func:`gather_rows`): token
position p of a request whose blocks are ``block_ids`` lies at flat slot
``block_ids[p // B] * B + p % B`` (B = block size).  The same slots come out when every block is
split into kernel blocks of size b = B / k with ids ``block_id * k + j``.  Torch is imported
inside :func:`gather_rows` only.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.hidden_states.contract import SETTINGS_KEY
from .. import _guards as guard
from . import VLLM_WITHOUT_EHS
from .ehs_config import SERVER_PROOF

log = logging.getLogger("spec_compat")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def blocks_needed(block_ids: Sequence[int], num_tokens: int, block_size: int) -> list[int]:
    """The first ``ceil(num_tokens / block_size)`` block ids, checked (ValueError otherwise)."""
    if not _is_int(block_size) or block_size < 1:
        raise ValueError(f"spec_compat[ehs-capture]: block_size must be a positive integer, got {block_size!r}")
    if not _is_int(num_tokens) or num_tokens < 0:
        raise ValueError(f"spec_compat[ehs-capture]: num_tokens must be a non-negative integer, got {num_tokens!r}")
    need = -(-num_tokens // block_size)
    if len(block_ids) < need:
        raise ValueError(
            f"spec_compat[ehs-capture]: {num_tokens} tokens need {need} blocks of {block_size} slots, "
            f"got {len(block_ids)} block ids {list(block_ids)!r}"
        )
    used = [int(b) for b in block_ids[:need]]
    if bad := [b for b in used if b < 0]:
        raise ValueError(f"spec_compat[ehs-capture]: negative block ids {bad} among the {need} blocks used")
    return used


def token_slots(block_ids: Sequence[int], num_tokens: int, block_size: int) -> list[int]:
    """Flat slot of each of the first ``num_tokens`` positions: ``block_ids[p // B] * B + p % B``."""
    used = blocks_needed(block_ids, num_tokens, block_size)
    return [used[p // block_size] * block_size + p % block_size for p in range(num_tokens)]


def gather_rows(cache: Any, block_ids: Sequence[int], num_tokens: int) -> Any:
    """A new contiguous ``(num_tokens, L, H)`` tensor (a copy, same dtype and device) of the
    rows of the first ``num_tokens`` positions from ``cache`` shaped ``(num_blocks, B, L, H)``;
    ``block_ids`` are in units of the cache's own block size ``B = cache.shape[1]``."""
    import torch

    if cache.dim() != 4:
        raise ValueError(
            f"spec_compat[ehs-capture]: cache must be shaped (num_blocks, block_size, layers, hidden), got {tuple(cache.shape)}"
        )
    num_blocks, block_size = int(cache.shape[0]), int(cache.shape[1])
    used = blocks_needed(block_ids, num_tokens, block_size)
    if bad := [b for b in used if b >= num_blocks]:
        raise ValueError(f"spec_compat[ehs-capture]: block ids {bad} out of range for a cache of {num_blocks} blocks")
    blocks = torch.tensor(used, dtype=torch.long, device=cache.device)
    # whole blocks with one index_select (a copy), then the first num_tokens rows: 4.1x faster
    # than indexing every position (benchmarks/store_put.py); the prefix of a contiguous tensor is
    # contiguous (it keeps at most block_size - 1 rows of the last block's storage)
    rows = cache.index_select(0, blocks).reshape(-1, *cache.shape[2:])
    return rows[:num_tokens]



#: returns the current step's slot per token (int tensor, -1 = padding), or None when the
#: forward is not a scheduled step (profiling, warm-up)
SlotSource = Callable[[], Any]


class HiddenStatesStore:
    """Rows of ``layer_ids`` (ascending) at each KV slot of a ``num_blocks`` x ``block_size`` cache."""

    def __init__(self, layer_ids: Sequence[int], hidden_size: int, num_blocks: int, block_size: int,
                 dtype: Any, device: Any) -> None:
        import torch

        self.layer_ids = tuple(int(i) for i in layer_ids)
        if list(self.layer_ids) != sorted(set(self.layer_ids)):
            raise ValueError(f"spec_compat[ehs-capture]: layer ids must be distinct and ascending, got {list(self.layer_ids)}")
        self.hidden_size = int(hidden_size)
        self.block_size = int(block_size)
        # empty, not zeros: a row is read only after the forward that computed its token wrote it,
        # and pages never written stay out of the process's resident memory
        self.cache = torch.empty((int(num_blocks), self.block_size, len(self.layer_ids), self.hidden_size),
                                 dtype=dtype, device=device)
        self._flat = self.cache.view(-1, len(self.layer_ids), self.hidden_size)
        # hidden + residual of the current layer, reused by every hook: a fresh [tokens, H] tensor
        # per hook costs its page faults on every step (CPU allocator), measured 2.3x the put
        self._sums: dict[tuple[Any, Any], Any] = {}

    @property
    def nbytes(self) -> int:
        return self.cache.numel() * self.cache.element_size()

    def put(self, column: int, states: Any, slots: Any, residual: Any = None) -> None:
        """Write ``states`` [n, H] (plus ``residual`` [n, H] when given; n >= the tokens
        computed) into ``column`` at ``slots``; slots < 0 (padding) are skipped."""
        n = min(int(states.shape[0]), int(slots.shape[0]))
        if states.shape[-1] != self.hidden_size:
            raise ValueError(f"spec_compat[ehs-capture]: layer {self.layer_ids[column]} gave width {states.shape[-1]}, "
                             f"expected {self.hidden_size}")
        import torch

        slots = slots[:n].to(device=self.cache.device, dtype=torch.long)
        rows = states[:n]
        if residual is not None:
            rows = torch.add(rows, residual[:n], out=self._sum_buffer(n, rows))
        if bool((slots < 0).any()):
            keep = slots >= 0
            slots, rows = slots[keep], rows[keep]
        # index_copy_ into the column's [slots, H] view: 1.25x faster than ``_flat[slots, column] =
        # rows`` (an index_put over two indices) at 2048 tokens, H 256 (benchmarks/store_put.py)
        self._flat.select(1, column).index_copy_(0, slots, rows.to(self.cache.dtype))

    def _sum_buffer(self, n: int, like: Any) -> Any:
        key = (like.dtype, like.device)
        buf = self._sums.get(key)
        if buf is None or buf.shape[0] < n:
            import torch

            buf = self._sums[key] = torch.empty((max(n, 2 * (0 if buf is None else buf.shape[0])), self.hidden_size),
                                                dtype=like.dtype, device=like.device)
        return buf[:n]

    def rows(self, block_ids: Sequence[int], num_tokens: int) -> Any:
        """A copy ``[num_tokens, L, H]`` of a prompt's rows, read through its block ids."""
        return gather_rows(self.cache, block_ids, num_tokens)


_SIGNATURES: dict[type, inspect.Signature] = {}


def _hidden_and_residual(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    sig = _SIGNATURES.get(type(layer))
    if sig is None:
        sig = _SIGNATURES[type(layer)] = inspect.signature(type(layer).forward)
    bound = sig.bind(layer, *args, **kwargs).arguments
    if bound.get("hidden_states") is None:
        raise RuntimeError(f"spec_compat[ehs-capture]: {type(layer).__name__} was called without hidden_states")
    return bound["hidden_states"], bound.get("residual")


def install_capture(layers: Sequence[Any], store: HiddenStatesStore, slots: SlotSource) -> list[Any]:
    """Hooks on ``layers`` (the whole decoder stack, N = ``len(layers)``) that write the store's
    layer ids at the current step's slots; returns the hook handles (``.remove()`` each)."""
    n = len(layers)
    bad = [i for i in store.layer_ids if not 0 <= i <= n]
    if bad:
        raise ValueError(f"spec_compat[ehs-capture]: layer ids {bad} are outside 0..{n} (the model has {n} decoder layers)")
    handles = []
    for column, i in enumerate(store.layer_ids):
        if i < n:
            def pre_hook(layer: Any, args: tuple, kwargs: dict, column: int = column) -> None:
                where = slots()
                if where is None:
                    return
                hidden, residual = _hidden_and_residual(layer, args, kwargs)
                store.put(column, hidden, where, residual)

            handles.append(layers[i].register_forward_pre_hook(pre_hook, with_kwargs=True))
        else:
            def hook(_layer: Any, _args: tuple, out: Any, column: int = column) -> None:
                where = slots()
                if where is None:
                    return
                if isinstance(out, tuple):
                    hidden, residual = out[0], (out[1] if len(out) > 1 else None)
                else:
                    hidden, residual = out, None
                store.put(column, hidden, where, residual)

            handles.append(layers[n - 1].register_forward_hook(hook))
    return handles



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
