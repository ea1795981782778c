"""Driver-side patch of the speculators 0.4.x generator: its calls split to fit the engine (G2)."""

from __future__ import annotations

import logging
import math
from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, TargetChanged, register
from ._generator_target import GENERATOR, as_lists, check_generate_params, generator_source
from ..ranges import SPEC_04

log = logging.getLogger("spec_compat")


@register
class GenerateInFittingBatches(Patch):
    """speculators 0.4.x keeps every request of a call alive until its loop ends:
    more sequences than ``max_num_seqs`` (32) raise 'req_0_32 not found in captured
    states', and a call over the KV budget raises as well."""

    id = "generate-in-fitting-batches"
    after = ("results-in-input-order",)
    proof = Proof("fails", SELFTEST, r"RuntimeError: Request req_0_32 not found in captured states", using="llama batch-43-shared-prefixes")
    summary = "generate() splits a call into sub-calls within max_num_seqs and the KV-cache budget"
    upstream = "speculators 0.4.0.1 generator:279 loop keeps all requests alive -> >32 sequences or over-budget raises"
    fixes = ("G2",)
    target = f"{GENERATOR}:VllmHiddenStatesGenerator"
    requires = {"speculators": SPEC_04}

    def check(self, module: ModuleType) -> None:
        check_generate_params(module)
        if "all_prefill_complete" not in generator_source(module):
            raise TargetChanged("generate() no longer runs the all_prefill_complete loop")

    def install(self, module: ModuleType, changes: Changes) -> None:
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


def split_to_fit(token_ids: Any, max_seqs: int, num_blocks: int | None, block_size: int,
                 max_len: int) -> list[list[list[int]]]:
    """Consecutive sub-batches with at most ``max_seqs`` sequences whose KV blocks
    (prompt + 1 sampled token each) fit ``num_blocks``."""
    seqs = as_lists(token_ids)
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
