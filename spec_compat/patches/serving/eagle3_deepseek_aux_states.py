"""EAGLE-3 for DeepSeek-V2/V3 targets before vLLM 0.18 (failure S1 in docs/failures.md), inside
vLLM's workers: the ``SupportsEagle3`` capability (aux hidden states out of the decoder loop) on the
DeepSeek model (shared with the Kimi-K2.5 wrapper's: ``_eagle3_aux_states.py``)."""

from __future__ import annotations

from types import ModuleType

from ...core.proof import Proof, SERVING
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ._eagle3_aux_states import VLLM_S1, _check_not_eagle3, _install_eagle3


@register
class Eagle3DeepseekAuxStates(Patch):
    """vLLM <0.18 ``model_executor/models/deepseek_v2.py``: DeepseekV2/V3ForCausalLM
    is not ``SupportsEagle3`` (no aux hidden states out of the decoder loop) ->
    "Model does not support EAGLE3 interface" at load (added upstream in 0.18)."""

    id = "eagle3-deepseek-aux-states"
    proof = Proof("fails", SERVING, r"RuntimeError: spec_compat\[cpu-runner-loads-drafter\]: DeepseekV3ForCausalLM does not collect EAGLE-3 aux hidden states \(no SupportsEagle3\)", using="deepseek-v3")
    summary = "DeepseekV2ForCausalLM (and V3) returns EAGLE-3 aux hidden states: inputs of the chosen layers"
    upstream = "vLLM <0.18 model_executor/models/deepseek_v2.py: no SupportsEagle3 (S1)"
    fixes = ("S1",)
    target = "vllm.model_executor.models.deepseek_v2:DeepseekV2ForCausalLM"
    requires = {"vllm": VLLM_S1}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "DeepseekV2ForCausalLM")
        _check_not_eagle3(cls, "DeepseekV2ForCausalLM")

    def install(self, module: ModuleType, changes: Changes) -> None:
        _install_eagle3(module.DeepseekV2ForCausalLM, self.id, changes)
