"""Driver-side patches of the speculators 0.4.x generator: its KV-cache budget without an
accelerator, its results in input order, its calls split to fit the engine."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from .generator_target import GENERATOR, check_generate_params, generator_source
from ..ranges import SPEC_04


@register
class MemGetInfoFromPlatform(Patch):
    """speculators 0.4.x (utils/util.py mem_get_info) returns (0, 0) when torch sees
    no accelerator: the generator then sizes a zero-block KV cache (CPU engines).
    With an accelerator nothing changes."""

    id = "mem-get-info-from-platform"
    proof = Proof("fails", SELFTEST, r"free_memory, _ = mem_get_info\(\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system", using="llama short")
    summary = "KV cache budget from the vLLM platform when torch sees no accelerator (0.4.x; else unchanged)"
    upstream = "speculators 0.4.x utils/util.py mem_get_info -> (0, 0) without an accelerator -> no KV blocks"
    fixes = ("F2",)
    target = f"{GENERATOR}:mem_get_info"
    requires = {"speculators": SPEC_04}

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "mem_get_info")
        if not callable(fn):
            raise TargetChanged(f"{GENERATOR}.mem_get_info is not callable")
        # the replacement takes no arguments, as upstream's does: any other signature is drift
        guard.exact_params(fn, f"{GENERATOR}.mem_get_info")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.memory import platform_mem_get_info

        original = module.mem_get_info

        def mem_get_info() -> tuple[int, int]:
            import torch

            acc = torch.accelerator.current_accelerator()
            # a CUDA build of torch on a machine without a GPU still names "cuda"
            if acc is None or (acc.type == "cuda" and not torch.cuda.is_available()):
                return platform_mem_get_info(MemGetInfoFromPlatform.id)
            return original()

        changes.setattr(module, "mem_get_info", mem_get_info)


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
    target = f"{GENERATOR}:VllmHiddenStatesGenerator"
    requires = {"speculators": SPEC_04}

    def check(self, module: ModuleType) -> None:
        check_generate_params(module)
        if "sorted(request_id_to_idx" not in generator_source(module):
            raise TargetChanged("generate() no longer iterates sorted(request_id_to_idx)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.batching import restore_input_order

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
        from ...shims.batching import split_to_fit

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
