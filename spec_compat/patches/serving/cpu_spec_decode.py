"""CPU speculative decoding on vLLM 0.15/0.16 (platform ``cpu`` only), inside vLLM's workers.

The CPU runner's refusal of a speculative config, its drafter loading, the CUDA-stream
copies of draft tokens, and the Triton kernels of the rejection sampler and of EAGLE's
padded batch (torch stand-ins from ``shims/spec_decode``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SERVING
from ...core.registry import Changes, NotNeeded, Patch, TargetChanged, register
from .. import _guards as guard
from .._statements import function_statements

CPU_RUNNER = "vllm.v1.worker.cpu_model_runner"
VLLM_CPU_SPEC = ">=0.15,<0.17"


def _require_cpu_platform() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise NotNeeded(f"platform is {current_platform.device_name!r}, not cpu: vLLM's own path is used")


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


@register
class CpuDraftTokenCopy(Patch):
    """Serving on CPU: vLLM 0.15/0.16 ``gpu_model_runner.py`` ~3879/3910 (``_copy_draft_token_ids_to_cpu``)
    copy draft tokens and valid-token counts to the host on a side CUDA stream; the CPU runner's stream
    placeholders have no ``wait_stream`` and there is no current stream - loud: ``RuntimeError: Found no
    NVIDIA driver on your system``."""

    id = "cpu-draft-token-copy"
    proof = Proof("fails", SERVING, r"in _copy_draft_token_ids_to_cpu\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system", using="llama")
    summary = "draft token ids and valid sampled counts are copied synchronously on the CPU runner"
    upstream = "vLLM 0.15/0.16 v1/worker/gpu_model_runner.py _copy_draft_token_ids_to_cpu / _copy_valid_sampled_token_count use torch.cuda.stream"
    target = f"{CPU_RUNNER}:CPUModelRunner"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "CPUModelRunner")
        for name, params, marker in (
            ("_copy_draft_token_ids_to_cpu", ("self", "scheduler_output", "zeros_only"), "draft_token_ids_copy_stream"),
            ("_copy_valid_sampled_token_count", ("self", "next_token_ids", "valid_sampled_tokens_count"),
             "valid_sampled_token_count_copy_stream"),
        ):
            fn = getattr(cls, name, None)
            if fn is None:
                raise TargetChanged(f"CPUModelRunner has no {name}")
            if "cpu_model_runner" in getattr(fn, "__module__", ""):
                raise TargetChanged(f"CPUModelRunner defines its own {name}")
            guard.has_params(fn, name, *params)
            if marker not in guard.source(fn, name) or "torch.cuda.stream" not in guard.source(fn, name):
                raise TargetChanged(f"{name} no longer copies on {marker}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import torch

        cls = module.CPUModelRunner

        def _copy_draft_token_ids_to_cpu(self: Any, scheduler_output: Any, zeros_only: bool = False) -> None:
            # same decisions as the GPU runner; the copy itself is synchronous
            if self.use_async_scheduling and not (
                scheduler_output.has_structured_output_requests
                or self.input_batch.sampling_metadata.output_token_ids
            ):
                return
            self._draft_token_req_ids = self.input_batch.req_ids.copy()
            ids = self._draft_token_ids
            if not torch.is_tensor(ids):
                return
            n = ids.shape[0]
            if zeros_only:
                self.draft_token_ids_cpu[:n] = 0
            else:
                self.draft_token_ids_cpu[:n].copy_(ids)

        def _copy_valid_sampled_token_count(self: Any, next_token_ids: Any, valid_sampled_tokens_count: Any) -> None:
            if self.valid_sampled_token_count_event is None:
                return
            counts = valid_sampled_tokens_count
            self.valid_sampled_token_count_cpu[: counts.shape[0]].copy_(counts)
            self.input_batch.prev_sampled_token_ids = next_token_ids.unsqueeze(1)

        # replacements, new on CPUModelRunner (the GPU runner's own stay as they are)
        changes.setattr(cls, "_copy_draft_token_ids_to_cpu", _copy_draft_token_ids_to_cpu)
        changes.setattr(cls, "_copy_valid_sampled_token_count", _copy_valid_sampled_token_count)


class _TorchKernels(Patch):
    """Shared: swap module-level Triton kernels for torch stand-ins on CPU."""

    kernels: dict[str, Any]

    def _kernels(self) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    def check(self, module: ModuleType) -> None:
        from ...shims.spec_decode import kernel_arg_names

        _require_cpu_platform()
        for name, stand_in in self._kernels().items():
            names = kernel_arg_names(guard.attr(module, name))
            if names != stand_in.arg_names:
                raise TargetChanged(f"{module.__name__}.{name} takes {names}, the stand-in {stand_in.arg_names}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.spec_decode import TritonHelpers

        for name, stand_in in self._kernels().items():
            changes.setattr(module, name, stand_in)
        triton = getattr(module, "triton", None)
        if triton is not None and not hasattr(triton, "next_power_of_2"):
            changes.setattr(module, "triton", TritonHelpers(triton))


@register
class CpuRejectionSampler(_TorchKernels):
    """Serving on CPU: vLLM 0.15/0.16 ``v1/sample/rejection_sampler.py`` launches Triton-only kernels
    (greedy/random rejection, expand, recovered tokens); on CPU Triton is disabled and the first
    verification step raises - loud: ``TypeError: 'function' object is not subscriptable``."""

    id = "cpu-rejection-sampler"
    proof = Proof("fails", SERVING, r"rejection_greedy_sample_kernel\[\(batch_size,\)\]\(.*\n(?:  .*\n)*TypeError: .function. object is not subscriptable", using="llama")
    summary = "rejection sampling kernels run as torch code on the CPU platform"
    upstream = "vLLM 0.15/0.16 v1/sample/rejection_sampler.py: rejection_*_kernel[grid] are Triton-only"
    target = "vllm.v1.sample.rejection_sampler:rejection_greedy_sample_kernel"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    def _kernels(self) -> dict[str, Any]:
        from ...shims.spec_decode import REJECTION_KERNELS

        return REJECTION_KERNELS


@register
class CpuEaglePaddedBatch(_TorchKernels):
    """Serving on CPU: vLLM 0.15/0.16 ``v1/spec_decode/eagle.py`` ~922/962 prepare the padded drafter batch
    with Triton-only kernels (next token ids, token indices to sample); on CPU they raise after the first
    verification step - loud: ``AttributeError: module 'triton' has no attribute 'next_power_of_2'``."""

    id = "cpu-eagle-padded-batch"
    proof = Proof("fails", SERVING, r"in prepare_next_token_ids_padded\n(?:  .*\n)*AttributeError: module .triton. has no attribute .next_power_of_2.", using="llama")
    summary = "EAGLE's padded-batch preparation kernels run as torch code on the CPU platform"
    upstream = "vLLM 0.15/0.16 v1/spec_decode/eagle.py:922,962 eagle_prepare_*_padded_kernel[grid] are Triton-only"
    target = "vllm.v1.spec_decode.eagle:eagle_prepare_inputs_padded_kernel"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    def _kernels(self) -> dict[str, Any]:
        from ...shims.spec_decode import EAGLE_KERNELS

        return EAGLE_KERNELS
