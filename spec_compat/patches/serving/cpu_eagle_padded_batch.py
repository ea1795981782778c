"""CPU speculative decoding on vLLM 0.15/0.16 (platform ``cpu`` only), inside vLLM's workers: the
Triton kernels of EAGLE's padded drafter batch, as torch stand-ins (their machinery:
``_cpu_spec_decode.py``).

Semantics (written from the kernels' documented contracts): the number of valid sampled tokens
(not -1, inside the vocabulary) and the last valid one per request (or the backup token for
discarded requests / none valid); the token index to sample from and the rejected-token count per
request.
"""

from __future__ import annotations

from typing import Any

from ...core.proof import Proof, SERVING
from ...core.registry import register
from ._cpu_spec_decode import VLLM_CPU_SPEC, TorchKernel, _spans, _TorchKernels


def eagle_prepare_next_token_padded_kernel(
    sampled_token_ids_ptr: Any, discard_request_mask_ptr: Any, backup_next_token_ids_ptr: Any,
    next_token_ids_ptr: Any, valid_sampled_tokens_count_ptr: Any, vocab_size: int,
    num_sampled_tokens_per_req: int, num_reqs: int, stride_sampled_token_ids: int, BLOCK_SIZE_TOKENS: int,
) -> None:
    rows = sampled_token_ids_ptr[:num_reqs, :num_sampled_tokens_per_req]
    valid = (rows != -1) & (rows < vocab_size)
    discarded = discard_request_mask_ptr[:num_reqs].tolist()
    for req in range(num_reqs):
        idx = valid[req].nonzero().flatten()
        if discarded[req] or idx.numel() == 0:
            next_token_ids_ptr[req] = backup_next_token_ids_ptr[req]
            valid_sampled_tokens_count_ptr[req] = 0 if discarded[req] else int(idx.numel())
        else:
            next_token_ids_ptr[req] = rows[req, int(idx[-1])]
            valid_sampled_tokens_count_ptr[req] = int(idx.numel())


def eagle_prepare_inputs_padded_kernel(
    cu_num_draft_tokens_ptr: Any, valid_sampled_tokens_count_ptr: Any, query_start_loc_gpu_ptr: Any,
    token_indices_to_sample_ptr: Any, num_rejected_tokens_gpu_ptr: Any, num_reqs: int,
) -> None:
    spans = _spans(cu_num_draft_tokens_ptr[:num_reqs])
    for req, (start, end) in enumerate(spans):
        n_draft = end - start
        rejected = n_draft + 1 - int(valid_sampled_tokens_count_ptr[req]) if n_draft > 0 else 0
        last = int(query_start_loc_gpu_ptr[req + 1]) - 1
        token_indices_to_sample_ptr[req] = last - rejected
        num_rejected_tokens_gpu_ptr[req] = rejected


EAGLE_KERNELS = {
    name: TorchKernel(fn, name)
    for name, fn in (("eagle_prepare_next_token_padded_kernel", eagle_prepare_next_token_padded_kernel),
                     ("eagle_prepare_inputs_padded_kernel", eagle_prepare_inputs_padded_kernel))
}


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
        return EAGLE_KERNELS
