"""CPU speculative decoding on vLLM 0.15/0.16 (platform ``cpu`` only), inside vLLM's workers: the CPU
runner's drafter loading (and the target's EAGLE-3 aux layers)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SERVING
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ._cpu_spec_decode import CPU_RUNNER, VLLM_CPU_SPEC


@register
class CpuRunnerLoadsDrafter(Patch):
    """Serving on CPU: vLLM 0.15/0.16 ``CPUModelRunner.load_model`` loads only the target (the GPU runner's
    drafter loading and EAGLE-3 aux-layer setup, gpu_model_runner ``load_model``, never run on CPU): the
    drafter is never loaded, it has no weights - loud: ``AssertionError: All drafting layers should
    belong to the same kv cache group``."""

    id = "cpu-runner-loads-drafter"
    proof = Proof("fails", SERVING, r"AssertionError: All drafting layers should belong to the same kv cache group", using="llama")
    summary = "CPUModelRunner.load_model also loads the drafter and sets the target's EAGLE-3 aux layers"
    upstream = "vLLM 0.15/0.16 v1/worker/cpu_model_runner.py load_model: no drafter.load_model / set_aux_hidden_state_layers"
    target = f"{CPU_RUNNER}:CPUModelRunner"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "CPUModelRunner")
        src = guard.source(cls.load_model, "CPUModelRunner.load_model")
        if "drafter" in src:
            raise TargetChanged("CPUModelRunner.load_model already handles a drafter")
        guard.has_attrs(cls, "CPUModelRunner", "_get_eagle3_aux_layers_from_config", "get_model")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import logging

        from vllm.model_executor.models.interfaces import supports_eagle3

        log = logging.getLogger("spec_compat")

        def load_model(wrapped: Any, runner: Any, args: tuple, kwargs: dict) -> Any:
            out = wrapped(*args, **kwargs)
            drafter = getattr(runner, "drafter", None)
            if drafter is not None:
                drafter.load_model(runner.model)
            if getattr(runner, "use_aux_hidden_state_outputs", False):
                model = runner.get_model()
                if not supports_eagle3(model):
                    raise RuntimeError(
                        f"spec_compat[{CpuRunnerLoadsDrafter.id}]: {type(model).__name__} does not collect "
                        "EAGLE-3 aux hidden states (no SupportsEagle3)")
                layers = runner._get_eagle3_aux_layers_from_config() or model.get_eagle3_aux_hidden_state_layers()
                model.set_aux_hidden_state_layers(tuple(layers))
                log.info("spec_compat: EAGLE-3 aux hidden state layers %s on %s", list(layers), type(model).__name__)
            return out

        changes.wrap(module.CPUModelRunner, "load_model", load_model)
