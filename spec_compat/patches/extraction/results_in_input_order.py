"""Driver-side patch of the speculators 0.4.x generator: its results in input order (G1)."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, TargetChanged, register
from ._generator_target import GENERATOR, as_lists, check_generate_params, generator_source
from ..ranges import SPEC_04


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
        cls = module.VllmHiddenStatesGenerator
        inner = cls.generate

        def generate(self: Any, token_ids: Any) -> list[dict]:
            return restore_input_order(inner(self, token_ids), token_ids,
                                       self.vllm_config.model_config.max_model_len - 1)

        changes.setattr(cls, "generate", generate)


def restore_input_order(results: Sequence[dict], token_ids: Any, max_len: int) -> list[dict]:
    """Undo text-sorted request-id order: result k belongs to input ``sorted(range(n), key=str)[k]``."""
    inputs = as_lists(token_ids)
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
