"""CPU speculative decoding on vLLM 0.15/0.16 (platform ``cpu`` only), inside vLLM's workers: the CPU
runner's refusal of a speculative config."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SERVING
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from .._statements import function_statements
from ._cpu_spec_decode import CPU_RUNNER, VLLM_CPU_SPEC


@register
class CpuRunnerSpeculativeConfig(Patch):
    """Serving on CPU, vLLM 0.15/0.16 ``v1/worker/cpu_model_runner.py:25`` asserts ``speculative_config is
    None``: every speculative method fails at engine start - loud: ``AssertionError: spec decode is not
    supported.``"""

    id = "cpu-runner-speculative-config"
    proof = Proof("fails", SERVING, r"AssertionError: spec decode is not supported\.", using="llama")
    summary = "the CPU model runner is built with a speculative config (its other setup unchanged)"
    upstream = "vLLM 0.15/0.16 v1/worker/cpu_model_runner.py:25 assert self.speculative_config is None"
    target = f"{CPU_RUNNER}:CPUModelRunner"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    EXPECTED = [
        "with _torch_cuda_wrapper():\n    super().__init__(vllm_config, device)",
        "assert device == torch.device('cpu')",
        "assert self.speculative_config is None, 'spec decode is not supported.'",
        "self.use_cuda_graph = False",
        "self.cascade_attn_enabled = False",
        "self._postprocess_tensors()",
    ]

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "CPUModelRunner")
        body = function_statements(cls.__init__, "CPUModelRunner.__init__")
        if body != self.EXPECTED:
            raise TargetChanged("CPUModelRunner.__init__ is not the known 0.15/0.16 body: "
                                + " | ".join(s.replace("\n", " ") for s in body))
        guard.has_attrs(module, CPU_RUNNER, "_torch_cuda_wrapper")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import torch

        cls = module.CPUModelRunner
        base = cls.__mro__[1]

        def __init__(self: Any, vllm_config: Any, device: Any) -> None:
            with module._torch_cuda_wrapper():
                base.__init__(self, vllm_config, device)
            if device != torch.device("cpu"):
                raise ValueError(f"spec_compat[{CpuRunnerSpeculativeConfig.id}]: CPUModelRunner needs device cpu, "
                                 f"got {device}")
            self.use_cuda_graph = False
            self.cascade_attn_enabled = False
            self._postprocess_tensors()

        # a replacement, not a wrapper: the original __init__ asserts and must not run
        changes.setattr(cls, "__init__", __init__)
