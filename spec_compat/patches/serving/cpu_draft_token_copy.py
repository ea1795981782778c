"""CPU speculative decoding on vLLM 0.15/0.16 (platform ``cpu`` only), inside vLLM's workers: the
CUDA-stream copies of draft tokens (and valid sampled counts) to the host."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SERVING
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ._cpu_spec_decode import CPU_RUNNER, VLLM_CPU_SPEC


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
