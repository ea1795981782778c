"""Where the requested layers' states live inside a vLLM worker: one row per KV slot.

:class:`HiddenStatesStore` holds a tensor ``(num_blocks, block_size, L, H)`` indexed like the
target's KV cache: a token at KV slot ``s`` keeps its L states at ``flat[s]``.  Forward hooks on
the decoder layers (:func:`install_capture`) write each layer's column at the slots of the tokens
being computed; a finished prompt's rows are read back through its block ids
(:func:`.slots.gather_rows`).  Because rows sit where the token's KV sits, a prefix served from
vLLM's prefix cache, a prompt split over chunked-prefill steps and a batch in any order all
read back complete: the rows were written when those tokens were computed, in the same blocks.

Layer-id convention (:data:`.layer_ids.LAYER_ID_CONVENTION`): id i < N is the input of decoder
layer i, ``hidden + residual`` (a forward pre-hook); id N is the output of layer N-1 before the
final norm (a forward hook).  Hooks never replace ``forward``; they need eager execution (they
read the slot mapping of the current step at run time).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from .slots import gather_rows


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
