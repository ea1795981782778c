"""Batch-shape adapters for speculators 0.4.x ``generate`` (G1, G2)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("spec_compat")


def _as_lists(token_ids: Any) -> list[list[int]]:
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    return [list(ids.tolist() if hasattr(ids, "tolist") else ids) for ids in token_ids]


def restore_input_order(results: Sequence[dict], token_ids: Any, max_len: int) -> list[dict]:
    """Undo text-sorted request-id order: result k belongs to input ``sorted(range(n), key=str)[k]``."""
    inputs = _as_lists(token_ids)
    n = len(inputs)
    if len(results) != n:
        raise RuntimeError(f"spec_compat[results-in-input-order]: {len(results)} results for {n} sequences")
    order = sorted(range(n), key=str)
    out: list[Any] = [None] * n
    for k, j in enumerate(order):
        out[j] = results[k]
    for j, res in enumerate(out):
        if res["input_ids"].tolist() != inputs[j][:max_len]:
            raise RuntimeError(
                f"spec_compat[results-in-input-order]: result for input {j} carries other input_ids; "
                "the generator's ordering changed"
            )
    return out


def split_to_fit(token_ids: Any, max_seqs: int, num_blocks: int | None, block_size: int,
                 max_len: int) -> list[list[list[int]]]:
    """Consecutive sub-batches with at most ``max_seqs`` sequences whose KV blocks
    (prompt + 1 sampled token each) fit ``num_blocks``."""
    seqs = _as_lists(token_ids)
    if not seqs:
        return [seqs]  # the generator's own empty-input error
    budget = num_blocks if num_blocks else math.inf
    batches: list[list[list[int]]] = []
    current: list[list[int]] = []
    used = 0
    for i, ids in enumerate(seqs):
        need = math.ceil((min(len(ids), max_len) + 1) / block_size)
        if need > budget:
            raise ValueError(
                f"spec_compat[generate-in-fitting-batches]: sequence {i} needs {need} KV blocks, the cache "
                f"has {budget}; raise the KV budget or shorten the sequence"
            )
        if current and (len(current) >= max_seqs or used + need > budget):
            batches.append(current)
            current, used = [], 0
        current.append(ids)
        used += need
    batches.append(current)
    if len(batches) > 1:
        log.info("spec_compat: %d sequences run as %d sub-calls (max_num_seqs=%s, KV blocks=%s)",
                 len(seqs), len(batches), max_seqs, num_blocks)
    return batches
