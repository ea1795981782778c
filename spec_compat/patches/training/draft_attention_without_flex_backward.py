"""T3 (see :mod:`._without_cuda`): the draft's attention where flex attention has no backward (CPU).

speculators trains its EAGLE-3 draft with ``flex_attention`` and a ``BlockMask``
(causal within each packed document, plus one diagonal per test-time-training
step).  Compiled flex attention has no CPU backward (torch 2.8/2.10: InductorError;
the eager, unfused one has).  This adapter computes the
same attention with ``scaled_dot_product_attention`` and a dense boolean mask
materialised from the ``BlockMask`` itself - its block structure (which key
blocks each query block may see, partial or full) and its ``mask_mod`` for the
partial blocks - so any mask speculators builds is reproduced, not re-derived.

Cost: a ``Q x KV`` boolean mask per call; meant for the short sequences a CPU
run uses.  On CUDA tensors callers keep flex attention.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from ...core.proof import Proof, TRAINING
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ..ranges import SPEC_03
from ._targets import ATTENTION
from ._without_cuda import on_cuda


def _block_map(num_blocks: Any, indices: Any, n_kv_blocks: int) -> Any:
    """[B, H, q_blocks, n_kv_blocks] bool: which key blocks each query block lists."""
    import torch

    b, h, qb, width = indices.shape
    valid = torch.arange(width, device=indices.device) < num_blocks.unsqueeze(-1)
    out = torch.zeros(b, h, qb, max(width, n_kv_blocks) + 1, dtype=torch.bool, device=indices.device)
    # invalid slots go to a spare column that is dropped afterwards
    idx = torch.where(valid, indices.long(), torch.full_like(indices.long(), out.shape[-1] - 1))
    out.scatter_(-1, idx, valid)
    return out[..., :n_kv_blocks]


def dense_mask(block_mask: Any, q_len: int, kv_len: int) -> Any:
    """The element-level mask a ``BlockMask`` stands for: ``[B|1, H|1, q_len, kv_len]`` bool."""
    import torch

    bq, bkv = block_mask.BLOCK_SIZE if isinstance(block_mask.BLOCK_SIZE, tuple) else (
        block_mask.BLOCK_SIZE, block_mask.BLOCK_SIZE)
    n_q_blocks = -(-q_len // bq)
    n_kv_blocks = -(-kv_len // bkv)
    partial = _block_map(block_mask.kv_num_blocks, block_mask.kv_indices, n_kv_blocks)[:, :, :n_q_blocks]
    if block_mask.full_kv_num_blocks is not None:
        full = _block_map(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, n_kv_blocks)[:, :, :n_q_blocks]
    else:
        full = torch.zeros_like(partial)

    def expand(blocks: Any) -> Any:
        return blocks.repeat_interleave(bq, dim=-2)[..., :q_len, :].repeat_interleave(bkv, dim=-1)[..., :kv_len]

    device = block_mask.kv_indices.device
    q_idx = torch.arange(q_len, device=device).view(q_len, 1)
    kv_idx = torch.arange(kv_len, device=device).view(1, kv_len)
    zero = torch.zeros((), dtype=torch.long, device=device)
    element = block_mask.mask_mod(zero, zero, q_idx, kv_idx)
    element = torch.as_tensor(element, dtype=torch.bool, device=device).expand(q_len, kv_len)
    return expand(full) | (expand(partial) & element)


def sdpa_with_block_mask(query: Any, key: Any, value: Any, block_mask: Any,
                         scale: float | None = None, enable_gqa: bool = False) -> Any:
    """``flex_attention(query, key, value, block_mask=..., scale=..., enable_gqa=...)``
    computed densely: [B, Hq, Q, D] in, [B, Hq, Q, Dv] out, differentiable."""
    import torch

    mask = dense_mask(block_mask, query.shape[-2], key.shape[-2])
    if enable_gqa and key.shape[1] != query.shape[1]:
        rep = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(rep, dim=1)
        value = value.repeat_interleave(rep, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


@register
class DraftAttentionWithoutFlexBackward(Patch):
    """speculators 0.3.x compiles the draft's forward everywhere; off CUDA, inductor fails on its
    flex attention (eagle3/attention.py, torch 2.10: ``InductorError: IndexError``).  Non-CUDA
    calls get the same masked attention via SDPA and a dense mask built from the BlockMask.
    Needed only with ``draft-eager-without-cuda`` off; 0.4.x compiles only with CUDA."""

    id = "draft-attention-without-flex-backward"
    proof = Proof("fails", TRAINING, r"torch\._inductor\.exc\.InductorError: IndexError: tuple index out of range", also_off=("draft-eager-without-cuda",), using="llama")
    fixes = ("T3",)
    summary = ("the draft's 'simple_flex_attention' computes non-CUDA calls with scaled_dot_product_attention "
               "and the BlockMask materialised densely (block structure + mask_mod); CUDA calls keep flex attention")
    upstream = "torch.compile'd flex_attention on CPU: InductorError (speculators 0.3.x eagle3/attention.py, compiled core.py)"
    target = f"{ATTENTION}:flex_attention_forward"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "flex_attention_forward")
        guard.has_params(fn, "flex_attention_forward", "module", "query", "key", "value", "attention_mask", "scaling")
        registry = getattr(module, "ALL_ATTENTION_FUNCTIONS", None)
        try:
            registered = registry["simple_flex_attention"] if registry is not None else None
        except KeyError:
            registered = None
        if registered is not fn:
            raise TargetChanged("'simple_flex_attention' is not registered as flex_attention_forward")

    def install(self, module: ModuleType, changes: Changes) -> None:
        inner = module.flex_attention_forward
        registry = module.ALL_ATTENTION_FUNCTIONS

        # plain function, not changes.wrap: dynamo traces it inside the torch.compile'd draft forward
        @functools.wraps(inner)
        def flex_attention_forward(module_: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                                   scaling: float | None = None, **kwargs: Any) -> Any:
            if on_cuda(query):
                return inner(module_, query, key, value, attention_mask, scaling=scaling, **kwargs)
            out = sdpa_with_block_mask(query.contiguous(), key.contiguous(), value.contiguous(), attention_mask,
                                       scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
            return out.transpose(1, 2).contiguous(), None

        changes.setattr(module, "flex_attention_forward", flex_attention_forward)
        changes.call(registry, "simple_flex_attention",
                     lambda: registry.register("simple_flex_attention", flex_attention_forward),
                     lambda: registry.register("simple_flex_attention", inner),
                     label=f"{ATTENTION}.ALL_ATTENTION_FUNCTIONS['simple_flex_attention']")
